package wharfflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

// lockWaiters counts the backends waiting for a lock in a statement on b's
// schema. The other tests of the package run beside this one in the same
// database, each in its own schema, and their waits are not counted.
func lockWaiters(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database() AND query NOT LIKE '%pg_stat_activity%'
AND strpos(query, $1 || '.') > 0`, b.schema).Scan(&n))
	return n
}

// childStatuses is parent's children's statuses, in id order.
func childStatuses(t *testing.T, b *testBundle, parent int64) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT status FROM "+b.schema+".flow_instances WHERE parent_id = $1 ORDER BY id", parent)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// H2. cancel_flow computes the instance's tree (flow_tree) with its
// statement's snapshot and only then waits for the rows' locks. When the
// parent's spawn outcome is being written (the write holds the parent's row
// and has inserted the children, not committed yet), the cancel waits for
// that write, then cancels the parent alone: the children it inserted were
// not in the snapshot. They stay live (here awaiting; leased children run),
// under a cancelled parent whose join never comes, and retention cleanup
// later deletes them with the parent while they are still active.
//
// The write is held open the way a runner's write is when the outcome
// emits a message (complete_flow_steps, then EnqueueTx, then COMMIT): the
// test locks the outbox table so the enqueue waits. Fixed: cancel_flow
// locks the instance, then its tree, looking again after each round of
// locks: Cancel cancels the children too.
func TestCancelRacingASpawnWriteCancelsTheChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	child := wharfflow.New[counter]("child", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("never", "never")
		}).
		Step("never", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	parent := wharfflow.New[counter]("parent", nil).
		Step("fan", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("join", child.Child(counter{}, wharfflow.Options{}), child.Child(counter{}, wharfflow.Options{}),
				child.Child(counter{}, wharfflow.Options{})).Emit(wharf.Message{Topic: "spawned", Payload: []byte("x")})
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}})

	hold, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	_, err = hold.Exec(ctx, "LOCK TABLE "+b.schema+".outbox IN EXCLUSIVE MODE")
	require.NoError(t, err)

	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	// The spawn's write: parent updated, children inserted, enqueue waiting.
	require.Eventually(t, func() bool { return lockWaiters(t, b) == 1 }, 30*time.Second, 5*time.Millisecond)

	cancelled := make(chan int, 1)
	go func() {
		n, err := b.client.Cancel(context.Background(), ids[0])
		assert.NoError(t, err)
		cancelled <- n
	}()
	// The cancel waits for the parent's row.
	require.Eventually(t, func() bool { return lockWaiters(t, b) == 2 }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, hold.Rollback(ctx))
	n := <-cancelled

	require.Equal(t, "cancelled", b.status(t, ids[0]))
	// Let the runner settle the children it was leased.
	require.Eventually(t, func() bool {
		for _, s := range childStatuses(t, b, ids[0]) {
			if s == "running" {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	st := childStatuses(t, b, ids[0])
	t.Logf("Cancel returned %d; children: %v", n, st)
	require.Equal(t, []string{"cancelled", "cancelled", "cancelled"}, st,
		"a cancelled parent's children must not stay active")
}

// H3. cancel_flow(child) makes the parent due for its join only if, in its
// own statement's snapshot, every other child of the round has ended; the
// runner's outcome write of the last other child checks the same thing in
// its snapshot. The write locks the parent first (so two writes take turns)
// but cancel_flow does not, so when the two overlap neither sees the
// other's child ended: the parent stays "joining" with every child ended,
// and nothing ever runs its join (run_at is infinity).
//
// The cancel runs in a transaction held open while the sibling's outcome
// is written, which stands for an autocommit cancel whose commit comes
// after the write's join check (the write's statement covers a whole
// batch). Fixed: the cancel locks the parent before it decides, and the
// write locks it before it touches the child, so the write waits for the
// cancel's commit and then sees the cancelled sibling: the parent runs its
// join.
func TestCancelOfAChildRacingItsSiblingKeepsTheJoin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	child := wharfflow.New[counter]("child", nil).
		Step("s", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if s.N == 1 {
				<-release
				return wharfflow.Done(nil)
			}
			return wharfflow.Await("never", "never")
		}).
		Step("never", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	parent := wharfflow.New[counter]("parent", nil).
		Step("fan", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("join", child.Child(counter{N: 1}, wharfflow.Options{}), child.Child(counter{N: 2}, wharfflow.Options{}))
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(len(in.Children))
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}})
	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	var slow, waiting int64
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(ctx, "SELECT (SELECT id FROM "+b.schema+".flow_instances WHERE parent_id = $1 AND state->>'n' = '1' AND status = 'running'),"+
			" (SELECT id FROM "+b.schema+".flow_instances WHERE parent_id = $1 AND state->>'n' = '2' AND status = 'awaiting')", ids[0]).Scan(&slow, &waiting)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".cancel_flow($1)", waiting).Scan(&n))
	require.Equal(t, 1, n)
	close(release) // the sibling ends; its write waits for the cancel's lock on the parent
	require.Eventually(t, func() bool { return lockWaiters(t, b) == 1 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, "running", b.status(t, slow), "the write waits before it touches the child")
	require.NoError(t, tx.Commit(ctx))
	b.waitStatus(t, slow, "done")

	require.Equal(t, []string{"done", "cancelled"}, childStatuses(t, b, ids[0]))
	if !assert.Eventually(t, func() bool { return b.status(t, ids[0]) == "done" }, 10*time.Second, 20*time.Millisecond,
		"every child ended, but the parent never ran its join") {
		var run string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT status || ' ' || step || ' run_at ' || run_at::text FROM "+b.schema+".flow_instances WHERE id = $1", ids[0]).Scan(&run))
		t.Logf("parent after 10s: %s", run)
	}
}
