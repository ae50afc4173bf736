package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/walmsg"
)

// BenchmarkEnqueueParts measures where the enqueue path's cost goes: Wharf's
// EnqueueTx against copies of the outbox with one part taken away each, and
// against a bare table, with the producers of `wharf bench` (4 connections,
// 100-message transactions, 200-byte payloads, 10 messages per key), each
// variant flat out for WHARF_PARTS_DURATION (default 8s), in
// WHARF_PARTS_ROUNDS rounds (default 3) whose order rotates, so that every
// variant sees the machine's drift alike; WHARF_PARTS_ONLY (variant names,
// comma-separated) runs some of them. Run it alone:
//
//	go test -run '^$' -bench EnqueueParts -benchtime 1x -timeout 30m ./internal/bench
//
// The copies are made with CREATE TABLE ... (LIKE outbox INCLUDING ALL) from
// a freshly migrated outbox, so they follow the schema as it changes.
func BenchmarkEnqueueParts(b *testing.B) {
	duration := 8 * time.Second
	if v := os.Getenv("WHARF_PARTS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("WHARF_PARTS_DURATION: %v", err)
		}
		duration = d
	}
	rounds := 3
	if v := os.Getenv("WHARF_PARTS_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("WHARF_PARTS_ROUNDS: want a positive integer, got %q", v)
		}
		rounds = n
	}
	ctx := context.Background()
	o, err := Options{Mode: ModeBaseline, DatabaseURL: databaseURL, Duration: duration}.withDefaults()
	if err != nil {
		b.Fatal(err)
	}
	o.Schema = fmt.Sprintf("wharf_parts_%d", time.Now().UnixNano()%1e6)
	ctl, err := connect(ctx, databaseURL, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer ctl.Close()
	e := &env{o: o, ctl: ctl}
	drop, err := e.createSchema(ctx, o.Schema)
	if err != nil {
		b.Fatal(err)
	}
	defer drop()
	pool, err := connect(ctx, databaseURL, int32(o.Producers))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()

	variants := enqueueVariants()
	if only := os.Getenv("WHARF_PARTS_ONLY"); only != "" {
		// A comma-separated list of variant names to run, e.g. to set a
		// new variant beside the reference ones in one sitting.
		keep := strings.Split(only, ",")
		variants = slices.DeleteFunc(variants, func(v enqueueVariant) bool { return !slices.Contains(keep, v.name) })
		if len(variants) == 0 {
			b.Fatalf("WHARF_PARTS_ONLY=%q names no variant", only)
		}
	}
	rates := map[string][]float64{}
	for round := range rounds {
		order := slices.Clone(variants)
		k := round * len(order) / rounds
		order = append(order[k:], order[:k]...)
		for _, v := range order {
			rate, err := e.measureVariant(ctx, pool, v)
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			rates[v.name] = append(rates[v.name], rate)
			fmt.Fprintf(os.Stderr, "round %d  %-22s %8.0f msg/s\n", round+1, v.name, rate)
		}
	}
	med := func(name string) float64 {
		r := slices.Clone(rates[name])
		if len(r) == 0 {
			return math.NaN() // not run (WHARF_PARTS_ONLY)
		}
		slices.Sort(r)
		return r[len(r)/2]
	}
	ref := med("outbox copy")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "variant\tmsg/s (median)\trounds\tµs/msg\tvs outbox copy\n")
	for _, v := range variants {
		m := med(v.name)
		var rs []string
		for _, r := range rates[v.name] {
			rs = append(rs, strconv.FormatFloat(r, 'f', 0, 64))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.2f\t%+.1f %% time\n", v.name, m, strings.Join(rs, " / "), 1e6/m, 100*(ref/m-1))
	}
	_ = tw.Flush()
	b.ReportMetric(med("wharf EnqueueTx"), "wharf-msg/s")
	b.ReportMetric(med("bare VALUES"), "bare-msg/s")
	b.ReportMetric(0, "ns/op")
}

// enqueueVariant is one way of writing the bench's messages.
type enqueueVariant struct {
	name string
	// setup creates the variant's table from the migrated outbox in schema
	// (nothing for the library itself) and returns its name.
	setup func(ctx context.Context, e *env, schema string) (string, error)
	// writer writes ProducerBatch messages per transaction into table.
	writer func(o Options, pool *pgxpool.Pool, schema, table string) func() batchWriter
}

// outboxColumns are the columns the library's enqueue statement writes.
const outboxColumns = `topic, key, payload, headers, deliver_at, dedup_key`

// outboxInsert is the library's enqueue statement into table, with an
// optional seventh array for the lane.
func outboxInsert(table string, lane, returning bool) string {
	q := `INSERT INTO ` + table + ` (` + outboxColumns + `) SELECT t, k, p, h::jsonb, d, u FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[]) AS m(t, k, p, h, d, u)`
	if lane {
		q = `INSERT INTO ` + table + ` (` + outboxColumns + `, lane) SELECT t, k, p, h::jsonb, d, u, l FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[], $7::smallint[]) AS m(t, k, p, h, d, u, l)`
	}
	if returning {
		q += ` RETURNING id, nonce`
	}
	return q
}

// copyOf returns a setup making a LIKE copy of the outbox and applying alter
// statements to it (%s is the table).
func copyOf(name string, alter ...string) func(context.Context, *env, string) (string, error) {
	return func(ctx context.Context, e *env, schema string) (string, error) {
		table := schema + "." + name
		if _, err := e.ctl.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE %s.outbox INCLUDING ALL)`, table, schema)); err != nil {
			return "", err
		}
		for _, a := range alter {
			if strings.Contains(a, "%[2]s") {
				idx, err := e.xidIndex(ctx, schema, name)
				if err != nil {
					return "", err
				}
				a = fmt.Sprintf(a, table, idx)
			} else {
				a = fmt.Sprintf(a, table)
			}
			if _, err := e.ctl.Exec(ctx, a); err != nil {
				return "", fmt.Errorf("%s: %w", a, err)
			}
		}
		return table, nil
	}
}

// xidIndex names the copy's (lane, xid, id) index.
func (e *env) xidIndex(ctx context.Context, schema, table string) (string, error) {
	var name string
	err := e.ctl.QueryRow(ctx, `SELECT schemaname || '.' || indexname FROM pg_indexes
		WHERE schemaname = $1 AND tablename = $2 AND indexdef LIKE '%(lane, xid, id)%'`, schema, table).Scan(&name)
	return name, err
}

const (
	dropLaneExpression = `ALTER TABLE %s ALTER COLUMN lane DROP EXPRESSION`
	dropXidDefault     = `ALTER TABLE %s ALTER COLUMN xid DROP DEFAULT, ALTER COLUMN xid DROP NOT NULL`
	dropNonceDefault   = `ALTER TABLE %s ALTER COLUMN nonce DROP DEFAULT, ALTER COLUMN nonce DROP NOT NULL`
	dropXidIndex       = `DROP INDEX %[2]s`
)

func enqueueVariants() []enqueueVariant {
	unnest := func(returning bool) func(Options, *pgxpool.Pool, string, string) func() batchWriter {
		return func(o Options, pool *pgxpool.Pool, _, table string) func() batchWriter {
			return unnestWriter(o, pool, outboxInsert(table, false, returning), false, returning)
		}
	}
	withLane := func(o Options, pool *pgxpool.Pool, _, table string) func() batchWriter {
		return unnestWriter(o, pool, outboxInsert(table, true, true), true, true)
	}
	return []enqueueVariant{
		{name: "wharf EnqueueTx",
			setup: func(_ context.Context, _ *env, schema string) (string, error) { return schema + ".outbox", nil },
			writer: func(o Options, pool *pgxpool.Pool, schema, _ string) func() batchWriter {
				client, err := wharf.NewClient(nil, &wharf.Config{Schema: schema})
				if err != nil {
					panic(err)
				}
				return wharfWriter(o, pool, client, nil)
			}},
		{name: "outbox copy", setup: copyOf("v_copy"), writer: unnest(true)},
		{name: "no RETURNING", setup: copyOf("v_noret"), writer: unnest(false)},
		{name: "lane not generated", setup: copyOf("v_nolane", dropLaneExpression), writer: withLane},
		{name: "no xid default", setup: copyOf("v_noxid", dropXidDefault), writer: unnest(true)},
		{name: "no (lane,xid,id) index", setup: copyOf("v_noxidx", dropXidIndex), writer: unnest(true)},
		{name: "no nonce default", setup: copyOf("v_nononce", dropNonceDefault), writer: unnest(true)},
		// One random nonce per call, sent as a parameter, instead of one
		// drawn per row by the column default: only the seqs come back.
		{name: "nonce per call", setup: copyOf("v_callnonce"),
			writer: func(o Options, pool *pgxpool.Pool, _, table string) func() batchWriter {
				q := `INSERT INTO ` + table + ` (` + outboxColumns + `, nonce) SELECT t, k, p, h::jsonb, d, u, $7 FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[]) AS m(t, k, p, h, d, u) RETURNING id`
				return unnestWriter(o, pool, q, false, true)
			}},
		{name: "all four removed", setup: copyOf("v_none", dropLaneExpression, dropXidDefault, dropXidIndex, dropNonceDefault), writer: withLane},
		{name: "COPY (no ids back)", setup: copyOf("v_copyin"),
			writer: func(o Options, pool *pgxpool.Pool, schema, table string) func() batchWriter {
				return copyWriter(o, pool, pgx.Identifier{schema, strings.TrimPrefix(table, schema+".")})
			}},
		// WAL mode's producer side: the call's messages as one transactional
		// logical decoding message (internal/walmsg), seqs from the outbox's
		// id sequence or none at all (the id from the LSN the emit returns).
		{name: "WAL nextval + emit", setup: noTable, writer: walWriter(true)},
		{name: "WAL emit (id from LSN)", setup: noTable, writer: walWriter(false)},
		{name: "bare unnest",
			setup: bareSetup("v_bare_unnest"),
			writer: func(o Options, pool *pgxpool.Pool, _, table string) func() batchWriter {
				return unnestWriter(o, pool, `INSERT INTO `+table+` (topic, key, payload) SELECT t, k, p FROM unnest($1::text[], $2::text[], $3::bytea[]) AS m(t, k, p)`, false, false)
			}},
		{name: "bare VALUES", setup: bareSetup("v_bare_values"),
			writer: func(o Options, pool *pgxpool.Pool, _, table string) func() batchWriter {
				return bareInsertWriter(o, pool, table)
			}},
	}
}

func bareSetup(name string) func(context.Context, *env, string) (string, error) {
	return func(ctx context.Context, e *env, schema string) (string, error) {
		table := schema + "." + name
		_, err := e.ctl.Exec(ctx, fmt.Sprintf(bareTableDDL, table))
		return table, err
	}
}

// unnestWriter sends the batch as arrays, as EnqueueTx does: six arrays for
// the outbox (three for the bare table), plus the lane when lane is set.
func unnestWriter(o Options, pool *pgxpool.Pool, sql string, lane, returning bool) func() batchWriter {
	payload := makePayload(o.PayloadBytes)
	outbox := strings.Contains(sql, "dedup_key")
	return func() batchWriter {
		n := o.ProducerBatch
		kr := &keyer{o: o}
		topics, keys, payloads := make([]string, n), make([]*string, n), make([][]byte, n)
		headers, deliverAt, dedup, lanes := make([]*string, n), make([]*time.Time, n), make([]*string, n), make([]int16, n)
		return func(ctx context.Context, first int64) (int, error) {
			for i := range n {
				topics[i], payloads[i] = topic, payload
				keys[i] = nil
				if k := kr.key(first + int64(i)); k != "" {
					keys[i] = &k
					h := fnv.New32a()
					_, _ = h.Write([]byte(k))
					lanes[i] = int16(h.Sum32() & 63)
				} else {
					lanes[i] = int16((first + int64(i)) & 63)
				}
			}
			args := []any{topics, keys, payloads}
			if outbox {
				args = append(args, headers, deliverAt, dedup)
			}
			if lane {
				args = append(args, lanes)
			}
			if strings.Contains(sql, "$7 FROM") {
				args = append(args, rand.Int64()&(1<<62-1))
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			if returning {
				rows, err := tx.Query(ctx, sql, args...)
				if err != nil {
					_ = tx.Rollback(ctx)
					return 0, err
				}
				var id int64
				var nonce *int64 // NULL without the nonce default
				dest := []any{&id, &nonce}
				if !strings.HasSuffix(sql, "nonce") {
					dest = dest[:1]
				}
				for rows.Next() {
					if err := rows.Scan(dest...); err != nil {
						rows.Close()
						_ = tx.Rollback(ctx)
						return 0, err
					}
				}
				if err := rows.Err(); err != nil {
					_ = tx.Rollback(ctx)
					return 0, err
				}
			} else if _, err := tx.Exec(ctx, sql, args...); err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
			return n, tx.Commit(ctx)
		}
	}
}

func noTable(context.Context, *env, string) (string, error) { return "", nil }

// walWriter writes each batch as one pg_logical_emit_message in its
// transaction, with the seqs drawn from the outbox's id sequence first when
// sequence is set.
func walWriter(sequence bool) func(Options, *pgxpool.Pool, string, string) func() batchWriter {
	return func(o Options, pool *pgxpool.Pool, schema, _ string) func() batchWriter {
		payload := makePayload(o.PayloadBytes)
		return func() batchWriter {
			kr := &keyer{o: o}
			records := make([]walmsg.Record, o.ProducerBatch)
			var content []byte
			seqs := make([]int64, o.ProducerBatch)
			return func(ctx context.Context, first int64) (int, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return 0, err
				}
				fail := func(err error) (int, error) {
					_ = tx.Rollback(ctx)
					return 0, err
				}
				if sequence {
					rows, err := tx.Query(ctx, "SELECT nextval(pg_get_serial_sequence($1, 'id')) FROM generate_series(1, $2)", schema+".outbox", len(seqs))
					if err != nil {
						return fail(err)
					}
					i := 0
					for rows.Next() {
						if err := rows.Scan(&seqs[i]); err != nil {
							rows.Close()
							return fail(err)
						}
						i++
					}
					if err := rows.Err(); err != nil {
						return fail(err)
					}
				}
				for i := range records {
					records[i] = walmsg.Record{Seq: seqs[i], Nonce: rand.Int64(), Topic: topic, Key: kr.key(first + int64(i)), Payload: payload}
				}
				if content, err = walmsg.Append(content[:0], records); err != nil {
					return fail(err)
				}
				var lsn string
				if err := tx.QueryRow(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)::text", schema, content).Scan(&lsn); err != nil {
					return fail(err)
				}
				return len(records), tx.Commit(ctx)
			}
		}
	}
}

// copyWriter writes each batch with COPY inside its transaction.
func copyWriter(o Options, pool *pgxpool.Pool, table pgx.Identifier) func() batchWriter {
	payload := makePayload(o.PayloadBytes)
	return func() batchWriter {
		kr := &keyer{o: o}
		rows := make([][]any, o.ProducerBatch)
		return func(ctx context.Context, first int64) (int, error) {
			for i := range rows {
				var key any
				if k := kr.key(first + int64(i)); k != "" {
					key = k
				}
				rows[i] = []any{topic, key, payload}
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			n, err := tx.CopyFrom(ctx, table, []string{"topic", "key", "payload"}, pgx.CopyFromRows(rows))
			if err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
			return int(n), tx.Commit(ctx)
		}
	}
}

// measureVariant creates v's table, runs the producers flat out into it
// for Duration after a CHECKPOINT, drops it (the library's outbox is
// emptied instead) and returns the rate.
func (e *env) measureVariant(ctx context.Context, pool *pgxpool.Pool, v enqueueVariant) (float64, error) {
	schema := e.o.Schema
	table, err := v.setup(ctx, e, schema)
	if err != nil {
		return 0, err
	}
	switch table {
	case "":
	case schema + ".outbox":
		defer func() { _, _ = e.ctl.Exec(context.Background(), "TRUNCATE "+table) }()
	default:
		defer e.dropTable(table)
	}
	if _, err := e.quiesce(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	p := &producers{o: e.o, newWriter: v.writer(e.o, pool, schema, table), measureFrom: start}
	if err := p.run(ctx, start, 0, start.Add(e.o.Duration)); err != nil {
		return 0, err
	}
	return float64(p.inWindow.Load()) / e.o.Duration.Seconds(), nil
}
