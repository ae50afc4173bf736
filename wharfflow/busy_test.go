package wharfflow_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// H5. A signal leases the instance it resumes to the runner that wrote the
// await, whether or not that runner has a free slot. A runner whose slots
// are all taken queues such steps (admitLeased) and renewLoop renews their
// leases like those of running steps, for as long as its slots stay taken:
// the resumed steps neither run nor become claimable, however many other
// runners are idle. Here one long step holds the only slot of the runner
// that wrote five awaits; their signals lease them to it, and an idle
// second runner never gets them, for 10 leases. The queue also grows with
// every such signal (memory without bound while the slots stay taken).
// Fixed: a runner with no free slot hands the steps signals lease to it
// back at once (due for any runner's claim), and an idle runner runs them.
func TestBusyRunnerHandsSignalledStepsToAnIdleOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const lease = 1500 * time.Millisecond
	f := signalFlow("held", nil)
	started, release := make(chan struct{}, 1), make(chan struct{})
	busy := busyFlow(started, release)
	busyRunner := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, busy}, RunnerID: "narrow", MaxInFlight: 1, LeaseTTL: lease})
	// Before the runner's Stop, which waits for the busy step, should the
	// test fail before it releases it.
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	b.waitRegistered(t, "narrow")
	ids := b.startAwaiting(t, f, 5)
	_, err := b.client.Start(ctx, busy.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	<-started
	b.sendGo(t, ids)
	// Fixed: the busy runner hands the five back (due, for any claim)
	// instead of queueing them and renewing their leases.
	require.Eventually(t, func() bool { return busyRunner.Stats().HandedBack() == 5 }, time.Minute, 5*time.Millisecond)
	require.Zero(t, busyRunner.Stats().Signalled())

	idle := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "idle", LeaseTTL: lease})
	done := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE id = ANY($1) AND status = 'done'", ids).Scan(&n))
		return n
	}
	ok := assert.Eventually(t, func() bool { return done() == 5 }, time.Minute, 20*time.Millisecond,
		"signalled steps leased to a runner with no free slot never ran on the idle runner")
	if !ok {
		var leased int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE id = ANY($1) AND status = 'running' AND lease_owner = 'narrow' AND run_at > clock_timestamp()", ids).Scan(&leased))
		t.Logf("after %s (%d leases): %d of 5 done, %d still leased to the busy runner (renewed), idle runner claimed %d",
			10*lease, 10, done(), leased, idle.Stats().Claimed())
	}
	releaseOnce() // before the runners stop: Stop waits for the busy step
	b.requireDoneWithPayloads(t, ids)
}
