package wharfflow_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// A step that a signal leased to a busy runner waits in the runner's queue
// (up to 10,000 of them, for up to a quarter second each). cancel_flow
// cancels the instance meanwhile: cancelLoop only stops steps in inflight,
// and startQueued starts the queued one once a slot frees, with a fresh
// context: the step of a cancelled instance runs (user code, its side
// effects) after Cancel returned. A cancelled instance's step must not be
// started.
func TestQueuedSignalledStepOfACancelledInstanceDoesNotRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// The queue keeps a step for at most a quarter second: should the cancel
	// and the busy step's end take longer than that (a loaded machine), the
	// step is handed back instead and the attempt proves nothing; try again.
	for attempt := range 10 {
		var ranAfterCancel atomic.Int32
		var cancelled atomic.Bool
		name := fmt.Sprintf("held%d", attempt)
		f := wharfflow.New[counter](name, nil).
			Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
				return wharfflow.Await("go", "go")
			}).
			Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
				if cancelled.Load() {
					ranAfterCancel.Add(1)
				}
				return wharfflow.Done(nil)
			})
		started, hold := make(chan struct{}, 1), make(chan struct{})
		release := sync.OnceFunc(func() { close(hold) })
		busy := wharfflow.New[counter](fmt.Sprintf("busy%d", attempt), nil).Step("hold", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			started <- struct{}{}
			<-hold
			return wharfflow.Done(nil)
		})
		marker := wharfflow.New[counter](fmt.Sprintf("marker%d", attempt), nil).Step("one", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
		runnerID := fmt.Sprintf("queue-cancel-%d", attempt)
		r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, busy, marker}, RunnerID: runnerID, MaxInFlight: 1, LeaseTTL: 30 * time.Second})
		t.Cleanup(release)
		b.waitRegistered(t, runnerID)
		ids := b.startAwaiting(t, f, 1)
		_, err := b.client.Start(ctx, busy.Start(counter{}, wharfflow.StartOptions{}))
		require.NoError(t, err)
		<-started
		b.sendGo(t, ids)
		require.Eventually(t, func() bool { return slices.Contains(wharfflow.QueuedIDs(r), ids[0]) }, time.Minute, time.Millisecond,
			"the signalled step never waited in the busy runner's queue")
		queuedAt := time.Now()
		cancelled.Store(true)
		_, err = b.client.Cancel(ctx, ids[0])
		require.NoError(t, err)
		inTime := time.Since(queuedAt) < 150*time.Millisecond
		release()
		b.waitStatus(t, ids[0], "cancelled")
		// With one slot, queued steps start before any claim: once a step
		// started after the busy one ended is done, the queued step, if it
		// was started, has ended too.
		mid, err := b.client.Start(ctx, marker.Start(counter{}, wharfflow.StartOptions{}))
		require.NoError(t, err)
		b.waitStatus(t, mid[0], "done")
		require.Zero(t, ranAfterCancel.Load(), "the step of instance %d ran after its Cancel returned (it waited in the busy runner's queue)", ids[0])
		if !inTime {
			continue // the queue's quarter second may have ended first: the attempt proves nothing
		}
		return
	}
	t.Fatal("in 10 attempts the cancel never committed within the queue's quarter second")
}
