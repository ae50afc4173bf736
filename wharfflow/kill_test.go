package wharfflow_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfflow"
)

const killHelperEnv = "WHARFFLOW_KILL_HELPER"

// killFlow is the flow of the kill -9 test: in the helper process, step two
// writes a marker file and blocks until the process is killed.
func killFlow(onTwo func(in wharfflow.Input), onOne func()) *wharfflow.Flow[counter] {
	return wharfflow.New[counter]("kill", nil).
		Step("one", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			onOne()
			s.N = 1
			return wharfflow.Next("two")
		}).
		Step("two", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			onTwo(in)
			s.N = 2
			return wharfflow.Next("three")
		}).
		Step("three", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(s.N)
		})
}

// TestKillHelperProcess is the runner process TestKill9MidStepRerunsThatStep
// kills; it does nothing unless started by it.
func TestKillHelperProcess(t *testing.T) {
	marker := os.Getenv(killHelperEnv)
	if marker == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	f := killFlow(func(wharfflow.Input) {
		require.NoError(t, os.WriteFile(marker, []byte("in step two"), 0o600))
		select {} // until kill -9
	}, func() {})
	r, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: os.Getenv("WHARFFLOW_SCHEMA"), Flows: []wharfflow.Definition{f},
		RunnerID: "doomed", LeaseTTL: 2 * time.Second, Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	select {}
}

// kill -9 of a runner process in the middle of a step: once the lease ends,
// another runner runs that step again (not the one before it, not the one
// after it), and the instance finishes with every step's outcome applied
// once.
func TestKill9MidStepRerunsThatStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	marker := filepath.Join(t.TempDir(), "marker")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestKillHelperProcess$", "-test.count=1")
	cmd.Env = append(testdb.CleanEnv(), killHelperEnv+"="+marker, "WHARFFLOW_SCHEMA="+b.schema, "TEST_DATABASE_URL="+databaseURL)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	var oneRan, twoRan atomic.Int32
	var twoAttempt atomic.Int32
	var twoAt atomic.Int64
	f := killFlow(func(in wharfflow.Input) {
		twoRan.Add(1)
		twoAttempt.Store(int32(in.Attempt))
		twoAt.Store(time.Now().UnixNano())
	}, func() { oneRan.Add(1) })
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, time.Minute, 10*time.Millisecond,
		"the helper runner never reached step two")
	var leaseUntil time.Time
	var owner string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT run_at, lease_owner FROM "+b.schema+".flow_instances WHERE id = $1", ids[0]).Scan(&leaseUntil, &owner))
	require.Equal(t, "doomed", owner)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	<-exited

	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "survivor"})
	b.waitStatus(t, ids[0], "done")
	require.Zero(t, oneRan.Load(), "step one, already committed, never ran again")
	require.EqualValues(t, 1, twoRan.Load(), "step two ran again, once")
	require.Zero(t, twoAttempt.Load(), "a re-run after a crash keeps the attempt (and the idempotency key)")
	require.False(t, time.Unix(0, twoAt.Load()).Before(leaseUntil), "step two ran again only after the lease ended")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	var runs []string
	for _, s := range d.Steps {
		runs = append(runs, s.Step+"@"+s.Runner)
	}
	require.Equal(t, []string{"one@doomed", "two@survivor", "three@survivor"}, runs)
	require.JSONEq(t, "2", string(d.Result))
}
