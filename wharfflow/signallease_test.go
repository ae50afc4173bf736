package wharfflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// signalFlow awaits "go", then ends with the payload it received.
func signalFlow(name string, ran *atomic.Int32) *wharfflow.Flow[counter] {
	return wharfflow.New[counter](name, nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if ran != nil {
				ran.Add(1)
			}
			if len(in.Signals) != 1 {
				return wharfflow.Fail(fmt.Errorf("received %d signals", len(in.Signals)))
			}
			return wharfflow.Done(in.Signals[0].Payload)
		})
}

// waitRegistered waits for a runner's listener to register it: from then on
// signals lease to it.
func (b *testBundle) waitRegistered(t *testing.T, runner string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+
			".flow_runners WHERE id = $1 AND alive_until > clock_timestamp()", runner).Scan(&n))
		return n == 1
	}, time.Minute, 5*time.Millisecond, "runner %s never registered", runner)
}

// startAwaiting starts n instances and waits for each to await its signal.
func (b *testBundle) startAwaiting(t *testing.T, f *wharfflow.Flow[counter], n int) []int64 {
	t.Helper()
	starts := make([]wharfflow.Start, n)
	for i := range starts {
		starts[i] = f.Start(counter{}, wharfflow.StartOptions{})
	}
	ids, err := b.client.Start(context.Background(), starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "awaiting")
	}
	return ids
}

// sendGo signals "go" to each instance, its index as payload.
func (b *testBundle) sendGo(t *testing.T, ids []int64) {
	t.Helper()
	sigs := make([]wharfflow.Signal, len(ids))
	for i, id := range ids {
		sigs[i] = wharfflow.Signal{Instance: id, Name: "go", Payload: json.RawMessage(fmt.Sprint(i))}
	}
	_, err := b.client.Send(context.Background(), sigs...)
	require.NoError(t, err)
}

// requireDoneWithPayloads waits for each instance to end with its signal's
// payload, its history the await and the resumed step once each.
func (b *testBundle) requireDoneWithPayloads(t *testing.T, ids []int64) {
	t.Helper()
	for i, id := range ids {
		b.waitStatus(t, id, "done")
		d, err := b.client.Get(context.Background(), id)
		require.NoError(t, err)
		require.JSONEq(t, fmt.Sprint(i), string(d.Result))
		require.Equal(t, []string{"wait/0/await", "go/0/done"}, b.history(t, id))
	}
}

// A signal resumes an awaiting instance by leasing it, in the signal's own
// transaction, to the live runner that wrote the await: that runner runs
// the step without claiming it.
func TestSignalLeasesTheStepToTheRunnerThatAwaited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := signalFlow("leased", nil)
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "solo"})
	b.waitRegistered(t, "solo")
	ids := b.startAwaiting(t, f, 20)
	claimed := r.Stats().Claimed()
	require.EqualValues(t, 20, claimed, "the first steps were claimed")
	b.sendGo(t, ids)
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 20, r.Stats().Signalled(), "every resumed step was leased by its signal")
	require.Equal(t, claimed, r.Stats().Claimed(), "no resumed step was claimed")
}

// A runner that stopped removed its row: a signal to an instance whose
// await it wrote makes the instance due for any runner's claim.
func TestSignalToAStoppedRunnersAwaitGoesThroughTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := signalFlow("handover", nil)
	first := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "first"})
	b.waitRegistered(t, "first")
	ids := b.startAwaiting(t, f, 5)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, first.Stop(ctx))
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_runners").Scan(&n))
	require.Zero(t, n, "a stopped runner removes its row")

	second := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "second"})
	b.sendGo(t, ids)
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 5, second.Stats().Claimed())
	require.Zero(t, second.Stats().Signalled())
}

// A runner that died (no Stop) is alive for signals until its heartbeat
// ends: a signal leases it the instance, and the step runs on another
// runner once that lease ends, as a claimed step of a killed runner does.
func TestSignalLeasedToADeadRunnerRunsAfterTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := signalFlow("ghosted", nil)
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	// The rows as a runner that wrote the await and died leaves them: its
	// heartbeat still current, its lease one second.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES ('ghost', '1s', now() + interval '1 hour')")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'awaiting', step = 'go', await_signals = '{go}', run_at = 'infinity', lease_owner = 'ghost' WHERE id = $1", ids[0])
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_steps (instance_id, step, attempt, outcome, runner, started_at, finished_at) VALUES ($1, 'wait', 0, 'await', 'ghost', now(), now())", ids[0])
	require.NoError(t, err)

	b.sendGo(t, ids)
	var status, owner string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status, lease_owner FROM "+b.schema+".flow_instances WHERE id = $1", ids[0]).Scan(&status, &owner))
	require.Equal(t, []string{"running", "ghost"}, []string{status, owner}, "the signal leased the instance to the awaiting runner")

	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "heir"})
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 1, r.Stats().Claimed(), "taken over by a claim once the lease ended")
}

// busyFlow's step holds its slot until release is closed.
func busyFlow(started chan<- struct{}, release <-chan struct{}) *wharfflow.Flow[counter] {
	return wharfflow.New[counter]("busy", nil).Step("hold", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		started <- struct{}{}
		<-release
		return wharfflow.Done(nil)
	})
}

// queueSignalled starts a runner with one slot running f and a busy flow,
// five instances of f awaiting "go", then the busy step, which holds the
// slot until release is closed; it signals the five and waits until the
// runner, with no free slot, has handed back the steps the signals leased
// to it: due, for any runner's claim.
func (b *testBundle) queueSignalled(t *testing.T, runner string, f *wharfflow.Flow[counter]) (*wharfflow.Runner, []int64, func()) {
	t.Helper()
	started, hold := make(chan struct{}, 1), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	busy := busyFlow(started, hold)
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, busy}, RunnerID: runner, MaxInFlight: 1})
	// Before the runner's Stop (cleanups run last first), which waits for
	// the busy step, should the test fail before it releases it.
	t.Cleanup(release)
	b.waitRegistered(t, runner)
	ids := b.startAwaiting(t, f, 5)
	_, err := b.client.Start(context.Background(), busy.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	<-started
	b.sendGo(t, ids)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+
			".flow_instances WHERE id = ANY ($1) AND status = 'ready' AND lease_owner IS NULL", ids).Scan(&n))
		return n == 5
	}, time.Minute, 5*time.Millisecond, "the runner never handed back the steps leased to it")
	// The count follows the hand-back's commit.
	require.Eventually(t, func() bool { return r.Stats().HandedBack() == 5 }, time.Minute, 5*time.Millisecond)
	require.Zero(t, r.Stats().Signalled(), "no signalled step ran")
	return r, ids, release
}

// Steps signals lease to a runner whose slots are all taken are handed
// back, due for any runner's claim (here its own, once its slot frees): it
// never runs more than MaxInFlight steps.
func TestSignalledStepsWaitForAFreeSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var running, most atomic.Int32
	f := wharfflow.New[counter]("queued", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			return wharfflow.Done(in.Signals[0].Payload)
		})
	_, ids, release := b.queueSignalled(t, "narrow", f)
	require.Zero(t, running.Load(), "no signalled step runs while the only slot is taken")
	release()
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 1, most.Load(), "one step at a time")
}

// A runner stopping with signalled steps it handed back (no free slot)
// leaves no lease behind: another runner claims them and runs them with
// their signals.
func TestStopHandsBackSignalledStepsItHasNotStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := signalFlow("handback", nil)
	first, ids, release := b.queueSignalled(t, "leaving", f)

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stopped <- first.Stop(sctx)
	}()
	// The stop removed the runner's row before it stopped claiming.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_runners").Scan(&n))
		return n == 0
	}, time.Minute, 5*time.Millisecond)
	release()
	require.NoError(t, <-stopped)
	require.EqualValues(t, 6, first.Stats().Steps(), "the stopping runner wrote the five awaits and its busy step, no signalled step")

	var leased int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE status = 'running'").Scan(&leased))
	require.Zero(t, leased, "no lease is left behind")
	second := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "staying"})
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 5, second.Stats().Claimed())
}

// Two runners given one RunnerID (a misconfiguration) share the awaits
// they write; a signal leases such an instance to that id, and only the
// runner registered last hears of it: the resumed step runs once.
func TestTwoRunnersWithOneIDRunASignalledStepOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ran atomic.Int32
	f := signalFlow("twins", &ran)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "twin"})
	b.waitRegistered(t, "twin")
	var first int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT key FROM "+b.schema+".flow_runners WHERE id = 'twin'").Scan(&first))
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "twin"})
	require.Eventually(t, func() bool {
		var key int64
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT key FROM "+b.schema+".flow_runners WHERE id = 'twin'").Scan(&key))
		return key != first
	}, time.Minute, 5*time.Millisecond, "the second runner never registered")
	ids := b.startAwaiting(t, f, 20)
	b.sendGo(t, ids)
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 20, ran.Load(), "each resumed step ran once")
}

const killSignalledEnv = "WHARFFLOW_KILL_SIGNALLED"

// TestKillSignalledHelperProcess is the runner TestKill9WithSignalledSteps
// kills: its resumed step writes a marker file named after the instance and
// blocks until the process is killed. It does nothing unless started by
// that test.
func TestKillSignalledHelperProcess(t *testing.T) {
	dir := os.Getenv(killSignalledEnv)
	if dir == "" {
		return
	}
	f := wharfflow.New[counter]("killed", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprint(in.Instance)), []byte("in the resumed step"), 0o600)
			select {} // until kill -9
		})
	runDoomed(t, 0, f)
}

// kill -9 of a runner in the middle of steps that signals leased to it:
// once their leases end, another runner claims each and runs it once, with
// its signal; the awaits, committed, never run again.
func TestKill9WithSignalledSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dir := t.TempDir()
	helper := b.startHelper(t, "TestKillSignalledHelperProcess", killSignalledEnv+"="+dir)

	var waits, gos atomic.Int32
	f := wharfflow.New[counter]("killed", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			waits.Add(1)
			return wharfflow.Fail(fmt.Errorf("the await ran again"))
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			gos.Add(1)
			return wharfflow.Done(in.Signals[0].Payload)
		})
	b.waitRegistered(t, "doomed")
	starts := make([]wharfflow.Start, 5)
	for i := range starts {
		starts[i] = f.Start(counter{}, wharfflow.StartOptions{})
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "awaiting")
	}
	b.sendGo(t, ids)
	require.Eventually(t, func() bool {
		entries, err := os.ReadDir(dir)
		return err == nil && len(entries) == len(ids)
	}, time.Minute, 10*time.Millisecond, "the helper runner never ran the resumed steps")
	var leased int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE id = ANY ($1) AND status = 'running' "+
		"AND lease_owner = 'doomed' AND step = 'go'", ids).Scan(&leased))
	require.Equal(t, len(ids), leased, "the signals leased the instances to the runner that awaited")
	helper.kill9(t)

	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "survivor"})
	for i, id := range ids {
		b.waitStatus(t, id, "done")
		d, err := b.client.Get(ctx, id)
		require.NoError(t, err)
		require.JSONEq(t, fmt.Sprint(i), string(d.Result))
		var runs []string
		for _, s := range d.Steps {
			runs = append(runs, s.Step+"@"+s.Runner)
		}
		require.Equal(t, []string{"wait@doomed", "go@survivor"}, runs)
	}
	require.Zero(t, waits.Load(), "the awaits, committed, never ran again")
	require.EqualValues(t, len(ids), gos.Load(), "each resumed step ran once more")
	require.EqualValues(t, len(ids), r.Stats().Claimed(), "taken over by claims once their leases ended")
}

// A runner killed between the commit of an await that missed a late signal
// and its wake of that instance leaves it awaiting a signal it has. Once
// the dead runner's heartbeat is over by more than its lease, any runner's
// sweep removes its row and checks every awaiting instance once; a runner
// whose heartbeat is current is left alone.
func TestSweepOfADeadRunnerWakesWhatItLeftAwaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := signalFlow("swept", nil)
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}), f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES "+
		"('dead', '1s', now() - interval '1 minute'), ('alive', '1s', now() + interval '1 hour')")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'awaiting', step = 'go', await_signals = '{go}', run_at = 'infinity', "+
		"lease_owner = CASE WHEN id = $1 THEN 'dead' ELSE 'alive' END WHERE id = ANY ($2)", ids[0], ids)
	require.NoError(t, err)
	// The late signals, recorded; nobody woke the instances.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_signals (instance_id, name) SELECT unnest($1::bigint[]), 'go'", ids)
	require.NoError(t, err)

	r, err := wharfflow.NewRunner(b.pool, &wharfflow.Config{Schema: b.schema, Flows: []wharfflow.Definition{f}, Logger: testLogger()})
	require.NoError(t, err)
	wharfflow.SweepDeadRunners(r)
	var runners []string
	rows, err := b.pool.Query(ctx, "SELECT id FROM "+b.schema+".flow_runners ORDER BY id")
	require.NoError(t, err)
	runners, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"alive"}, runners, "the dead runner's row is removed, the live one's kept")
	var status, owner string
	var due bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status, lease_owner, run_at <= now() FROM "+b.schema+".flow_instances WHERE id = $1",
		ids[0]).Scan(&status, &owner, &due))
	require.Equal(t, "awaiting", status)
	require.True(t, due, "the dead runner's instance is due, with its signal, for any runner's claim")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status, lease_owner FROM "+b.schema+".flow_instances WHERE id = $1",
		ids[1]).Scan(&status, &owner))
	require.Equal(t, []string{"running", "alive"}, []string{status, owner}, "the live runner's instance is leased to it")
}

// A runner whose row another runner's sweep removed (its heartbeats came too
// late) registers again with its next heartbeat.
func TestHeartbeatRegistersARemovedRunnerAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := signalFlow("reregistered", nil)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "late", LeaseTTL: 300 * time.Millisecond})
	b.waitRegistered(t, "late")
	_, err := b.pool.Exec(context.Background(), "DELETE FROM "+b.schema+".flow_runners")
	require.NoError(t, err)
	b.waitRegistered(t, "late")
}

// A runner that cannot register (here a trigger refuses its row; in
// production, a role without the right to write flow_runners) still
// listens and runs its flows: signals resume its instances through the
// claim, woken by their notification (the runner's idle sleep, LeaseTTL, is
// longer than the test's wait).
func TestRunnerThatCannotRegisterStillHearsSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE FUNCTION "+b.schema+".refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "+
		"RAISE EXCEPTION 'permission denied for table flow_runners' USING ERRCODE = '42501'; END $$")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "+b.schema+".flow_runners FOR EACH ROW EXECUTE FUNCTION "+b.schema+".refuse()")
	require.NoError(t, err)
	f := signalFlow("unregistered", nil)
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "anonymous", LeaseTTL: 10 * time.Minute})
	ids := b.startAwaiting(t, f, 5)
	b.sendGo(t, ids)
	b.requireDoneWithPayloads(t, ids)
	require.Zero(t, r.Stats().Signalled())
	require.EqualValues(t, 10, r.Stats().Claimed(), "the first steps and the resumed ones were claimed")
}

// padded is a state of a chosen size.
type padded struct {
	N   int    `json:"n"`
	Pad string `json:"pad"`
}

// paddedFlow awaits "go", then checks it resumed with its state whole and
// ends with the signal's payload.
func paddedFlow(name string) *wharfflow.Flow[padded] {
	return wharfflow.New[padded](name, nil).
		Step("wait", func(ctx context.Context, s *padded, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *padded, in wharfflow.Input) wharfflow.Outcome {
			if len(s.Pad) != s.N {
				return wharfflow.Fail(fmt.Errorf("state's pad has %d bytes, want %d", len(s.Pad), s.N))
			}
			if len(in.Signals) != 1 {
				return wharfflow.Fail(fmt.Errorf("received %d signals", len(in.Signals)))
			}
			return wharfflow.Done(in.Signals[0].Payload)
		})
}

// The notification of leased steps names them by id and carries nothing
// else (any role may LISTEN: states and signals stay in the tables), in
// notifications of at most 300 ids that stay under PostgreSQL's 8000-byte
// payload limit (pg_notify fails the signal's transaction above it).
func TestLeaseNotificationsNameTheirStepsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := paddedFlow("named")
	var starts []wharfflow.Start
	for range 700 {
		starts = append(starts, f.Start(padded{N: 20, Pad: strings.Repeat("x", 20)}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	var key int64
	require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES ('ghost', '1 hour', now() + interval '1 hour') RETURNING key").Scan(&key))
	// No runner: the rows as the ghost's awaits would have left them.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'awaiting', step = 'go', await_signals = '{go}', run_at = 'infinity', lease_owner = 'ghost' WHERE id = ANY ($1)", ids)
	require.NoError(t, err)

	listener := b.listen(t)
	b.sendGo(t, ids)

	named := map[int64]bool{}
	notes := 0
	for len(named) < len(ids) {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		note, err := listener.Conn().WaitForNotification(nctx)
		cancel()
		require.NoError(t, err)
		if !strings.HasPrefix(note.Payload, "L") {
			continue
		}
		notes++
		require.Less(t, len(note.Payload), 8000)
		require.NotContains(t, note.Payload, "xxxx", "a notification carries no state")
		_, mine, err := wharfflow.ParseIDs(note.Payload, key+1)
		require.NoError(t, err)
		require.False(t, mine, "not addressed to another runner key")
		got, mine, err := wharfflow.ParseIDs(note.Payload, key)
		require.NoError(t, err)
		require.True(t, mine, "notified to the ghost's key")
		require.LessOrEqual(t, len(got), 300)
		for _, id := range got {
			require.False(t, named[id], "instance %d named twice", id)
			named[id] = true
		}
	}
	require.Equal(t, 3, notes, "700 ids take three notifications")
	for _, id := range ids {
		require.True(t, named[id], "instance %d is named", id)
	}
}

// A signal that leases a step to a runner whose listener is down (the
// database went away before the runner could mark itself deaf, so its row
// still looks alive) notifies nobody. Once the runner listens again it runs
// that step at once, rather than after the step's lease (an hour here).
func TestStepLeasedWhileTheListenerWasDownRunsOnReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	app := "deaf-" + b.schema
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := paddedFlow("unheard")
	b.startRunnerOn(t, pool, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "deaf", LeaseTTL: time.Hour})
	b.waitRegistered(t, "deaf")
	ids, err := b.client.Start(ctx, f.Start(padded{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "awaiting")

	// Hold the runner's row, alive: the runner can neither mark itself
	// deaf nor register again until the signal below has committed.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var key int64
	require.NoError(t, tx.QueryRow(ctx, "UPDATE "+b.schema+".flow_runners SET alive_until = clock_timestamp() + interval '1 hour' WHERE id = 'deaf' RETURNING key").Scan(&key))
	// Drop the runner's connections, its listener's among them.
	rows, err := b.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.NotEmpty(t, pids)
	_, err = b.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", pids)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1)", pids).Scan(&n))
		return n == 0
	}, time.Minute, 5*time.Millisecond, "the runner's connections never went")

	_, err = b.client.SignalTx(ctx, tx, wharfflow.Signal{Instance: ids[0], Name: "go", Payload: json.RawMessage("7")})
	require.NoError(t, err)
	var leasedTo int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT lease_key FROM "+b.schema+".flow_instances WHERE id = $1", ids[0]).Scan(&leasedTo))
	require.Equal(t, key, leasedTo, "leased to the registration whose listener is gone")
	require.NoError(t, tx.Commit(ctx))

	b.waitStatus(t, ids[0], "done")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, "7", string(d.Result))
	require.Equal(t, []string{"wait/0/await", "go/0/done"}, b.history(t, ids[0]))
}

// A signal that cannot resume its instance (its step is running, or it does
// not await the signal yet) notifies the instance's id: to the live runner
// running it, whose write of an await may be in flight, or to every runner
// when none is (a dead runner's, or an instance that is not running: any
// runner may claim it and write its await before the signal commits). In
// notifications of at most 300 ids, each id once.
func TestLateSignalsAreNotifiedToTheRunnerRunningTheirInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := paddedFlow("late-address")
	starts := make([]wharfflow.Start, 700)
	for i := range starts {
		starts[i] = f.Start(padded{}, wharfflow.StartOptions{RunAt: time.Now().Add(time.Hour)})
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	var key int64
	require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES ('ghost', '1 hour', now() + interval '1 hour') RETURNING key").Scan(&key))
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_runners (id, lease, alive_until) VALUES ('gone', '1 hour', now() - interval '1 second')")
	require.NoError(t, err)
	// 350 running on the ghost, 100 on the dead runner, 250 not running.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'running', lease_owner = 'ghost' WHERE id = ANY ($1)", ids[:350])
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'running', lease_owner = 'gone' WHERE id = ANY ($1)", ids[350:450])
	require.NoError(t, err)

	listener := b.listen(t)
	b.sendGo(t, ids)

	toGhost, toAll := map[int64]bool{}, map[int64]bool{}
	ghostNotes := 0
	for len(toGhost)+len(toAll) < len(ids) {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		note, err := listener.Conn().WaitForNotification(nctx)
		cancel()
		require.NoError(t, err)
		if !strings.HasPrefix(note.Payload, "W") {
			continue
		}
		require.Less(t, len(note.Payload), 8000)
		got, forGhost, err := wharfflow.ParseIDs(note.Payload, key)
		require.NoError(t, err)
		_, forAll, err := wharfflow.ParseIDs(note.Payload, 0)
		require.NoError(t, err)
		require.True(t, forGhost || forAll, "every notification is the ghost's or everyone's: %.40s", note.Payload)
		require.LessOrEqual(t, len(got), 300)
		into := toAll
		if forGhost {
			into, ghostNotes = toGhost, ghostNotes+1
		}
		for _, id := range got {
			require.False(t, toGhost[id] || toAll[id], "instance %d notified twice", id)
			into[id] = true
		}
	}
	require.Equal(t, 2, ghostNotes, "350 ids take two notifications")
	for i, id := range ids {
		require.Equal(t, i < 350, toGhost[id], "instance %d (%d): addressed to the ghost only when it runs it", i, id)
	}
}

// A runner runs the steps signals lease to it whether their notification
// carried them or named them only (a state too large to carry: it reads
// them), with the state and the signal whole, and claims none of them.
func TestSignalledStepsRunCarriedOrRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := paddedFlow("carried-or-read")
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "solo"})
	b.waitRegistered(t, "solo")
	var starts []wharfflow.Start
	for i := range 8 {
		n := 100
		if i%2 == 1 {
			n = 5000
		}
		starts = append(starts, f.Start(padded{N: n, Pad: strings.Repeat("y", n)}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(context.Background(), starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "awaiting")
	}
	claimed := r.Stats().Claimed()
	b.sendGo(t, ids)
	b.requireDoneWithPayloads(t, ids)
	require.EqualValues(t, 8, r.Stats().Signalled(), "every resumed step was leased by its signal")
	require.Equal(t, claimed, r.Stats().Claimed(), "no resumed step was claimed")
}
