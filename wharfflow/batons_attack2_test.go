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
