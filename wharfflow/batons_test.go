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

// A write that ends a step of a concurrency key reserves the key's next
// waiting steps to its runner as batons, and the runner starts one the
// moment a step of the key ends, in the slot it frees, before that step's
// write (which makes it running) commits. A baton whose instance was
// cancelled while it waited in reserve is started all the same (the runner
// cannot know): the write does not make it running, so the runner stops it
// and writes nothing of it, before the next step of the key starts; the
// other reserved step runs after. With a limit of 1, the key's steps never
// overlap.
func TestBatonOfACancelledInstanceStopsBeforeTheNextStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	hold := []chan struct{}{make(chan struct{}), make(chan struct{})}
	entered := make(chan int, 4)
	f := wharfflow.New[counter]("relay", nil).Step("work", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		record(fmt.Sprintf("%d enters", s.N))
		defer record(fmt.Sprintf("%d leaves", s.N))
		entered <- s.N
		switch s.N {
		case 0, 1:
			<-hold[s.N]
		case 2:
			select {
			case <-ctx.Done():
				record(fmt.Sprintf("2 stopped: %v", context.Cause(ctx)))
			case <-time.After(time.Minute):
			}
		}
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "relay", ConcurrencyLimits: map[string]int{"one": 1}})
	// Before the runner's Stop, should the test fail before it releases them.
	release := []func(){sync.OnceFunc(func() { close(hold[0]) }), sync.OnceFunc(func() { close(hold[1]) })}
	t.Cleanup(func() { release[0](); release[1]() })
	opts := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "one"}}
	first, err := b.client.Start(ctx, f.Start(counter{N: 0}, opts))
	require.NoError(t, err)
	require.Equal(t, 0, <-entered)
	ids, err := b.client.Start(ctx, f.Start(counter{N: 1}, opts), f.Start(counter{N: 2}, opts), f.Start(counter{N: 3}, opts))
	require.NoError(t, err)
	ids = append(first, ids...)
	// The three wait for the slot; step 0 ends and its write leases step 1
	// and reserves 2 and 3 as batons.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE id = ANY ($1) AND waiting_key", ids[1:]).Scan(&n))
		return n == 3
	}, time.Minute, 5*time.Millisecond)
	release[0]()
	require.Equal(t, 1, <-entered)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+
			".flow_instances WHERE id = ANY ($1) AND status = 'ready' AND lease_owner = 'relay' AND NOT waiting_key", ids[2:]).Scan(&n))
		return n == 2
	}, time.Minute, 5*time.Millisecond, "steps 2 and 3 reserved to the runner as batons")
	_, err = b.client.Cancel(ctx, ids[2])
	require.NoError(t, err)
	release[1]()
	b.waitStatus(t, ids[3], "done")
	require.Equal(t, "cancelled", b.status(t, ids[2]))
	require.Empty(t, b.history(t, ids[2]), "nothing of the cancelled baton is written")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"0 enters", "0 leaves", "1 enters", "1 leaves", "2 enters",
		"2 stopped: wharfflow: the step's lease was lost", "2 leaves", "3 enters", "3 leaves"}, events)
}
