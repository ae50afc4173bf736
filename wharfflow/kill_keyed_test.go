package wharfflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

const killKeyedEnv = "WHARFFLOW_KILL_KEYED_HELPER"

// keyedOrder is the kill -9 test's flow state: a parent's index, or a
// child's concurrency key.
type keyedOrder struct {
	N   int    `json:"n"`
	Key string `json:"key"`
}

const keyedLimit = 2

// killKeyedFlows are the flows of the kill -9 test with keys: an order
// awaits "go", spawns three children on four concurrency keys of limit 2,
// and emits a message when they have all ended; each child emits one. A
// child's step records itself in key_audit while it runs (in whichever
// process runs it), and records in key_violations any moment at which more
// than the limit of its key run (those of a killed process, dead_pids, run
// no more).
func killKeyedFlows(pool *pgxpool.Pool, schema string) (*wharfflow.Flow[keyedOrder], *wharfflow.Flow[keyedOrder]) {
	child := wharfflow.New[keyedOrder]("keyed-kid", nil).Step("work", func(ctx context.Context, s *keyedOrder, in wharfflow.Input) wharfflow.Outcome {
		pid := os.Getpid()
		if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".key_audit VALUES ($1, $2, $3)", s.Key, in.Instance, pid); err != nil {
			return wharfflow.Retry(err)
		}
		// Steps of a process killed since do not run any more (dead_pids).
		if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".key_violations SELECT $1, count(*) FROM "+schema+
			".key_audit a WHERE key = $1 AND a.pid NOT IN (SELECT pid FROM "+schema+".dead_pids) HAVING count(*) > $2",
			s.Key, keyedLimit); err != nil {
			return wharfflow.Retry(err)
		}
		time.Sleep(time.Duration(2+in.Instance%7) * time.Millisecond)
		if _, err := pool.Exec(ctx, "DELETE FROM "+schema+".key_audit WHERE instance = $1 AND pid = $2", in.Instance, pid); err != nil {
			return wharfflow.Retry(err)
		}
		return wharfflow.Done(nil).Emit(wharf.Message{Topic: "kid-done", Key: fmt.Sprint(in.Instance), Payload: []byte("x")})
	})
	order := wharfflow.New[keyedOrder]("keyed-order", nil).
		Step("wait", func(ctx context.Context, s *keyedOrder, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("fan", "go")
		}).
		Step("fan", func(ctx context.Context, s *keyedOrder, in wharfflow.Input) wharfflow.Outcome {
			kids := make([]wharfflow.Child, 3)
			for i := range kids {
				k := fmt.Sprintf("key-%d", (s.N+i)%4)
				kids[i] = child.Child(keyedOrder{Key: k}, wharfflow.Options{ConcurrencyKey: k, ConcurrencyLimit: keyedLimit})
			}
			return wharfflow.Spawn("join", kids...)
		}).
		Step("join", func(ctx context.Context, s *keyedOrder, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(len(in.Children)).Emit(wharf.Message{Topic: "order-done", Key: fmt.Sprint(in.Instance), Payload: []byte("x")})
		})
	return order, child
}

// TestKillKeyedHelperProcess is the runner process the keyed kill -9 test
// kills; it does nothing unless started by it.
func TestKillKeyedHelperProcess(t *testing.T) {
	if os.Getenv(killKeyedEnv) == "" {
		return
	}
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	order, child := killKeyedFlows(pool, os.Getenv("WHARFFLOW_SCHEMA"))
	runDoomed(t, 0, order, child)
}

// Two runners (one in a process killed with kill -9 mid-load) run orders
// whose children share concurrency keys, whose signals are sent twice with
// one dedup key (some before their await is written), beside starts that
// roll back: every committed order finishes, each step's outcome is in the
// history once, each emitting step's message is in the outbox once, no key
// ever runs more than its limit at once (across both processes), and the
// rolled-back starts never run.
func TestKill9WithKeyedChildrenAndDuplicateSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE TABLE "+b.schema+".key_audit (key text, instance bigint, pid int); "+
		"CREATE TABLE "+b.schema+".key_violations (key text, n bigint); CREATE TABLE "+b.schema+".dead_pids (pid int)")
	require.NoError(t, err)
	helper := b.startHelper(t, "TestKillKeyedHelperProcess", killKeyedEnv+"=1")
	b.waitRegistered(t, "doomed")
	order, child := killKeyedFlows(b.pool, b.schema)

	const orders = 60
	starts := make([]wharfflow.Start, orders)
	for i := range starts {
		starts[i] = order.Start(keyedOrder{N: i}, wharfflow.StartOptions{Key: fmt.Sprintf("o-%d", i)})
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	// Starts that roll back, with a signal to one.
	errRollBack := errors.New("roll back")
	require.ErrorIs(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var rb []wharfflow.Start
		for i := range 10 {
			rb = append(rb, order.Start(keyedOrder{N: i}, wharfflow.StartOptions{Key: fmt.Sprintf("rb-%d", i)}))
		}
		if _, err := b.client.StartTx(ctx, tx, rb...); err != nil {
			return err
		}
		if _, err := b.client.SignalTx(ctx, tx, wharfflow.Signal{Flow: "keyed-order", Key: "rb-0", Name: "go"}); err != nil {
			return err
		}
		return errRollBack
	}), errRollBack)
	signal := func(from, to int) {
		t.Helper()
		for round := range 2 {
			var sigs []wharfflow.Signal
			for _, id := range ids[from:to] {
				sigs = append(sigs, wharfflow.Signal{Instance: id, Name: "go", DedupKey: fmt.Sprintf("go-%d", id), Payload: round})
			}
			_, err := b.client.Send(ctx, sigs...)
			require.NoError(t, err)
		}
	}
	signal(0, orders/2) // most of these before the await is written
	// The helper runs children of the first half; then a second runner
	// shares the work; the helper is killed while it runs children.
	ranChild := func(pid int) func() bool {
		return func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".key_audit WHERE pid = $1", pid).Scan(&n))
			return n > 0
		}
	}
	require.Eventually(t, ranChild(helper.cmd.Process.Pid), time.Minute, time.Millisecond, "the helper never ran a child")
	logger, records := newLogRecords()
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{order, child}, RunnerID: "survivor", LeaseTTL: 2 * time.Second, Logger: logger})
	signal(orders/2, orders)
	require.Eventually(t, ranChild(helper.cmd.Process.Pid), time.Minute, time.Millisecond, "the helper never ran a child")
	helper.kill9(t)
	// Its steps died mid-run (their leases keep their keys' slots until
	// they end); a statement of its that the server still runs may yet
	// record one of them.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".dead_pids VALUES ($1)", helper.cmd.Process.Pid)
	require.NoError(t, err)
	killed := time.Now()

	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	t.Logf("every order done %s after the kill", time.Since(killed).Round(time.Millisecond))
	require.Empty(t, records(), "the surviving runner logged warnings")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".key_violations").Scan(&n))
	require.Zero(t, n, "a key ran more than its limit at once")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE correlation_key LIKE 'rb-%'").Scan(&n))
	require.Zero(t, n, "a rolled-back start")
	for _, id := range ids {
		require.Equal(t, []string{"wait/0/await", "fan/0/spawn", "join/0/done"}, b.history(t, id), "order %d", id)
		d, err := b.client.Get(ctx, id)
		require.NoError(t, err)
		require.Len(t, d.Signals, 1, "order %d: the signal sent twice is recorded once", id)
		require.Equal(t, "fan", d.Signals[0].ConsumedStep)
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox WHERE topic = 'order-done' AND key = $1", fmt.Sprint(id)).Scan(&n))
		require.Equal(t, 1, n, "order %d: one message", id)
		for _, k := range b.children(t, id) {
			require.Equal(t, []string{"work/0/done"}, b.history(t, k.ID), "child %d", k.ID)
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox WHERE topic = 'kid-done' AND key = $1", fmt.Sprint(k.ID)).Scan(&n))
			require.Equal(t, 1, n, "child %d: one message", k.ID)
		}
	}
}
