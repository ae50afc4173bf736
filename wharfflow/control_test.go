package wharfflow_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// maxTracker records the most steps running at once.
type maxTracker struct {
	mu       sync.Mutex
	cur, max int
}

func (m *maxTracker) enter() {
	m.mu.Lock()
	m.cur++
	m.max = max(m.max, m.cur)
	m.mu.Unlock()
}

func (m *maxTracker) leave() {
	m.mu.Lock()
	m.cur--
	m.mu.Unlock()
}

// A concurrency key admits at most K running steps at once across runners:
// one by default, two when the limit says so.
func TestConcurrencyKeyAdmitsAtMostK(t *testing.T) {
	t.Parallel()
	for _, k := range []int{1, 2} {
		b := setup(t)
		ctx := context.Background()
		var tr maxTracker
		step := func(next string) wharfflow.StepFunc[counter] {
			return func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
				tr.enter()
				time.Sleep(5 * time.Millisecond) // holds the slot so that others try to run meanwhile
				tr.leave()
				if next == "" {
					return wharfflow.Done(nil)
				}
				return wharfflow.Next(next)
			}
		}
		f := wharfflow.New[counter]("keyed", nil).Step("a", step("b")).Step("b", step(""))
		b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 8})
		b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 8})
		var starts []wharfflow.Start
		for range 12 {
			starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{
				ConcurrencyKey: "customer-1", ConcurrencyLimit: map[int]int{1: 0, 2: 2}[k]}}))
		}
		ids, err := b.client.Start(ctx, starts...)
		require.NoError(t, err)
		for _, id := range ids {
			b.waitStatus(t, id, "done")
		}
		require.LessOrEqual(t, tr.max, k, "limit %d", k)
		for _, id := range ids {
			require.Equal(t, []string{"a/0/next", "b/0/done"}, b.history(t, id), "no attempt spent waiting for the key")
		}
	}
}

// A step that returns RateLimited on a key pauses every step on the key
// until the time given, spending no attempt; other keys go on.
func TestRateLimitedPausesTheKeyWithoutSpendingAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var until atomic.Int64
	var early atomic.Int32
	var once sync.Once
	type st struct {
		Key string `json:"key"`
	}
	f := wharfflow.New[st]("api", &wharfflow.FlowConfig{MaxAttempts: 1}).
		Step("call", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			if s.Key == "acme" {
				if u := until.Load(); u != 0 && time.Now().Before(time.Unix(0, u)) {
					early.Add(1)
				}
				first := false
				once.Do(func() { first = true })
				if first {
					t := time.Now().Add(400 * time.Millisecond)
					until.Store(t.UnixNano())
					return wharfflow.RateLimited("acme", t)
				}
			}
			return wharfflow.Done(in.Attempt)
		})
	// One step at a time, so the first call's pause comes before the others run.
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 1})
	var starts []wharfflow.Start
	for range 5 {
		starts = append(starts, f.Start(st{Key: "acme"}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "acme"}}))
	}
	starts = append(starts, f.Start(st{Key: "other"}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "other"}}))
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	require.Zero(t, early.Load(), "no step on the key ran before the pause ended")
	paused := 0
	for _, id := range ids {
		d, err := b.client.Get(ctx, id)
		require.NoError(t, err)
		require.JSONEq(t, "0", string(d.Result), "no attempt was spent (MaxAttempts is 1)")
		for _, s := range d.Steps {
			if s.Outcome == "paused" {
				paused++
			}
		}
	}
	require.Equal(t, 1, paused)
}

// A token bucket on a key lets steps through no faster than its rate.
func TestTokenBucketRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var times []time.Time
	const lease = time.Minute
	f := wharfflow.New[counter]("limited", nil).
		Step("call", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			// The claim's time, on the database's clock: the lease's end less its length.
			var leaseEnd time.Time
			if err := b.pool.QueryRow(ctx, "SELECT run_at FROM "+b.schema+".flow_instances WHERE id = $1", in.Instance).Scan(&leaseEnd); err != nil {
				return wharfflow.Retry(err)
			}
			mu.Lock()
			times = append(times, leaseEnd.Add(-lease))
			mu.Unlock()
			return wharfflow.Done(nil)
		})
	const rate = 20.0
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, LeaseTTL: lease,
		RateLimits: map[string]wharfflow.RateLimit{"provider": {PerSecond: rate, Burst: 1}}})
	var starts []wharfflow.Start
	for range 8 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "provider"}}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	mu.Lock()
	defer mu.Unlock()
	first, last := times[0], times[0]
	for _, at := range times {
		if at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	// 8 claims from a bucket of 1 refilled at 20/s span at least 7/20 s.
	require.Len(t, times, len(ids))
	require.GreaterOrEqual(t, last.Sub(first), time.Duration(float64(len(ids)-1)/rate*float64(time.Second)))
}

// Higher priority steps are claimed first.
func TestPriorityOrdersClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var order []int
	type st struct {
		P int `json:"p"`
	}
	f := wharfflow.New[st]("prio", nil).
		Step("run", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			order = append(order, s.P)
			mu.Unlock()
			return wharfflow.Done(nil)
		})
	var starts []wharfflow.Start
	for _, p := range []int{0, 5, -3, 9, 5, 0} {
		starts = append(starts, f.Start(st{P: p}, wharfflow.StartOptions{Options: wharfflow.Options{Priority: p}}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 1})
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{9, 5, 5, 0, 0, -3}, order)
}
