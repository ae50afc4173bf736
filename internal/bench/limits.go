package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// Limits are the server's physical limits for the bench's messages,
// measured in the same run as Wharf's figures, and those figures as
// fractions of them: how much of what PostgreSQL can do at all Wharf gets.
type Limits struct {
	// InsertRate is the insert limit, msgs/s: the same producers writing the
	// same messages (keys, payloads, ProducerBatch rows per transaction) with
	// one multi-row INSERT into a table with only a primary key. 0 when not
	// measured.
	InsertRate float64 `json:"insert_rate"`
	// RemovalRate is the removal limit, msgs/s: RemovalWorkers connections
	// claiming and deleting RemovalBatch rows per statement
	// (DELETE ... WHERE id IN (SELECT id ... FOR UPDATE SKIP LOCKED LIMIT n)
	// RETURNING *) from a table pre-filled with RemovalRows rows by COPY,
	// until it is empty. The claim has no ORDER BY: a limit owes no order
	// (ordering by id costs it about 15 %). 0 when not measured.
	RemovalRate    float64 `json:"removal_rate"`
	RemovalRows    int64   `json:"removal_rows,omitempty"`
	RemovalWorkers int     `json:"removal_workers,omitempty"`
	RemovalBatch   int     `json:"removal_batch,omitempty"`
	// EmitRate is the emit limit, msgs/s (outbox in WAL mode only): the same
	// producers writing the same payloads, ProducerBatch messages per
	// transaction, each message one bare transactional
	// pg_logical_emit_message(true, EmitPrefix, payload) (no topic, key or
	// nonce), flat out for Duration. 0 when not measured.
	EmitRate float64 `json:"emit_rate,omitempty"`
	// EmitWALBytesPerMsg is the WAL the emit limit wrote per message (the
	// WAL insert position's advance over the messages emitted).
	EmitWALBytesPerMsg float64 `json:"emit_wal_bytes_per_msg,omitempty"`
	// EmitPrefix is the emit limit's logical message prefix, distinct from
	// the outbox's (its schema), so the relay's stream drops them.
	EmitPrefix string `json:"emit_prefix,omitempty"`
	// ProducerFraction is Wharf's producer rate over InsertRate (a sweep:
	// the confirmed sustainable rate over InsertRate).
	ProducerFraction float64 `json:"producer_fraction,omitempty"`
	// EmitFraction is the same rate over EmitRate.
	EmitFraction float64 `json:"emit_fraction,omitempty"`
	// WALBytesFraction is Wharf's WAL bytes per message over
	// EmitWALBytesPerMsg (baseline in WAL mode: Wharf's enqueue alone).
	WALBytesFraction float64 `json:"wal_bytes_fraction,omitempty"`
	// DrainFraction is Wharf's drain rate over RemovalRate.
	DrainFraction float64 `json:"drain_fraction,omitempty"`
}

// fractions fills in Wharf's figures as fractions of the limits.
func (l *Limits) fractions(producerRate, drainRate float64) {
	if l.InsertRate > 0 && producerRate > 0 {
		l.ProducerFraction = producerRate / l.InsertRate
	}
	if l.EmitRate > 0 && producerRate > 0 {
		l.EmitFraction = producerRate / l.EmitRate
	}
	if l.RemovalRate > 0 && drainRate > 0 {
		l.DrainFraction = drainRate / l.RemovalRate
	}
}

const (
	bareInsertTable = "bare_insert"
	bareQueueTable  = "bare_queue"
	// removalBatch is the bare loop's claim size, the fastest of 500, 1000
	// and 4000 with 1 to 8 workers on the project machine. From about 4000
	// rows the planner turns the IN (subquery) into a hash semi-join over a
	// sequential scan of the whole table, which makes the loop 40 % slower.
	removalBatch = 1000
)

// insertLimit measures the insert limit in schema for Duration.
func (e *env) insertLimit(ctx context.Context, schema string) (float64, error) {
	o := e.o
	table := schema + "." + bareInsertTable
	if _, err := e.ctl.Exec(ctx, fmt.Sprintf(bareTableDDL, table)); err != nil {
		return 0, fmt.Errorf("creating the insert-limit table: %w", err)
	}
	defer e.dropTable(table)
	if _, err := e.quiesce(ctx); err != nil {
		return 0, err
	}
	pool, err := e.producerPool(ctx)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	start := time.Now()
	p := &producers{o: o, newWriter: bareInsertWriter(o, pool, table), measureFrom: start}
	sm := newSampler(e, schema, start, nil, false, "insert limit")
	sm.produced, sm.noRelay = &p.produced, true
	defer sm.stop()
	if err := e.runFlatOut(ctx, p, sm, start); err != nil {
		return 0, fmt.Errorf("insert limit: %w", err)
	}
	return float64(p.inWindow.Load()) / o.Duration.Seconds(), nil
}

// runFlatOut runs p flat out for Duration from start, sampling for the
// progress line.
func (e *env) runFlatOut(ctx context.Context, p *producers, sm *sampler, start time.Time) error {
	done := make(chan error, 1)
	prodCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- p.run(prodCtx, start, 0, start.Add(e.o.Duration)) }()
	if err := sm.sample(ctx, "measure"); err != nil {
		cancel()
		<-done
		return err
	}
	for {
		select {
		case <-sm.C():
			if err := sm.sample(ctx, "measure"); err != nil {
				cancel()
				<-done
				return err
			}
		case err := <-done:
			if err != nil {
				return err
			}
			err = sm.sample(ctx, "measure")
			sm.progressDone()
			return err
		}
	}
}

// removalLimit measures the removal limit over rows rows in schema.
func (e *env) removalLimit(ctx context.Context, schema string, rows int64) (*Limits, error) {
	o := e.o
	l := &Limits{RemovalRows: rows, RemovalWorkers: o.Producers, RemovalBatch: removalBatch}
	table := schema + "." + bareQueueTable
	if _, err := e.ctl.Exec(ctx, fmt.Sprintf(bareTableDDL, table)); err != nil {
		return nil, fmt.Errorf("creating the removal-limit table: %w", err)
	}
	defer e.dropTable(table)
	if _, err := e.copyFill(ctx, pgx.Identifier{schema, bareQueueTable}, rows); err != nil {
		return nil, fmt.Errorf("pre-filling the removal-limit table: %w", err)
	}
	if _, err := e.ctl.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		return nil, err
	}
	if _, err := e.quiesce(ctx); err != nil {
		return nil, err
	}
	pool, err := connect(ctx, o.DatabaseURL, int32(l.RemovalWorkers))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	claim := fmt.Sprintf(`DELETE FROM %[1]s WHERE id IN (SELECT id FROM %[1]s FOR UPDATE SKIP LOCKED LIMIT $1) RETURNING id, topic, key, payload`, table)
	var removed atomic.Int64
	runCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	start := time.Now()
	g, gctx := errgroup.WithContext(runCtx)
	for range l.RemovalWorkers {
		g.Go(func() error {
			var (
				id      int64
				t       string
				key     *string
				payload []byte
			)
			for {
				n := int64(0)
				rs, err := pool.Query(gctx, claim, removalBatch)
				if err != nil {
					return err
				}
				for rs.Next() {
					if err := rs.Scan(&id, &t, &key, &payload); err != nil {
						rs.Close()
						return err
					}
					n++
				}
				if err := rs.Err(); err != nil {
					return err
				}
				removed.Add(n)
				// Nothing left that another worker has not claimed.
				if n == 0 {
					return nil
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("removal limit: not done after %s (raise --timeout)", o.Timeout)
		}
		return nil, fmt.Errorf("removal limit: %w", err)
	}
	elapsed := time.Since(start)
	if got := removed.Load(); got != rows {
		return nil, fmt.Errorf("removal limit: removed %d of %d rows", got, rows)
	}
	l.RemovalRate = float64(rows) / elapsed.Seconds()
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "[removal limit] %d rows in %.2fs: %.0f msg/s\n", rows, elapsed.Seconds(), l.RemovalRate)
	}
	return l, nil
}

// copyFill writes n messages into table (topic, key, payload) with one COPY
// and returns its rate.
func (e *env) copyFill(ctx context.Context, table pgx.Identifier, n int64) (float64, error) {
	start := time.Now()
	kr := &keyer{o: e.o}
	payload := makePayload(e.o.PayloadBytes)
	var i int64
	copied, err := e.ctl.CopyFrom(ctx, table, []string{"topic", "key", "payload"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= n {
				return nil, nil
			}
			var key any
			if k := kr.key(i); k != "" {
				key = k
			}
			i++
			return []any{topic, key, payload}, nil
		}))
	if err != nil {
		return 0, err
	}
	return float64(copied) / time.Since(start).Seconds(), nil
}

func (e *env) dropTable(table string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.ctl.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		e.o.Logger.Warn("wharf bench: dropping a scratch table failed", "table", table, "err", err)
	}
}

// limitNotes say how the limits were measured.
func limitNotes(res *Result, o Options) {
	l := res.Limits
	if l == nil {
		return
	}
	if l.InsertRate > 0 {
		res.note("insert limit: %d connections, each committing one %d-row INSERT ... VALUES per transaction (BEGIN, INSERT, COMMIT: the enqueue's round trips) of the same keys and %d-byte payloads into a table with a primary key and no other index, flat out for %s after a CHECKPOINT",
			o.Producers, o.ProducerBatch, o.PayloadBytes, o.Duration)
	}
	if l.EmitRate > 0 {
		res.note("emit limit: %d connections, each committing one SELECT count(pg_logical_emit_message(true, '%s', p)) FROM unnest($payloads) p of %d %d-byte payloads per transaction (BEGIN, SELECT, COMMIT: the enqueue's round trips), one transactional logical message per message with no topic, key or nonce, flat out for %s after a CHECKPOINT; its WAL per message is the WAL insert position's advance over the messages emitted. The prefix is not the outbox's, so the relay's stream drops these messages",
			o.Producers, l.EmitPrefix, o.ProducerBatch, o.PayloadBytes, o.Duration)
	}
	if l.RemovalRate > 0 {
		res.note("removal limit: %d connections each looping DELETE ... WHERE id IN (SELECT id ... FOR UPDATE SKIP LOCKED LIMIT %d) RETURNING id, topic, key, payload, reading every row, over %d rows pre-filled by COPY, VACUUM (ANALYZE)d and CHECKPOINTed first, until the table is empty: no order at all, no leases, no late-commit detection",
			l.RemovalWorkers, l.RemovalBatch, l.RemovalRows)
	}
}
