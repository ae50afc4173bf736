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
// every step on the key (docs/flows.md, Flow control: "every step on the key
// ... is moved to until by the claim without running"). With batons, the
// runner starts the key's next reserved step the moment the rate-limited step
// returns, before its write records the pause, and the write
// (flow_key_free's step 1, which does not look at paused_until) makes that
// baton running: the next call goes to the upstream that just answered 429,
// and so on for every baton the runner holds (two per step of the key).
//
// Fixed, no step of the key starts while the key is paused: the runner does
// not pass a baton on for an outcome that pauses its key (and the write does
// not convert batons of a paused key), so once the pause's write committed
// no other step of the key is running or has entered.
func TestAttack2RateLimitedKeyPassesNoBaton(t *testing.T) {
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
// Fixed, a join step started as a baton receives its children's outcomes
// as a claimed one does: Input.Children has the one child, done.
func TestAttack2BatonJoinReceivesItsChildren(t *testing.T) {
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
// Fixed, the retry receives the signal, however it was leased.
func TestAttack2KeyedRetryLeasedByAWriteKeepsItsSignals(t *testing.T) {
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
