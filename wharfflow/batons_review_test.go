package wharfflow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// eventLog records what steps did, in order.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// countWhere counts the instances of ids matching cond (SQL on the row i).
func (b *testBundle) countWhere(t *testing.T, ids []int64, cond string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+
		".flow_instances i WHERE id = ANY ($1) AND "+cond, ids).Scan(&n))
	return n
}

// A step of a concurrency key that returns RateLimited on that key pauses
// every step on the key (docs/flows-design.md, Flow control: "every step on the key
// ... is moved to until by the claim without running"). With batons, the
// runner starts the key's next reserved step the moment the rate-limited step
// returns, before its write records the pause, and the write
// (flow_key_free's step 1, which does not look at paused_until) makes that
// baton running: the next call goes to the upstream that just answered 429,
// and so on for every baton the runner holds (two per step of the key).
//
// Found by the second review of the flows rework; fixed: no step of the key starts while the key is paused: the runner does
// not pass a baton on for an outcome that pauses its key (and the write does
// not convert batons of a paused key), so once the pause's write committed
// no other step of the key is running or has entered.
func TestRateLimitedKeyPassesNoBaton(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var log eventLog
	hold, end := make(chan struct{}), make(chan struct{})
	entered := make(chan int, 8)
	f := wharfflow.New[counter]("api", nil).Step("call", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		log.add("%d enters", s.N)
		entered <- s.N
		switch s.N {
		case 0:
			<-hold
		case 1:
			// The upstream answered 429: pause the key for an hour.
			return wharfflow.RateLimited("api", time.Now().Add(time.Hour))
		default:
			select {
			case <-ctx.Done():
			case <-end:
			}
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, ConcurrencyLimits: map[string]int{"api": 1}})
	t.Cleanup(func() { close(end) }) // before the runner stops
	opts := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "api"}}
	_, err := b.client.Start(ctx, f.Start(counter{N: 0}, opts))
	require.NoError(t, err)
	require.Equal(t, 0, <-entered)
	rest, err := b.client.Start(ctx, f.Start(counter{N: 1}, opts), f.Start(counter{N: 2}, opts), f.Start(counter{N: 3}, opts))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.countWhere(t, rest, "waiting_key") == 3 }, time.Minute, 5*time.Millisecond)
	// Step 0 ends: its write leases step 1 and reserves 2 and 3 as batons.
	close(hold)
	require.Equal(t, 1, <-entered)
	// Step 1's pause commits.
	require.Eventually(t, func() bool {
		h := b.history(t, rest[0])
		return len(h) == 1 && h[0] == "call/0/paused"
	}, time.Minute, 5*time.Millisecond)
	require.Zero(t, b.countWhere(t, rest, "status = 'running'"),
		"a step of the paused key was made running by the write that paused it; events: %v", log.all())
	require.Equal(t, []string{"0 enters", "1 enters"}, log.all(), "no step of the key starts while it is paused")
}

// A parent with a concurrency key whose children have all ended is due at
// its join step; when its key is full the claim puts it off to wait for a
// slot, and flow_key_free may reserve it to a runner as a baton. The baton
// rows complete_flow_steps returns carry no children's outcomes (NULL where
// the claim and the 'leased' rows give them), and the runner starts a baton
// from that row: the join step runs with Input.Children empty, and the
// parent decides on children it cannot see (here it would report zero
// successes for a child that succeeded).
//
// Found by the second review of the flows rework; fixed: a join step started as a baton receives its children's outcomes
// as a claimed one does: Input.Children has the one child, done.
func TestBatonJoinReceivesItsChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	holdChild, holdH, holdX, end := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	entered := make(chan string, 8)
	joined := make(chan []wharfflow.ChildResult, 1)
	child := wharfflow.New[counter]("child", nil).Step("work", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		<-holdChild
		return wharfflow.Done("ok")
	})
	parent := wharfflow.New[counter]("parent", nil).
		Step("spawn", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("join", child.Child(counter{}, wharfflow.Options{}))
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			joined <- in.Children
			return wharfflow.Done(len(in.Children))
		})
	// Other steps of the parent's key.
	other := wharfflow.New[counter]("other", nil).Step("work", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		entered <- fmt.Sprint(s.N)
		select {
		case <-map[int]chan struct{}{0: holdH, 1: holdX}[s.N]:
		case <-end:
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child, other}, ConcurrencyLimits: map[string]int{"tenant": 1}})
	t.Cleanup(func() { close(end) })
	keyed := wharfflow.Options{ConcurrencyKey: "tenant"}
	p, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{Options: keyed}))
	require.NoError(t, err)
	b.waitStatus(t, p[0], "joining")
	// The parent's key is free while it joins: H takes its slot, X waits.
	_, err = b.client.Start(ctx, other.Start(counter{N: 0}, wharfflow.StartOptions{Options: keyed}))
	require.NoError(t, err)
	require.Equal(t, "0", <-entered)
	x, err := b.client.Start(ctx, other.Start(counter{N: 1}, wharfflow.StartOptions{Options: keyed}))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.countWhere(t, x, "waiting_key") == 1 }, time.Minute, 5*time.Millisecond)
	// The child ends: the parent is due at its join, and waits for the key
	// behind X.
	close(holdChild)
	require.Eventually(t, func() bool { return b.countWhere(t, p, "waiting_key AND step = 'join'") == 1 }, time.Minute, 5*time.Millisecond)
	// H ends: its write leases X and reserves the parent as a baton; X ends
	// and the runner starts the parent's join as a baton.
	close(holdH)
	require.Equal(t, "1", <-entered)
	require.Eventually(t, func() bool {
		return b.countWhere(t, p, "status = 'ready' AND NOT waiting_key AND lease_owner IS NOT NULL") == 1
	}, time.Minute, 5*time.Millisecond, "the parent reserved as a baton")
	close(holdX)
	kids := <-joined
	require.Len(t, kids, 1, "the join step receives its child's outcome")
	b.waitStatus(t, p[0], "done")
}

// A step resumed by a signal that returns Retry runs again with the same
// signals (its outcome consumes none: "the step runs again with them"), and
// a claim gives them (claim_flow_steps returns flow_signals_for of the
// row's await). A keyed step whose retry waited for a slot of its key is
// instead leased by the write that freed the slot (flow_key_free's
// 'leased' rows, or a baton), and complete_flow_steps returns those rows
// with NULL signals: the retry runs with Input.Signals empty, and the
// payment it was told of is lost to it (its outcome consumes nothing, so the
// signal stays pending for some later await, if any).
//
// Found by the second review of the flows rework; fixed: the retry receives the signal, however it was leased.
func TestKeyedRetryLeasedByAWriteKeepsItsSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	holdGot, holdH, end := make(chan struct{}), make(chan struct{}), make(chan struct{})
	hEntered := make(chan struct{}, 1)
	type run struct{ attempt, signals int }
	got := make(chan run, 4)
	f := wharfflow.New[counter]("pay", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("got", "paid")
		}).
		Step("got", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			got <- run{in.Attempt, len(in.Signals)}
			if in.Attempt == 0 {
				<-holdGot
				return wharfflow.RetryAfter(fmt.Errorf("upstream busy"), 20*time.Millisecond)
			}
			return wharfflow.Done(len(in.Signals))
		})
	other := wharfflow.New[counter]("other", nil).Step("work", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		hEntered <- struct{}{}
		select {
		case <-holdH:
		case <-end:
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, other}, ConcurrencyLimits: map[string]int{"acct": 1}})
	t.Cleanup(func() { close(end) })
	keyed := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "acct"}}
	ids, err := b.client.Start(ctx, f.Start(counter{}, keyed))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "awaiting")
	_, err = b.client.Send(ctx, wharfflow.Signal{Instance: ids[0], Name: "paid", Payload: map[string]int{"cents": 500}})
	require.NoError(t, err)
	require.Equal(t, run{0, 1}, <-got, "the first run receives the signal")
	// While it runs, another step of the key waits for the slot; the retry
	// then waits behind it.
	h, err := b.client.Start(ctx, other.Start(counter{}, keyed))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.countWhere(t, h, "waiting_key") == 1 }, time.Minute, 5*time.Millisecond)
	close(holdGot)
	<-hEntered
	require.Eventually(t, func() bool { return b.countWhere(t, ids, "waiting_key AND attempt = 1") == 1 }, time.Minute, 5*time.Millisecond)
	close(holdH)
	require.Equal(t, run{1, 1}, <-got, "the retry receives the signal again")
	b.waitStatus(t, ids[0], "done")
}

// A step of a key that ends while its runner has no free slot names a baton
// it cannot start; planLeases counts that baton's slot as one the write may
// lease with (other++ and the step's freed slot, passed to complete_flow_steps
// as p_budget), but flow_key_free converts the baton without taking it from
// p_budget and then leases waiting steps of the key up to p_budget as well.
// When the key has more free slots than steps ended (its limit was raised,
// as a deploy with a new Config.ConcurrencyLimits does; a dead runner's
// lease ended), the write leases the runner the baton and one more step for
// the one slot freed, and release runs both: the runner runs more than
// MaxInFlight steps, which Config.MaxInFlight promises it never does.
//
// Found by the second review of the flows rework; fixed: a runner with MaxInFlight 1 never runs two steps at once.
func TestBatonNamedWithoutASlotKeepsMaxInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	cur, most := 0, 0
	holds := map[int]chan struct{}{0: make(chan struct{}), 1: make(chan struct{})}
	rest, end := make(chan struct{}), make(chan struct{})
	entered := make(chan int, 8)
	f := wharfflow.New[counter]("work", nil).Step("w", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		mu.Lock()
		cur++
		most = max(most, cur)
		mu.Unlock()
		defer func() {
			mu.Lock()
			cur--
			mu.Unlock()
		}()
		entered <- s.N
		h := holds[s.N]
		if h == nil {
			h = rest
		}
		select {
		case <-h:
		case <-end:
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "a", MaxInFlight: 1,
		ConcurrencyLimits: map[string]int{"k": 1}})
	t.Cleanup(func() { close(end) })
	opts := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "k"}}
	_, err := b.client.Start(ctx, f.Start(counter{N: 0}, opts))
	require.NoError(t, err)
	require.Equal(t, 0, <-entered)
	ws, err := b.client.Start(ctx, f.Start(counter{N: 1}, opts), f.Start(counter{N: 2}, opts), f.Start(counter{N: 3}, opts),
		f.Start(counter{N: 4}, opts))
	require.NoError(t, err)
	// Runner a has no free slot to claim them: another runner's claim puts
	// them off to wait for the key, then that runner stops.
	c, err := wharfflow.NewRunner(b.pool, &wharfflow.Config{Schema: b.schema, Flows: []wharfflow.Definition{f}, RunnerID: "c",
		Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.Eventually(t, func() bool { return b.countWhere(t, ws, "waiting_key") == 4 }, time.Minute, 5*time.Millisecond)
	require.NoError(t, c.Stop(ctx))
	// Step 0 ends: its write leases 1 and reserves 2 and 3 as batons.
	close(holds[0])
	require.Equal(t, 1, <-entered)
	require.Eventually(t, func() bool {
		return b.countWhere(t, ws[1:3], "status = 'ready' AND lease_owner = 'a' AND NOT waiting_key") == 2
	}, 5*time.Second, 5*time.Millisecond, "2 and 3 reserved to runner a: %v", b.dump(t, ws))
	// A deploy raises the key's limit (another process's runner starts).
	idle := wharfflow.New[counter]("idle", nil).Step("s", func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{idle}, RunnerID: "b", ConcurrencyLimits: map[string]int{"k": 3}})
	// Step 1 ends with no free slot on runner a: it names baton 2, and its
	// write makes 2 running and leases 4 to runner a as well.
	close(holds[1])
	b.waitStatus(t, ws[0], "done")
	require.LessOrEqual(t, b.countWhere(t, ws, "status = 'running' AND lease_owner = 'a'"), 1,
		"step 1's write leased runner a (MaxInFlight 1) more steps than it has slots: %v", b.dump(t, ws))
	close(rest)
	for _, id := range ws {
		b.waitStatus(t, id, "done")
	}
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, most, 1, "a runner with MaxInFlight 1 ran %d steps at once", most)
}

func (b *testBundle) dump(t *testing.T, ids []int64) []string {
	rows, err := b.pool.Query(context.Background(), "SELECT concat_ws(' ', id, step, status, coalesce(lease_owner, '-'), waiting_key, lease_token, CASE WHEN run_at = 'infinity' THEN NULL ELSE run_at - now() END) FROM "+b.schema+".flow_instances WHERE id = ANY ($1) ORDER BY id", ids)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// A baton the write did not make running (its key had no free slot: here
// its limit was lowered by a deploy, as Config.ConcurrencyLimits of a runner
// starting does; likewise when its row was locked by the runner's own
// renewal, flow_key_free's step 1 skipping locked rows) is stopped and
// dropped by release, but its row is left as it was: ready, reserved to the
// runner (lease_owner, not waiting_key), run_at at the reservation's end.
// Nobody holds it any more (not in batons, not in inflight: not renewed,
// not handed back), and flow_key_free wakes only waiting_key rows: the step
// waits out the whole reservation (LeaseTTL, 30 s by default) while steps
// of the key started after it run.
//
// Found by the second review of the flows rework; fixed: a dropped baton is handed back (or made waiting again) and runs as
// soon as the key has a slot: here well within half a lease.
func TestDroppedBatonWaitsNoLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const lease = time.Minute
	var log eventLog
	holds := map[int]chan struct{}{0: make(chan struct{}), 1: make(chan struct{}), 2: make(chan struct{})}
	end := make(chan struct{})
	entered := make(chan int, 16)
	f := wharfflow.New[counter]("work", nil).Step("w", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		log.add("%d enters", s.N)
		entered <- s.N
		if h := holds[s.N]; h != nil {
			select {
			case <-h:
			case <-end:
			}
		}
		if s.N == 3 {
			select {
			case <-ctx.Done():
				log.add("3 stopped: %v", context.Cause(ctx))
				return wharfflow.Done(nil)
			default:
			}
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "a", LeaseTTL: lease,
		ConcurrencyLimits: map[string]int{"k": 2}})
	t.Cleanup(func() { close(end) })
	opts := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "k"}}
	ids, err := b.client.Start(ctx, f.Start(counter{N: 0}, opts), f.Start(counter{N: 1}, opts))
	require.NoError(t, err)
	<-entered
	<-entered
	ws, err := b.client.Start(ctx, f.Start(counter{N: 2}, opts), f.Start(counter{N: 3}, opts), f.Start(counter{N: 4}, opts),
		f.Start(counter{N: 5}, opts))
	require.NoError(t, err)
	ids = append(ids, ws...)
	require.Eventually(t, func() bool { return b.countWhere(t, ws, "waiting_key") == 4 }, time.Minute, 5*time.Millisecond)
	// Step 0 ends: its write leases 2 and reserves 3 and 4 as batons.
	close(holds[0])
	require.Equal(t, 2, <-entered)
	require.Eventually(t, func() bool {
		return b.countWhere(t, ws[1:3], "status = 'ready' AND lease_owner = 'a' AND NOT waiting_key") == 2
	}, time.Minute, 5*time.Millisecond)
	// A deploy lowers the key's limit to 1.
	idle := wharfflow.New[counter]("idle", nil).Step("s", func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{idle}, RunnerID: "b", ConcurrencyLimits: map[string]int{"k": 1}})
	// Step 1 ends and passes baton 3; the key is full (step 2 runs), so the
	// write does not make 3 running and the runner stops it.
	close(holds[1])
	require.Equal(t, 3, <-entered)
	b.waitStatus(t, ids[1], "done")
	// Step 2 ends: 4 and 5 run, and 3, whose turn came first, must too.
	close(holds[2])
	b.waitStatus(t, ws[3], "done")
	for deadline := time.Now().Add(lease / 2); b.status(t, ws[1]) != "done" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, "done", b.status(t, ws[1]), "the dropped baton 3 waits out its reservation: %v; events %v",
		b.dump(t, ws), log.all())
}
