package wharfflow_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfflow"
)

const killHelperEnv = "WHARFFLOW_KILL_HELPER"

// helperProcess is this test binary run again as a runner process for a
// kill -9 test: it runs only the helper test named, which does nothing
// unless its environment variable is set.
type helperProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startHelper starts the helper test run on the bundle's schema with env
// (NAME=value) and kills it at cleanup.
func (b *testBundle) startHelper(t *testing.T, run, env string) *helperProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^"+run+"$", "-test.count=1")
	cmd.Env = append(testdb.CleanEnv(), env, "WHARFFLOW_SCHEMA="+b.schema, "TEST_DATABASE_URL="+databaseURL)
	require.NoError(t, cmd.Start())
	h := &helperProcess{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-h.exited
	})
	return h
}

// kill9 kills the helper with SIGKILL and waits for it to exit.
func (h *helperProcess) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
	<-h.exited
}

// runDoomed runs, in a helper process, the runner "doomed" (2-s lease; 0
// maxInFlight: the default) on the schema the test gave it, until killed.
func runDoomed(t *testing.T, maxInFlight int, flows ...wharfflow.Definition) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	r, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: os.Getenv("WHARFFLOW_SCHEMA"), Flows: flows,
		RunnerID: "doomed", LeaseTTL: 2 * time.Second, MaxInFlight: maxInFlight, Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	select {}
}

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
	f := killFlow(func(wharfflow.Input) {
		require.NoError(t, os.WriteFile(marker, []byte("in step two"), 0o600))
		select {} // until kill -9
	}, func() {})
	runDoomed(t, 0, f)
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
	helper := b.startHelper(t, "TestKillHelperProcess", killHelperEnv+"="+marker)

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
	helper.kill9(t)

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

const killLoadEnv = "WHARFFLOW_KILL_LOAD"

// loadFlow is the flow of the kill -9 under load test: five steps, each
// emitting one message; onStep runs in each.
func loadFlow(onStep func()) *wharfflow.Flow[counter] {
	return wharfflow.New[counter]("load", nil).
		Step("s", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			onStep()
			s.N++
			msg := wharf.Message{Topic: "steps", Key: fmt.Sprint(in.Instance), Payload: []byte(fmt.Sprint(s.N))}
			if s.N == 5 {
				return wharfflow.Done(s.N).Emit(msg)
			}
			return wharfflow.Next("s").Emit(msg)
		})
}

// TestKillLoadHelperProcess is the runner TestKill9UnderLoad kills; it does
// nothing unless started by it.
func TestKillLoadHelperProcess(t *testing.T) {
	marker := os.Getenv(killLoadEnv)
	if marker == "" {
		return
	}
	var ran atomic.Int64
	f := loadFlow(func() {
		if ran.Add(1) == 300 {
			_ = os.WriteFile(marker, []byte("busy"), 0o600)
		}
		time.Sleep(time.Millisecond)
	})
	runDoomed(t, 64, f)
}

// kill -9 of a runner process under load: another runner finishes every
// instance, no step's outcome is lost or applied twice, and every emitted
// message is in the outbox once.
func TestKill9UnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := loadFlow(func() {})
	var starts []wharfflow.Start
	for range 400 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	marker := filepath.Join(t.TempDir(), "marker")
	helper := b.startHelper(t, "TestKillLoadHelperProcess", killLoadEnv+"="+marker)
	require.Eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, time.Minute, time.Millisecond,
		"the helper runner never got busy")
	helper.kill9(t)
	var leased int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE lease_owner = 'doomed' AND status = 'running'").Scan(&leased))

	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "survivor"})
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	var outcomes, messages, distinct, wrong int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_steps").Scan(&outcomes))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT (key, payload)) FROM "+b.schema+".outbox").Scan(&messages, &distinct))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE state <> '{\"n\": 5}'::jsonb").Scan(&wrong))
	require.Equal(t, 5*len(ids), outcomes, "one outcome per step: none lost, none applied twice")
	require.Equal(t, 5*len(ids), messages)
	require.Equal(t, messages, distinct)
	require.Zero(t, wrong)
	t.Logf("%d steps were leased to the killed runner", leased)
}
