package wharfflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// Finished instances stay in the instance table for the retention period
// (7 days by default), with their signals and step history, so the three
// tables grow with the traffic; a call that scans one whole costs more every
// day. A start looked its new ids up through a join the planner turned into
// a hash of the whole instance table (13 ms a call at 110,000 instances),
// the claim's lease update did the same before, and the retention cleanup
// hashed all three. Here each holds 20,000 rows, never analyzed (the
// statistics a queue table mostly has): the calls a runner or a producer
// makes per step or per batch (starts, signals to running, awaiting and
// other instances, claims, a lease renewal, outcome writes that await and
// that consume signals, a wake by id, a hand-back, and the paths of a live
// runner: an await leased back by its write, a signal that leases, reading
// the leased steps, a wake that leases), an operator's cancel and
// a retention cleanup, in one transaction, must read none of them
// sequentially (pg_stat_xact_user_tables counts the scans).
func TestFlowCallsDoNotScanWholeTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("plan", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	// 100 instances due now, the rest an hour from now.
	var ids []int64
	later := time.Now().Add(time.Hour)
	for batch := range 20 {
		starts := make([]wharfflow.Start, 1000)
		for i := range starts {
			o := wharfflow.StartOptions{RunAt: later}
			if batch == 0 && i < 100 {
				o.RunAt = time.Time{}
			}
			starts[i] = f.Start(counter{}, o)
		}
		got, err := b.client.Start(ctx, starts...)
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	// As many signals (of a name nobody awaits) and history rows.
	_, err := b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_signals (instance_id, name) SELECT id, 'other' FROM "+b.schema+".flow_instances")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_steps (instance_id, step, attempt, outcome, runner, started_at, finished_at) "+
		"SELECT id, 'before', 0, 'next', 'elsewhere', now(), now() FROM "+b.schema+".flow_instances")
	require.NoError(t, err)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The view also counts the connection's earlier transactions whose
	// counts it has not reported yet; within a transaction it only grows.
	scans := map[string]int64{}
	seqScans := func(step string) {
		t.Helper()
		rows, err := tx.Query(ctx, "SELECT relname, seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname IN ('flow_instances', 'flow_signals', 'flow_steps')", b.schema)
		require.NoError(t, err)
		now := map[string]int64{}
		for rows.Next() {
			var rel string
			var n int64
			require.NoError(t, rows.Scan(&rel, &n))
			now[rel] = n
		}
		require.NoError(t, rows.Err())
		if step != "" {
			for rel, n := range now {
				require.Equal(t, scans[rel], n, "%s read the whole table %s", step, rel)
			}
		}
		scans = now
	}
	seqScans("")
	// Rows of the instance table an index scan (or a bitmap scan of one)
	// has fetched so far in this transaction.
	fetched := func() int64 {
		t.Helper()
		var n int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'flow_instances'", b.schema).Scan(&n))
		return n
	}
	// A signal looks each of its instances up by the primary key: a few
	// rows per signal, however many instances are active (a plan that read
	// the claim index whole fetched them all, 20,000 here, and looped over
	// them once per signal).
	signal := func(step string, to ...int64) {
		t.Helper()
		sigs := make([]wharfflow.Signal, len(to))
		for i, id := range to {
			sigs[i] = wharfflow.Signal{Instance: id, Name: "go", DedupKey: "go"}
		}
		before := fetched()
		_, err := b.client.SignalTx(ctx, tx, sigs...)
		require.NoError(t, err)
		require.LessOrEqual(t, fetched()-before, int64(10*len(to)+10), "%s fetched rows of flow_instances beyond its own", step)
		seqScans(step)
	}
	type lease struct {
		id, token int64
		signals   []wharfflow.ReceivedSignal
	}
	claim := func(limit int) []lease {
		t.Helper()
		rows, err := tx.Query(ctx, "SELECT id, lease_token, signals FROM "+b.schema+".claim_flow_steps('plan-test', ARRAY['plan'], $1, '30 seconds') WHERE id > 0", limit)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
			var l lease
			var sigs []byte
			if err := r.Scan(&l.id, &l.token, &sigs); err != nil || len(sigs) == 0 {
				return l, err
			}
			return l, json.Unmarshal(sigs, &l.signals)
		})
		require.NoError(t, err)
		seqScans("a claim")
		return got
	}
	write := func(step string, outcomes []map[string]any) {
		t.Helper()
		doc, err := json.Marshal(outcomes)
		require.NoError(t, err)
		var applied int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id > 0) FROM "+b.schema+".complete_flow_steps('plan-test', $1::jsonb, '30 seconds')",
			string(doc)).Scan(&applied))
		require.Equal(t, len(outcomes), applied)
		seqScans(step)
	}

	starts := make([]wharfflow.Start, 50)
	for i := range starts {
		starts[i] = f.Start(counter{}, wharfflow.StartOptions{Key: fmt.Sprint("order-", i%25)})
	}
	_, err = b.client.StartTx(ctx, tx, starts...)
	require.NoError(t, err)
	seqScans("a start")
	signal("a signal to instances that are not running", ids[100], ids[7000], ids[19999])

	claimed := claim(100)
	require.Len(t, claimed, 100)
	leased, tokens := make([]int64, len(claimed)), make([]int64, len(claimed))
	for i, l := range claimed {
		leased[i], tokens[i] = l.id, l.token
	}
	var renewed int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".renew_flow_leases('plan-test', $1, $2, '30 seconds')",
		leased, tokens).Scan(&renewed))
	require.Equal(t, len(claimed), renewed)
	seqScans("a lease renewal")
	signal("a signal to running instances", leased[:10]...)

	// Even ones await (the first five have their signal already), odd
	// ones end.
	var outcomes []map[string]any
	for i, l := range claimed {
		o := map[string]any{"id": l.id, "token": l.token, "kind": "done", "attempt": 0, "ran_step": "wait", "started_at": time.Now()}
		if i%2 == 0 {
			o["kind"], o["step"], o["await_names"] = "await", "go", []string{"go"}
		}
		outcomes = append(outcomes, o)
	}
	write("an outcome write", outcomes)
	var awaiting []int64
	for i := 10; i < 30; i += 2 {
		awaiting = append(awaiting, leased[i])
	}
	signal("a signal that wakes awaiting instances", awaiting...)
	var woken int
	before := fetched()
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".wake_flows($1)", leased).Scan(&woken))
	require.LessOrEqual(t, fetched()-before, int64(10*len(leased)+10), "a wake by id fetched rows of flow_instances beyond its own")
	seqScans("a wake by id")

	// The fifteen woken awaits are claimed with their signals, and their
	// steps consume them; the runner hands back the new starts.
	again := claim(200)
	outcomes = nil
	var back, backTokens []int64
	for _, l := range again {
		if len(l.signals) == 0 {
			back, backTokens = append(back, l.id), append(backTokens, l.token)
			continue
		}
		consumed := make([]int64, len(l.signals))
		for i, sig := range l.signals {
			consumed[i] = sig.ID
		}
		outcomes = append(outcomes, map[string]any{"id": l.id, "token": l.token, "kind": "done", "attempt": 0,
			"ran_step": "go", "started_at": time.Now(), "consumed": consumed})
	}
	require.Len(t, outcomes, 15, "the woken awaits are claimed with their signal")
	require.Len(t, back, 25, "the new starts (25 keys) are claimed")
	write("an outcome write consuming signals", outcomes)
	var pending int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals s JOIN "+b.schema+
		".flow_instances i ON i.id = s.instance_id WHERE s.instance_id = ANY ($1) AND s.name = 'go' AND s.consumed_at IS NULL AND i.status = 'done' AND i.step = 'go'",
		leased).Scan(&pending))
	require.Zero(t, pending, "the woken awaits consumed their signals")
	seqScans("") // that check's own scans

	var released int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".release_flow_leases('plan-test', $1, $2)", back, backTokens).Scan(&released))
	require.Equal(t, len(back), released)
	seqScans("a hand-back")

	// A live runner: awaits it writes are leased back to it by their
	// signal (or by the write, when the signal came first, or by a wake).
	_, err = tx.Exec(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES ('plan-test', '30 seconds', clock_timestamp() + interval '1 hour')")
	require.NoError(t, err)
	mine := claim(25)
	require.Len(t, mine, 25, "the handed-back starts")
	signal("a signal to running instances of a live runner", mine[0].id, mine[1].id)
	outcomes = nil
	for _, l := range mine {
		outcomes = append(outcomes, map[string]any{"id": l.id, "token": l.token, "kind": "await", "step": "go",
			"await_names": []string{"go"}, "attempt": 0, "ran_step": "wait", "started_at": time.Now()})
	}
	doc, err := json.Marshal(outcomes)
	require.NoError(t, err)
	var resumed int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'await') FROM "+b.schema+
		".complete_flow_steps('plan-test', $1::jsonb, '30 seconds', ARRAY['plan'], 25)", string(doc)).Scan(&resumed))
	require.Equal(t, 2, resumed, "the awaits whose signal came first are leased back by their write")
	seqScans("an await write that leases back")
	var toLease []int64
	for _, l := range mine[2:12] {
		toLease = append(toLease, l.id)
	}
	signal("a signal that leases awaiting instances to their runner", toLease...)
	var runnerKey int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT key FROM "+b.schema+".flow_runners WHERE id = 'plan-test'").Scan(&runnerKey))
	fetch := "SELECT id FROM " + b.schema + ".flow_leased_steps('plan-test', " + fmt.Sprint(runnerKey) + ", $1)"
	var plan string
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+fetch, toLease).Scan(&plan))
	require.Contains(t, plan, "flow_instances_pkey", "the leased steps are read by primary key: %s", plan)
	require.NotContains(t, plan, "flow_instances_due", "not through the claim index: %s", plan)
	rows, err := tx.Query(ctx, fetch, toLease)
	require.NoError(t, err)
	read, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.ElementsMatch(t, toLease, read)
	seqScans("reading the leased steps")
	// A signal recorded while its await was being written (the race a wake
	// closes): the wake leases the instance to its runner.
	_, err = tx.Exec(ctx, "INSERT INTO "+b.schema+".flow_signals (instance_id, name) VALUES ($1, 'go')", mine[20].id)
	require.NoError(t, err)
	var wakeIDs []int64
	for _, l := range mine {
		wakeIDs = append(wakeIDs, l.id)
	}
	before = fetched()
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".wake_flows($1, false)", wakeIDs).Scan(&woken))
	require.Equal(t, 1, woken)
	require.LessOrEqual(t, fetched()-before, int64(10*len(wakeIDs)+10), "a wake fetched rows of flow_instances beyond its own")
	seqScans("a wake that leases")
	var owner, status string
	require.NoError(t, tx.QueryRow(ctx, "SELECT lease_owner, status FROM "+b.schema+".flow_instances WHERE id = $1", mine[20].id).Scan(&owner, &status))
	require.Equal(t, []string{"plan-test", "running"}, []string{owner, status})
	// A runner that listens again finds the steps signals leased to its
	// registration while it was deaf: the signal's ten and the wake's one.
	before = fetched()
	rows, err = tx.Query(ctx, "SELECT * FROM "+b.schema+".flow_unheard_leases('plan-test', $1)", runnerKey)
	require.NoError(t, err)
	unheard, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.ElementsMatch(t, append(slices.Clone(toLease), mine[20].id), unheard)
	require.LessOrEqual(t, fetched()-before, int64(10*len(unheard)+10), "finding unheard leases fetched rows beyond its own")
	seqScans("finding the steps leased while the runner was deaf")

	var cancelled int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".cancel_flow($1)", ids[5000]).Scan(&cancelled))
	require.Equal(t, 1, cancelled)
	seqScans("a cancel")

	// Keys: 200 instances on one concurrency key of limit 1, due now. A
	// claim admits one and puts the others it took off until the slot
	// frees; the write that ends the admitted step hands the slot to the
	// next (leased to the runner, within its budget); a cancel of that one
	// while it runs keeps the slot; the repair of lost joins finds none.
	keyedStarts := make([]wharfflow.Start, 200)
	for i := range keyedStarts {
		keyedStarts[i] = f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "plan-key", ConcurrencyLimit: 1}})
	}
	keyed, err := b.client.StartTx(ctx, tx, keyedStarts...)
	require.NoError(t, err)
	var admitted []lease
	for _, l := range claim(250) {
		if slices.Contains(keyed, l.id) {
			admitted = append(admitted, l)
		}
	}
	require.Len(t, admitted, 1, "one step of a key of limit 1")
	doc, err = json.Marshal([]map[string]any{{"id": admitted[0].id, "token": admitted[0].token, "kind": "done", "attempt": 0,
		"ran_step": "wait", "started_at": time.Now()}})
	require.NoError(t, err)
	var next int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT id FROM "+b.schema+
		".complete_flow_steps('plan-test', $1::jsonb, '30 seconds', ARRAY['plan'], 1) WHERE kind = 'leased'", string(doc)).Scan(&next))
	require.Contains(t, keyed, next, "the write leased the key's next step")
	seqScans("a write that hands a key's slot on")
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".cancel_flow($1)", next).Scan(&cancelled))
	require.Equal(t, 1, cancelled)
	seqScans("a cancel of a step holding a key's slot")
	var repaired int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".repair_flow_joins(100)").Scan(&repaired))
	require.Zero(t, repaired)
	seqScans("the repair of lost joins")

	// Retention: the ended instances go with their signals and history.
	var removed int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".cleanup_flows(clock_timestamp() + interval '1 hour', 1000)").Scan(&removed))
	require.Equal(t, 68, removed, "the 50 ended at once, the 15 signalled, the cancelled one, the keyed one done and the keyed one cancelled")
	seqScans("a cleanup")
}

// Every scrape of the flow gauges counts the active and failed instances.
// With 20,000 ended instances kept (never analyzed) beside a few active
// ones, the collector's query, as it runs it (sequential scans off), reads
// the instances through the partial indexes of the active and the failed
// ones, not the table: EXPLAIN shows no sequential scan. The query it
// replaced ("status NOT IN ('done', 'cancelled')") had no index to use.
func TestFlowGaugesReadOnlyTheActiveAndFailedInstances(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("gauged", nil).Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Done(nil)
	})
	for range 20 {
		starts := make([]wharfflow.Start, 1000)
		for i := range starts {
			starts[i] = f.Start(counter{}, wharfflow.StartOptions{})
		}
		_, err := b.client.Start(ctx, starts...)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = CASE WHEN id % 1000 = 1 THEN 'failed' ELSE 'done' END, run_at = 'infinity', finished_at = now() WHERE id % 100 <> 0")
	require.NoError(t, err)

	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
	require.NoError(t, err)
	var plan string
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+wharfflow.GaugeQuery(b.schema)).Scan(&plan))
	require.NotContains(t, plan, `"Seq Scan"`, plan)
	require.Contains(t, plan, "flow_instances_due")
	require.Contains(t, plan, "flow_instances_failed")

	// And the counts are right: 200 due (the ids divisible by 100 stayed
	// ready), 20 failed.
	var runnable, failed int64
	var flow string
	var oldest float64
	var running, awaiting int64
	require.NoError(t, tx.QueryRow(ctx, wharfflow.GaugeQuery(b.schema)).Scan(&flow, &runnable, &oldest, &running, &awaiting, &failed))
	require.Equal(t, "gauged", flow)
	require.Equal(t, int64(200), runnable)
	require.Equal(t, int64(20), failed)
}

// An outcome write joins its outcomes to their instances by primary key,
// one probe each, whatever plan the session has cached. complete_flow_steps
// plans once per session (a generic plan), and on a table never analyzed
// the planner took the claim index's range of unexpired rows for a few
// rows, read it and compared every row with every outcome: a batch of 500
// removed 260,000 rows by join filter and took 80 ms, and the children
// workload ran at half its rate. Here a session's first write is of 300
// outcomes among 10,000 instances never analyzed; auto_explain reports its
// nested plans to the session, and the rows its joins removed must stay a
// few per outcome.
func TestOutcomeWriteJoinsItsInstancesByPrimaryKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("probe", nil).
		Step("one", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	later := time.Now().Add(time.Hour)
	for batch := range 10 {
		starts := make([]wharfflow.Start, 1000)
		for i := range starts {
			o := wharfflow.StartOptions{RunAt: later}
			if batch == 0 && i < 300 {
				o.RunAt = time.Time{}
			}
			starts[i] = f.Start(counter{}, o)
		}
		_, err := b.client.Start(ctx, starts...)
		require.NoError(t, err)
	}

	conn, plans := explainingConn(t)
	rows, err := conn.Query(ctx, "SELECT id, lease_token FROM "+b.schema+".claim_flow_steps('plan-test', ARRAY['probe'], 300, '1 hour') WHERE id > 0")
	require.NoError(t, err)
	var outcomes []map[string]any
	for rows.Next() {
		var id, token int64
		require.NoError(t, rows.Scan(&id, &token))
		outcomes = append(outcomes, map[string]any{"id": id, "token": token, "kind": "done", "attempt": 0,
			"ran_step": "one", "started_at": time.Now()})
	}
	require.NoError(t, rows.Err())
	require.Len(t, outcomes, 300)
	doc, err := json.Marshal(outcomes)
	require.NoError(t, err)
	plans.reset()
	var applied int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id > 0) FROM "+b.schema+".complete_flow_steps('plan-test', $1::jsonb, '1 hour')",
		string(doc)).Scan(&applied))
	require.Equal(t, 300, applied)

	got := plans.all()
	require.NotEmpty(t, got, "auto_explain reported no plan")
	removed := regexp.MustCompile(`Rows Removed by Join Filter: (\d+)`)
	var total int
	for _, p := range got {
		for _, m := range removed.FindAllStringSubmatch(p, -1) {
			n, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			total += n
		}
	}
	require.LessOrEqual(t, total, 3*len(outcomes), "the write's joins removed %d rows for %d outcomes: a join that is not by primary key:\n%s",
		total, len(outcomes), strings.Join(got, "\n"))
}

// The write that frees a concurrency key's slot reserves the key's next
// waiting steps (batons) through the key's waiting index, in its order,
// reading a few rows: flow_key_free plans once per session (a generic
// plan), and on a table never analyzed the planner intersected that index
// with the claim index's and sorted the key's every waiting row, at every
// write (188 rows a key, 0.7 ms a write in the keyed workload). Here 500
// steps wait on one key of limit 1; the write that ends the admitted one
// hands the slot on and reserves batons; auto_explain reports its nested
// plans to the session.
func TestKeyFreeReadsTheWaitingStepsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("probe", nil).
		Step("one", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	// Unkeyed instances beside them, scheduled later, as a claim index
	// holds in practice.
	later := make([]wharfflow.Start, 5000)
	for i := range later {
		later[i] = f.Start(counter{}, wharfflow.StartOptions{RunAt: time.Now().Add(time.Hour)})
	}
	_, err := b.client.Start(ctx, later...)
	require.NoError(t, err)
	keyed := make([]wharfflow.Start, 500)
	for i := range keyed {
		keyed[i] = f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "probe-key", ConcurrencyLimit: 1}})
	}
	_, err = b.client.Start(ctx, keyed...)
	require.NoError(t, err)

	conn, plans := explainingConn(t)
	rows, err := conn.Query(ctx, "SELECT id, lease_token FROM "+b.schema+".claim_flow_steps('plan-test', ARRAY['probe'], 1000, '1 hour') WHERE id > 0")
	require.NoError(t, err)
	type lease struct{ ID, Token int64 }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lease])
	require.NoError(t, err)
	require.Len(t, got, 1, "one step of a key of limit 1 is admitted; the others wait")
	doc, err := json.Marshal([]map[string]any{{"id": got[0].ID, "token": got[0].Token, "kind": "done", "attempt": 0,
		"ran_step": "one", "started_at": time.Now()}})
	require.NoError(t, err)
	plans.reset()
	var kinds []string
	rows, err = conn.Query(ctx, "SELECT kind FROM "+b.schema+".complete_flow_steps('plan-test', $1::jsonb, '1 hour', ARRAY['probe'], 10) WHERE kind <> 'applied'", string(doc))
	require.NoError(t, err)
	kinds, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, kinds, "leased", "the write hands the slot to the next waiting step")
	require.Contains(t, kinds, "baton", "and reserves the key's next ones")

	var baton string
	for _, p := range plans.all() {
		if strings.Contains(p, "LIMIT n.n") {
			baton = p
		}
	}
	require.NotEmpty(t, baton, "auto_explain reported no plan of the baton reservation")
	require.Contains(t, baton, "Index Scan using flow_instances_key_waiting", "the batons are read through the key's waiting index:\n%s", baton)
	require.NotContains(t, baton, "Sort Key", "in the index's order, not sorted:\n%s", baton)
}

// noticePlans collects the plans auto_explain sends a session as notices.
type noticePlans struct {
	mu    sync.Mutex
	plans []string
}

func (n *noticePlans) add(p string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.plans = append(n.plans, p)
}

func (n *noticePlans) reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.plans = nil
}

func (n *noticePlans) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.plans)
}

// explainingConn opens a connection whose every statement, nested ones
// too, auto_explain reports (EXPLAIN ANALYZE) to it as a notice.
func explainingConn(t *testing.T) (*pgx.Conn, *noticePlans) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	plans := &noticePlans{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { plans.add(n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LOAD 'auto_explain'"); err != nil {
		// auto_explain ships with the PostgreSQL server; loading it takes
		// a superuser, as the tests' databases have.
		if os.Getenv("CI") == "true" {
			t.Fatalf("loading auto_explain (a superuser and the server's contrib modules are needed): %v", err)
		}
		t.Skipf("auto_explain cannot be loaded here: %v", err)
	}
	for _, set := range []string{"auto_explain.log_min_duration = 0", "auto_explain.log_analyze = on",
		"auto_explain.log_nested_statements = on", "auto_explain.log_level = notice"} {
		_, err := conn.Exec(ctx, "SET "+set)
		require.NoError(t, err)
	}
	return conn, plans
}
