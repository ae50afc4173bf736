package wharfflow_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// A step continued on its lease keeps the lease's end (and not_before) while
// half of the lease is left, so that the instance row's update changes no
// indexed column and can be HOT; with less left it gets a whole lease again.
// The runner renews a continued step's lease from when the lease was taken,
// not from when the step started, or a kept lease would end before its
// renewal.
func TestContinuedStepKeepsItsLeaseWhileHalfIsLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var aStarted time.Time
	inA, inB, inC := make(chan struct{}), make(chan struct{}), make(chan struct{})
	goA, goB, goC := make(chan struct{}), make(chan struct{}), make(chan struct{})
	f := wharfflow.New[counter]("keep", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			aStarted = time.Now()
			close(inA)
			<-goA
			return wharfflow.Next("b")
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			close(inB)
			<-goB
			return wharfflow.Next("c")
		}).
		Step("c", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			close(inC)
			<-goC
			return wharfflow.Done(nil)
		})
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, LeaseTTL: time.Minute})
	// A failed assertion must not leave steps blocked: the runner's Stop
	// waits for them. Runs before the runner's cleanup.
	var opened []chan struct{}
	release := func(c chan struct{}) { close(c); opened = append(opened, c) }
	t.Cleanup(func() {
		for _, c := range []chan struct{}{goA, goB, goC} {
			if !slices.Contains(opened, c) {
				close(c)
			}
		}
	})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	id := ids[0]
	type lease struct {
		runAt, notBefore time.Time
		token            int64
		status           string
	}
	read := func() lease {
		var l lease
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT run_at, not_before, lease_token, status FROM "+b.schema+
			".flow_instances WHERE id = $1", id).Scan(&l.runAt, &l.notBefore, &l.token, &l.status))
		return l
	}

	<-inA
	claimed := read()
	require.Equal(t, "running", claimed.status)
	release(goA)
	<-inB
	continued := read()
	require.Equal(t, "running", continued.status)
	require.Greater(t, continued.token, claimed.token, "the write gave the continued step a token of its own")
	require.Equal(t, claimed.runAt, continued.runAt, "the lease's end is kept while half of it is left")
	require.Equal(t, claimed.notBefore, continued.notBefore)
	started, ok := wharfflow.LeaseStart(r, id)
	require.True(t, ok)
	require.False(t, started.After(aStarted), "the continued step's renewals count from the lease a's claim took")

	// As if step b had run for most of the lease: less than half is left.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET run_at = clock_timestamp() + interval '20 seconds' WHERE id = $1", id)
	require.NoError(t, err)
	release(goB)
	<-inC
	var whole bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT run_at > clock_timestamp() + interval '40 seconds' FROM "+b.schema+
		".flow_instances WHERE id = $1", id).Scan(&whole))
	require.True(t, whole, "with less than half of the lease left, the write gives the step a whole lease")
	release(goC)
	b.waitStatus(t, id, "done")
	require.Equal(t, []string{"a/0/next", "b/0/next", "c/0/done"}, b.history(t, id))
}
