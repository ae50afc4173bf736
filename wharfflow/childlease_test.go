package wharfflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// fanFlows are a parent flow "fan" whose first step spawns n children of
// flow "leaf" (with the options childOpts gives child i), and whose join
// step ends it with its children's outcomes; leaf runs each child's step.
func fanFlows(n int, childOpts func(i int) wharfflow.Options, leaf wharfflow.StepFunc[counter],
	join func(in wharfflow.Input) wharfflow.Outcome) (parent, child *wharfflow.Flow[counter]) {
	child = wharfflow.New[counter]("leaf", nil).Step("work", leaf)
	parent = wharfflow.New[counter]("fan", nil).
		Step("fan", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			kids := make([]wharfflow.Child, n)
			for i := range kids {
				kids[i] = child.Child(counter{N: i}, childOpts(i))
			}
			return wharfflow.Spawn("join", kids...)
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome { return join(in) })
	return parent, child
}

func noKeys(int) wharfflow.Options { return wharfflow.Options{} }

// leafDone ends a child with its index.
func leafDone(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
	return wharfflow.Done(s.N)
}

// childRow is a child instance's row: id, status, result.
type childRow struct {
	ID     int64
	Status string
	Result string
}

// children are parent's children's rows, in id order.
func (b *testBundle) children(t *testing.T, parent int64) []childRow {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT id, status, coalesce(result::text, '') FROM "+
		b.schema+".flow_instances WHERE parent_id = $1 ORDER BY id", parent)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (childRow, error) {
		var c childRow
		err := r.Scan(&c.ID, &c.Status, &c.Result)
		return c, err
	})
	require.NoError(t, err)
	return out
}

// joinSeen records what each join step received, per parent instance.
type joinSeen struct {
	mu   sync.Mutex
	runs map[int64]int
	kids map[int64][]wharfflow.ChildResult
}

func newJoinSeen() *joinSeen {
	return &joinSeen{runs: map[int64]int{}, kids: map[int64][]wharfflow.ChildResult{}}
}

func (j *joinSeen) join(in wharfflow.Input) wharfflow.Outcome {
	j.mu.Lock()
	j.runs[in.Instance]++
	j.kids[in.Instance] = in.Children
	j.mu.Unlock()
	return wharfflow.Done(len(in.Children))
}

// requireJoinedOnce checks that parent's join ran once, with exactly the
// outcomes of its children as the database has them.
func (j *joinSeen) requireJoinedOnce(t *testing.T, b *testBundle, parent int64) {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	require.Equal(t, 1, j.runs[parent], "instance %d: the join ran once", parent)
	var want []string
	for _, c := range b.children(t, parent) {
		want = append(want, fmt.Sprintf("%d/leaf/%s/%s", c.ID, c.Status, c.Result))
	}
	var got []string
	for _, c := range j.kids[parent] {
		got = append(got, fmt.Sprintf("%d/%s/%s/%s", c.ID, c.Flow, c.Status, string(c.Result)))
	}
	require.Equal(t, want, got, "instance %d: the join received exactly its children's outcomes", parent)
}

// A spawn's children without keys are leased to the spawning runner by the
// spawn's own write, and the join to the runner whose write ended the last
// child: one claim (the parent's first step) for the whole flow. The join
// runs once, with exactly its children's outcomes.
func TestSpawnedChildrenAndJoinRunWithoutAClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seen := newJoinSeen()
	var leafRuns sync.Map
	parent, child := fanFlows(5, noKeys, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		n, _ := leafRuns.LoadOrStore(in.Instance, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return wharfflow.Done(s.N * 10)
	}, seen.join)
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}, RunnerID: "solo"})
	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "done")

	seen.requireJoinedOnce(t, b, ids[0])
	kids := b.children(t, ids[0])
	require.Len(t, kids, 5)
	for i, c := range kids {
		require.Equal(t, "done", c.Status)
		require.JSONEq(t, fmt.Sprint(i*10), c.Result)
		n, ok := leafRuns.Load(c.ID)
		require.True(t, ok)
		require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "child %d ran once", c.ID)
		require.Equal(t, []string{"work/0/done"}, b.history(t, c.ID))
	}
	require.Equal(t, []string{"fan/0/spawn", "join/0/done"}, b.history(t, ids[0]))
	require.EqualValues(t, 1, r.Stats().Claimed(), "only the parent's first step was claimed")
	require.EqualValues(t, 6, r.Stats().Leased(), "five children and the join were leased by outcome writes")
}

// With fewer free slots than children, a spawn's write leases what the
// runner can run and leaves the rest to the claim: the runner never runs
// more than MaxInFlight steps, and every join runs once with its children.
func TestSpawnLeasesNoMoreChildrenThanFreeSlots(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const slots, parents, perParent = 3, 8, 5
	var tr maxTracker
	seen := newJoinSeen()
	parent, child := fanFlows(perParent, noKeys, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		tr.enter()
		runtime.Gosched()
		tr.leave()
		return wharfflow.Done(s.N)
	}, func(in wharfflow.Input) wharfflow.Outcome {
		tr.enter()
		defer tr.leave()
		return seen.join(in)
	})
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}, MaxInFlight: slots})
	var starts []wharfflow.Start
	for range parents {
		starts = append(starts, parent.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	for _, id := range ids {
		seen.requireJoinedOnce(t, b, id)
		for _, c := range b.children(t, id) {
			require.Equal(t, []string{"work/0/done"}, b.history(t, c.ID))
		}
	}
	tr.mu.Lock()
	require.LessOrEqual(t, tr.max, slots, "at most MaxInFlight steps ran at once")
	tr.mu.Unlock()
	// A spawn's write leases at most the runner's slots: the other
	// children of each parent were claimed.
	require.GreaterOrEqual(t, r.Stats().Claimed(), int64(parents+parents*(perParent-slots)))
}

// Children on concurrency or rate keys, and a parent with a key, go through
// the claim, which applies the keys, or (a step that waited for a slot of
// its concurrency key) are leased by the write that frees the slot, under
// the key's lock; a parent without keys whose children were claimed still
// has its join leased by the write that ended its last child.
func TestKeyedChildrenAndParentsGoThroughTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var tr maxTracker
	seen := newJoinSeen()
	keyed := func(i int) wharfflow.Options {
		if i%2 == 0 {
			return wharfflow.Options{ConcurrencyKey: "kid-slot"}
		}
		return wharfflow.Options{RateKey: "kid-rate"}
	}
	parent, child := fanFlows(4, keyed, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		if s.N%2 == 0 {
			tr.enter()
			defer tr.leave()
			runtime.Gosched()
		}
		return wharfflow.Done(s.N)
	}, seen.join)
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child},
		RateLimits: map[string]wharfflow.RateLimit{"kid-rate": {PerSecond: 1000, Burst: 10}}})
	ids, err := b.client.Start(ctx,
		parent.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "parent-slot"}}),
		parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	for _, id := range ids {
		seen.requireJoinedOnce(t, b, id)
	}
	tr.mu.Lock()
	require.Equal(t, 1, tr.max, "the children on the concurrency key ran one at a time")
	tr.mu.Unlock()
	// Twelve steps: both parents' first steps, the eight children, two
	// joins. Claimed: the parents' first steps, the children on the rate
	// key, the keyed parent's join; the children on the concurrency key
	// were claimed or leased when a slot freed; the other join was leased.
	require.EqualValues(t, 12, r.Stats().Claimed()+r.Stats().Leased())
	require.GreaterOrEqual(t, r.Stats().Claimed(), int64(7))
	require.GreaterOrEqual(t, r.Stats().Leased(), int64(1))
}

// Cancelling a parent cancels the children leased to its runner by the
// spawn's write: their outcomes, written after, are not applied, and the
// join never runs.
func TestCancelParentCancelsLeasedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var entered atomic.Int32
	release := make(chan struct{})
	var joins atomic.Int32
	parent, child := fanFlows(3, noKeys, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		entered.Add(1)
		<-release
		return wharfflow.Done(s.N)
	}, func(in wharfflow.Input) wharfflow.Outcome {
		joins.Add(1)
		return wharfflow.Done(nil)
	})
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}, RunnerID: "holder"})
	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return entered.Load() == 3 }, time.Minute, time.Millisecond)
	var leased int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE parent_id = $1 AND status = 'running' "+
		"AND lease_owner = 'holder' AND updated_at = created_at", ids[0]).Scan(&leased))
	require.Equal(t, 3, leased, "the children were inserted leased to the spawning runner")

	n, err := b.client.Cancel(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, 4, n)
	close(release)
	require.Eventually(t, func() bool { return r.Stats().Lost() == 3 }, time.Minute, time.Millisecond)
	rows, err := b.pool.Query(ctx, "SELECT status FROM "+b.schema+".flow_instances ORDER BY id")
	require.NoError(t, err)
	statuses, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"cancelled", "cancelled", "cancelled", "cancelled"}, statuses)
	for _, c := range b.children(t, ids[0]) {
		require.Empty(t, b.history(t, c.ID), "child %d: its outcome was not applied", c.ID)
	}
	require.Zero(t, joins.Load())
	require.Equal(t, []string{"fan/0/spawn"}, b.history(t, ids[0]))
}

// A join leased to the runner that ended the last child is taken over by
// another runner when that lease ends: it runs there with the same
// children's outcomes, and the first runner's late outcome is not applied.
func TestLeasedJoinTakenOverAfterItsLeaseEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered := make(chan []wharfflow.ChildResult, 1)
	release := make(chan struct{})
	pa, ca := fanFlows(3, noKeys, leafDone, func(in wharfflow.Input) wharfflow.Outcome {
		entered <- in.Children
		<-release
		return wharfflow.Done("a")
	})
	seen := newJoinSeen()
	pb, cb := fanFlows(3, noKeys, leafDone, func(in wharfflow.Input) wharfflow.Outcome {
		seen.join(in)
		return wharfflow.Done("b")
	})
	// One slot, busy with the blocked join: A cannot claim the join again itself.
	ra := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{pa, ca}, RunnerID: "a", MaxInFlight: 1})
	ids, err := b.client.Start(ctx, pa.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	first := <-entered
	var owner, step string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT lease_owner, step FROM "+b.schema+".flow_instances WHERE id = $1 AND status = 'running'",
		ids[0]).Scan(&owner, &step))
	require.Equal(t, "a", owner)
	require.Equal(t, "join", step)
	require.GreaterOrEqual(t, ra.Stats().Leased(), int64(2), "a child and the join were leased by A's writes")
	// The lease ends (as if runner A had paused past it).
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET run_at = clock_timestamp() - interval '1 second' WHERE id = $1", ids[0])
	require.NoError(t, err)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{pb, cb}, RunnerID: "b"})
	b.waitStatus(t, ids[0], "done")
	seen.requireJoinedOnce(t, b, ids[0])
	seen.mu.Lock()
	require.Equal(t, first, seen.kids[ids[0]], "both runs of the join received the same children's outcomes")
	seen.mu.Unlock()
	close(release)
	require.Eventually(t, func() bool { return ra.Stats().Lost() == 1 }, time.Minute, time.Millisecond)
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, `"b"`, string(d.Result))
	require.Equal(t, []string{"fan/0/spawn", "join/0/done"}, b.history(t, ids[0]))
}

const killKidsEnv = "WHARFFLOW_KILL_KIDS"

// TestKillKidsHelperProcess is the runner TestKill9WithLeasedChildren
// kills: its children's step writes a marker file named after the child
// and blocks until the process is killed. It does nothing unless started
// by that test.
func TestKillKidsHelperProcess(t *testing.T) {
	dir := os.Getenv(killKidsEnv)
	if dir == "" {
		return
	}
	parent, child := fanFlows(3, noKeys, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprint(in.Instance)), []byte("in the child's step"), 0o600)
		select {} // until kill -9
	}, func(in wharfflow.Input) wharfflow.Outcome { select {} })
	runDoomed(t, 0, parent, child)
}

// kill -9 of a runner whose spawn leased it the children, in the middle of
// their steps: once their leases end, another runner runs each child once,
// then the join once with exactly their outcomes; the spawning step, which
// committed, never runs again.
func TestKill9WithLeasedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dir := t.TempDir()
	helper := b.startHelper(t, "TestKillKidsHelperProcess", killKidsEnv+"="+dir)

	seen := newJoinSeen()
	var mu sync.Mutex
	leafRuns := map[int64]int{}
	var fans atomic.Int32
	parent, child := fanFlows(3, noKeys, func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		mu.Lock()
		leafRuns[in.Instance]++
		mu.Unlock()
		return wharfflow.Done(s.N)
	}, seen.join)
	countFans := wharfflow.New[counter]("fan", nil).
		Step("fan", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			fans.Add(1)
			return wharfflow.Fail(fmt.Errorf("the spawning step ran again"))
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome { return seen.join(in) })
	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		entries, err := os.ReadDir(dir)
		return err == nil && len(entries) == 3
	}, time.Minute, 10*time.Millisecond, "the helper runner never ran the three children")
	kids := b.children(t, ids[0])
	require.Len(t, kids, 3)
	var leased int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE parent_id = $1 AND status = 'running' "+
		"AND lease_owner = 'doomed' AND updated_at = created_at", ids[0]).Scan(&leased))
	require.Equal(t, 3, leased, "the children were inserted leased to the spawning runner")
	helper.kill9(t)

	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{countFans, child}, RunnerID: "survivor"})
	b.waitStatus(t, ids[0], "done")
	seen.requireJoinedOnce(t, b, ids[0])
	require.Zero(t, fans.Load(), "the spawning step, committed, never ran again")
	mu.Lock()
	defer mu.Unlock()
	for _, c := range kids {
		require.Equal(t, 1, leafRuns[c.ID], "child %d ran again once", c.ID)
		d, err := b.client.Get(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, d.Steps, 1)
		require.Equal(t, "survivor", d.Steps[0].Runner)
	}
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	var runs []string
	for _, s := range d.Steps {
		runs = append(runs, s.Step+"@"+s.Runner)
	}
	require.Equal(t, []string{"fan@doomed", "join@survivor"}, runs)
	seen.mu.Lock()
	defer seen.mu.Unlock()
	var results []int
	for _, c := range seen.kids[ids[0]] {
		var n int
		require.NoError(t, json.Unmarshal(c.Result, &n))
		results = append(results, n)
	}
	slices.Sort(results)
	require.Equal(t, []int{0, 1, 2}, results)
}
