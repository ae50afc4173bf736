package wharfflow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// A step receives at most 1000 of its instance's pending signals, oldest
// first: a producer that piles signals onto one instance cannot make a claim
// build a value PostgreSQL refuses (jsonb's 256 MB), which would fail every
// claim that reached the instance. The rest stay pending for the next await.
func TestAStepReceivesAtMostAThousandSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var got []int
	var first, last []int64
	f := wharfflow.New[counter]("piled", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("take", "item")
		}).
		Step("take", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			got = append(got, len(in.Signals))
			first, last = append(first, in.Signals[0].ID), append(last, in.Signals[len(in.Signals)-1].ID)
			mu.Unlock()
			if s.N++; s.N < 2 {
				return wharfflow.Await("take", "item")
			}
			return wharfflow.Done(nil)
		})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	sigs := make([]wharfflow.Signal, 1005)
	for i := range sigs {
		sigs[i] = wharfflow.Signal{Instance: ids[0], Name: "item", Payload: i, DedupKey: fmt.Sprint(i)}
	}
	_, err = b.client.Send(ctx, sigs...)
	require.NoError(t, err)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	b.waitStatus(t, ids[0], "done")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1000, 5}, got)
	require.Less(t, last[0], first[1], "oldest first: the second step got the last five")
}
