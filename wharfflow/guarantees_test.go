package wharfflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

type counter struct {
	N int `json:"n"`
}

// Every step's outcome (state, next step, emitted message, history) commits
// once: three steps per instance, across two runners, give three history
// rows, three messages and a state counted to three.
func TestOutcomeCommitsOnceWithItsMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	emit := func(in wharfflow.Input) wharf.Message {
		return wharf.Message{Topic: "steps", Key: fmt.Sprint(in.Instance), Payload: []byte(in.IdempotencyKey)}
	}
	f := wharfflow.New[counter]("three", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			s.N++
			return wharfflow.Next("b").Emit(emit(in))
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			s.N++
			return wharfflow.Next("c").Emit(emit(in))
		}).
		Step("c", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			s.N++
			return wharfflow.Done(s.N).Emit(emit(in))
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 8})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 8})
	var starts []wharfflow.Start
	for range 40 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	for _, id := range ids {
		require.Equal(t, []string{"a/0/next", "b/0/next", "c/0/done"}, b.history(t, id))
		var n int
		var state []byte
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox WHERE key = $1", fmt.Sprint(id)).Scan(&n))
		require.Equal(t, 3, n, "instance %d: one message per step", id)
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT state FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&state))
		require.JSONEq(t, `{"n": 3}`, string(state))
	}
	var distinct int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(DISTINCT payload) FROM "+b.schema+".outbox").Scan(&distinct))
	require.Equal(t, 3*len(ids), distinct)
}

// When the outbox refuses an outcome's messages, nothing of the outcome
// commits: the instance fails alone with the reason (its state as it was,
// no message), and once the cause is gone a retry runs the step again.
func TestOutcomeRollsBackWithItsMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "ALTER TABLE "+b.schema+".outbox ADD CONSTRAINT no_poison CHECK (topic <> 'poison')")
	require.NoError(t, err)
	var runs atomic.Int32
	f := wharfflow.New[counter]("atomic", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			runs.Add(1)
			s.N = 7
			return wharfflow.Next("b").Emit(wharf.Message{Topic: "poison"})
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(s.N)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, LeaseTTL: time.Second})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "failed")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, "a", d.Step)
	require.Contains(t, d.Error, "no_poison")
	require.JSONEq(t, `{"n": 0}`, string(d.State))
	require.Equal(t, []string{"a/0/fail"}, b.history(t, ids[0]))
	require.EqualValues(t, 1, runs.Load())
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	require.Zero(t, n)

	_, err = b.pool.Exec(ctx, "ALTER TABLE "+b.schema+".outbox DROP CONSTRAINT no_poison")
	require.NoError(t, err)
	require.NoError(t, b.client.Retry(ctx, ids[0]))
	b.waitStatus(t, ids[0], "done")
	require.Equal(t, []string{"a/0/fail", "a/0/next", "b/0/done"}, b.history(t, ids[0]))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	require.Equal(t, 1, n)
}

// Three runners on one set of instances: no instance ever has two steps
// running at once, and every step runs exactly once.
func TestNoTwoRunnersRunOneInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	running := map[int64]bool{}
	var overlaps, total atomic.Int32
	step := func(next string) wharfflow.StepFunc[counter] {
		return func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			if running[in.Instance] {
				overlaps.Add(1)
			}
			running[in.Instance] = true
			mu.Unlock()
			runtime.Gosched()
			total.Add(1)
			s.N++
			mu.Lock()
			delete(running, in.Instance)
			mu.Unlock()
			if next == "" {
				return wharfflow.Done(nil)
			}
			return wharfflow.Next(next)
		}
	}
	f := wharfflow.New[counter]("excl", nil).Step("s1", step("s2")).Step("s2", step("s3")).Step("s3", step("s4")).Step("s4", step(""))
	for range 3 {
		b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 16})
	}
	var starts []wharfflow.Start
	for range 60 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	require.Zero(t, overlaps.Load())
	require.EqualValues(t, 4*len(ids), total.Load(), "every step ran once")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_steps").Scan(&n))
	require.Equal(t, 4*len(ids), n)
}

// A runner whose lease was taken over (it expired, another runner claimed
// the step) commits nothing: not its state, not its next step, not its
// messages.
func TestLostLeaseCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered := make(chan struct{})
	release := make(chan struct{})
	slow := wharfflow.New[counter]("lease", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			close(entered)
			<-release
			s.N = 100
			return wharfflow.Next("b").Emit(wharf.Message{Topic: "from-a"})
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done("a")
		})
	fast := wharfflow.New[counter]("lease", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			s.N = 1
			return wharfflow.Done("b")
		})
	// One slot, busy with the blocked step: A cannot claim the step again itself.
	ra := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{slow}, LeaseTTL: 3 * time.Second, MaxInFlight: 1})
	ids, err := b.client.Start(ctx, slow.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	<-entered
	// The lease ends (as if runner A had paused past it).
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET run_at = clock_timestamp() - interval '1 second' WHERE id = $1", ids[0])
	require.NoError(t, err)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{fast}})
	b.waitStatus(t, ids[0], "done")
	close(release)
	require.Eventually(t, func() bool { return ra.Stats().Lost() == 1 }, time.Minute, 10*time.Millisecond)

	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, `"b"`, string(d.Result))
	require.JSONEq(t, `{"n": 1}`, string(d.State))
	require.Len(t, d.Steps, 1)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	require.Zero(t, n, "the message of the outcome that lost its lease was not enqueued")
	require.Zero(t, ra.Stats().Steps())
}

// A step scheduled for a time never runs before it; neither does a start
// with RunAt.
func TestScheduledStepsNeverRunEarly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type sched struct {
		At time.Time `json:"at"`
	}
	var early atomic.Int32
	f := wharfflow.New[sched]("sched", nil).
		Step("a", func(ctx context.Context, s *sched, in wharfflow.Input) wharfflow.Outcome {
			if time.Now().Before(s.At) {
				early.Add(1)
			}
			s.At = time.Now().Add(300 * time.Millisecond)
			return wharfflow.NextAt("b", s.At)
		}).
		Step("b", func(ctx context.Context, s *sched, in wharfflow.Input) wharfflow.Outcome {
			if time.Now().Before(s.At) {
				early.Add(1)
			}
			return wharfflow.Done(nil)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	at := time.Now().Add(200 * time.Millisecond)
	var starts []wharfflow.Start
	for range 10 {
		starts = append(starts, f.Start(sched{At: at}, wharfflow.StartOptions{RunAt: at}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	require.Zero(t, early.Load())
}

// A failing step is retried with growing delays, then its instance fails
// with the last error; retried by an operator it runs the failed step again.
func TestRetriesBackOffThenFailThenRetryFromFailedStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var healthy atomic.Bool
	f := wharfflow.New[counter]("flaky", &wharfflow.FlowConfig{MaxAttempts: 3, RetryBackoff: 40 * time.Millisecond}).
		Step("first", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Next("flaky")
		}).
		Step("flaky", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if !healthy.Load() {
				return wharfflow.Retry(fmt.Errorf("upstream down (attempt %d)", in.Attempt))
			}
			return wharfflow.Done(in.Attempt)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "failed")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, "flaky", d.Step)
	require.Equal(t, "attempt 3 of 3: upstream down (attempt 2)", d.Error)
	require.Equal(t, []string{"first/0/next", "flaky/1/retry", "flaky/2/retry", "flaky/2/fail"}, b.history(t, ids[0]))
	// Backoff: equal jitter draws the n-th delay from [base*2^(n-1)/2, base*2^(n-1)].
	s := d.Steps
	require.GreaterOrEqual(t, s[2].StartedAt.Sub(s[1].FinishedAt), 20*time.Millisecond)
	require.GreaterOrEqual(t, s[3].StartedAt.Sub(s[2].FinishedAt), 40*time.Millisecond)

	healthy.Store(true)
	require.NoError(t, b.client.Retry(ctx, ids[0]))
	b.waitStatus(t, ids[0], "done")
	d, err = b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, "0", string(d.Result), "the failed step ran again from attempt 0")
	require.Equal(t, "flaky", d.Steps[len(d.Steps)-1].Step)
	require.ErrorIs(t, b.client.Retry(ctx, ids[0]), wharfflow.ErrNoInstance, "a done instance cannot be retried")
}

// Cancelling a parent cancels its children (and theirs).
func TestCancelParentCancelsChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	child := wharfflow.New[counter]("child", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("never", "never")
		}).
		Step("never", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	parent := wharfflow.New[counter]("parent", nil).
		Step("fan", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("join", child.Child(counter{}, wharfflow.Options{}), child.Child(counter{}, wharfflow.Options{}),
				child.Child(counter{}, wharfflow.Options{}))
		}).
		Step("join", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}})
	ids, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE parent_id = $1 AND status = 'awaiting'", ids[0]).Scan(&n))
		return n == 3
	}, time.Minute, 10*time.Millisecond)
	n, err := b.client.Cancel(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, 4, n)
	var statuses []string
	rows, err := b.pool.Query(ctx, "SELECT status FROM "+b.schema+".flow_instances ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		statuses = append(statuses, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"cancelled", "cancelled", "cancelled", "cancelled"}, statuses)
	_, err = b.client.Cancel(ctx, ids[0])
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)
}

// Instances that ended before the retention are deleted in batches, with
// their children, signals and history; failed and recent ones stay.
func TestRetentionCleanupInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	child := wharfflow.New[counter]("kid", nil).
		Step("k", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	f := wharfflow.New[counter]("short", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if s.N < 0 {
				return wharfflow.Fail(errors.New("asked to fail"))
			}
			return wharfflow.Spawn("b", child.Child(counter{}, wharfflow.Options{}))
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, child}})
	var starts []wharfflow.Start
	for range 5 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	starts = append(starts, f.Start(counter{N: -1}, wharfflow.StartOptions{}), f.Start(counter{}, wharfflow.StartOptions{}))
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids[:5] {
		b.waitStatus(t, id, "done")
	}
	b.waitStatus(t, ids[5], "failed")
	b.waitStatus(t, ids[6], "done")
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET finished_at = now() - interval '2 days' WHERE id <> $1", ids[6])
	require.NoError(t, err)
	// A signal for every instance, children included (signals of ended
	// instances, as if sent while they ran): the tables have no foreign
	// keys, so cleanup must delete them itself.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_signals (instance_id, name) SELECT id, 'late' FROM "+b.schema+".flow_instances")
	require.NoError(t, err)
	n, err := wharfflow.Cleanup(ctx, b.pool, b.schema, time.Now().Add(-24*time.Hour), 2)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	var left, steps int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE parent_id IS NULL").Scan(&left))
	require.Equal(t, 2, left, "the failed and the recent instance stay")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances").Scan(&left))
	require.Equal(t, 3, left, "children went with their parents")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_steps WHERE instance_id = ANY($1)", ids[:5]).Scan(&steps))
	require.Zero(t, steps)
	var orphans, kept int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_steps s WHERE NOT EXISTS (SELECT 1 FROM "+
		b.schema+".flow_instances i WHERE i.id = s.instance_id)").Scan(&orphans))
	require.Zero(t, orphans, "the children's history went with them")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals s WHERE NOT EXISTS (SELECT 1 FROM "+
		b.schema+".flow_instances i WHERE i.id = s.instance_id)").Scan(&orphans))
	require.Zero(t, orphans, "signals went with their instances")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals").Scan(&kept))
	require.Equal(t, 3, kept, "the signals of the instances that stay are kept")
}

type paid struct {
	Got []string `json:"got"`
}

// A signal sent before its await is kept and resumes the await at once; a
// second signal with the same dedup key is not recorded again.
func TestSignalBeforeAwaitIsKeptAndDeduplicated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered := make(chan struct{})
	release := make(chan struct{})
	f := wharfflow.New[paid]("pay", nil).
		Step("prepare", func(ctx context.Context, s *paid, in wharfflow.Input) wharfflow.Outcome {
			close(entered)
			<-release
			return wharfflow.Await("paid", "paid", "refused")
		}).
		Step("paid", func(ctx context.Context, s *paid, in wharfflow.Input) wharfflow.Outcome {
			for _, sg := range in.Signals {
				s.Got = append(s.Got, sg.Name+":"+string(sg.Payload))
			}
			return wharfflow.Done(s.Got)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	ids, err := b.client.Start(ctx, f.Start(paid{}, wharfflow.StartOptions{Key: "order-9"}))
	require.NoError(t, err)
	again, err := b.client.Start(ctx, f.Start(paid{}, wharfflow.StartOptions{Key: "order-9"}))
	require.NoError(t, err)
	require.Equal(t, ids, again, "the correlation key dedups starts while the instance is active")
	<-entered
	s1, err := b.client.Send(ctx, wharfflow.Signal{Flow: "pay", Key: "order-9", Name: "paid", Payload: 42, DedupKey: "evt-1"})
	require.NoError(t, err)
	s2, err := b.client.Send(ctx, wharfflow.Signal{Instance: ids[0], Name: "paid", Payload: 42, DedupKey: "evt-1"})
	require.NoError(t, err)
	require.Equal(t, s1, s2)
	close(release)
	b.waitStatus(t, ids[0], "done")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, `["paid:42"]`, string(d.Result))
	require.Len(t, d.Signals, 1)
	require.NotNil(t, d.Signals[0].ConsumedAt)
	require.Equal(t, "paid", d.Signals[0].ConsumedStep)

	_, err = b.client.Send(ctx, wharfflow.Signal{Flow: "pay", Key: "order-9", Name: "paid"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance, "no active instance once done")
	// Done, the key is free again.
	next, err := b.client.Start(ctx, f.Start(paid{}, wharfflow.StartOptions{Key: "order-9"}))
	require.NoError(t, err)
	require.NotEqual(t, ids, next)
}

// An await whose deadline passes runs its timeout step at the deadline, not
// before.
func TestAwaitDeadlineRunsTimeoutStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type st struct {
		Deadline time.Time `json:"deadline"`
		Late     bool      `json:"late"`
	}
	f := wharfflow.New[st]("deadline", nil).
		Step("wait", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			s.Deadline = time.Now().Add(300 * time.Millisecond)
			return wharfflow.Await("got", "ping").Deadline(s.Deadline, "timeout")
		}).
		Step("got", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome { return wharfflow.Done("got") }).
		Step("timeout", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(!time.Now().Before(s.Deadline))
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	ids, err := b.client.Start(ctx, f.Start(st{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "done")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, "true", string(d.Result), "the timeout step ran at or after the deadline")
}

// Starts and signals from database/sql transactions and from SQL.
func TestStartAndSignalFromSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[paid]("sqlflow", nil).
		Step("start", func(ctx context.Context, s *paid, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("resume", "go")
		}).
		Step("resume", func(ctx context.Context, s *paid, in wharfflow.Input) wharfflow.Outcome {
			var v map[string]string
			_ = json.Unmarshal(in.Signals[0].Payload, &v)
			return wharfflow.Done(v["from"])
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	var id int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+".start_flow('sqlflow', '{}', 'k-sql')").Scan(&id))
	b.waitStatus(t, id, "awaiting")
	var sig int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+`.signal('sqlflow', 'k-sql', 'go', '{"from": "sql"}')`).Scan(&sig))
	b.waitStatus(t, id, "done")
	d, err := b.client.Get(ctx, id)
	require.NoError(t, err)
	require.JSONEq(t, `"sql"`, string(d.Result))

	db := openSQL(t)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	sqlIDs, err := b.client.StartSQLTx(ctx, tx, f.Start(paid{}, wharfflow.StartOptions{Key: "k-db"}))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.waitStatus(t, sqlIDs[0], "awaiting")
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = b.client.SignalSQLTx(ctx, tx, wharfflow.Signal{Flow: "sqlflow", Key: "k-db", Name: "go", Payload: map[string]string{"from": "database/sql"}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.waitStatus(t, sqlIDs[0], "done")
	d, err = b.client.Get(ctx, sqlIDs[0])
	require.NoError(t, err)
	require.JSONEq(t, `"database/sql"`, string(d.Result))

	// A rolled-back start starts nothing.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = b.client.StartSQLTx(ctx, tx, f.Start(paid{}, wharfflow.StartOptions{Key: "k-rolled-back"}))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE correlation_key = 'k-rolled-back'").Scan(&n))
	require.Zero(t, n)
}

// A stopped runner leaves no step leased to itself: steps it ran finished
// with their outcomes written, steps chained on their lease were handed
// back, so another runner goes on at once rather than after the lease.
func TestStopLeavesNoLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	f := wharfflow.New[counter]("chain", nil).
		Step("loop", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			ran.Add(1)
			s.N++
			if s.N == 100 {
				return wharfflow.Done(s.N)
			}
			return wharfflow.Next("loop")
		})
	a, err := wharfflow.NewRunner(b.pool, &wharfflow.Config{Schema: b.schema, Flows: []wharfflow.Definition{f}, RunnerID: "a", Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	var starts []wharfflow.Start
	for range 10 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ran.Load() > 50 }, time.Minute, time.Millisecond)
	require.NoError(t, a.Stop(ctx))
	var held int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE lease_owner = 'a'").Scan(&held))
	require.Zero(t, held)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "b"})
	for _, id := range ids {
		b.waitStatus(t, id, "done")
		d, err := b.client.Get(ctx, id)
		require.NoError(t, err)
		require.JSONEq(t, "100", string(d.Result), "no step ran twice, none was skipped")
		require.Len(t, d.Steps, 100)
	}
}

// A signal that commits after the outcome writing its await looked for
// signals (its own wake found the instance still running) is not left
// waiting: its notification makes a runner check the instance.
func TestSignalCommittedAfterTheAwaitWakesByNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("late", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(len(in.Signals))
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "awaiting")
	// The signal row as that race leaves it: recorded, the instance not woken.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.schema+".flow_signals (instance_id, name) VALUES ($1, 'go')", ids[0])
	require.NoError(t, err)
	require.Equal(t, "awaiting", b.status(t, ids[0]))
	_, err = b.pool.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprint("W0 ", ids[0]))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "done")
	d, err := b.client.Get(ctx, ids[0])
	require.NoError(t, err)
	require.JSONEq(t, "1", string(d.Result))
}

// One signal_flows call records a batch: a dedup key repeated within the
// batch is recorded once (both get the first one's id), signals without a
// dedup key are each recorded, an unknown instance gets no id; an instance
// that awaits the signal is woken in the call, and only the instances it
// could not wake (not awaiting the signal yet) get their id notified, for a
// runner to check once the signal is committed.
func TestSignalBatchDedupsWakesAndNotifiesTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("batch", nil).Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Await("go", "go")
	})
	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}), f.Start(counter{}, wharfflow.StartOptions{}),
		f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	awaitA, awaitB, running := ids[0], ids[1], ids[2]
	// No runner: the test sets the statuses a runner would have written.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'awaiting', await_signals = '{go}', run_at = 'infinity' WHERE id = ANY ($1)",
		[]int64{awaitA, awaitB})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".flow_instances SET status = 'running', run_at = now() + interval '1 hour' WHERE id = $1", running)
	require.NoError(t, err)

	listener := b.listen(t)

	got, err := b.client.Send(ctx,
		wharfflow.Signal{Instance: awaitA, Name: "go", DedupKey: "k"},
		wharfflow.Signal{Instance: awaitA, Name: "go", DedupKey: "k"},
		wharfflow.Signal{Instance: awaitB, Name: "go"},
		wharfflow.Signal{Instance: awaitB, Name: "go"},
		wharfflow.Signal{Instance: running, Name: "go"})
	require.NoError(t, err)
	require.Len(t, got, 5)
	require.Equal(t, got[0], got[1], "a dedup key repeated in the batch is recorded once")
	require.NotEqual(t, got[2], got[3], "signals without a dedup key are each recorded")
	require.Len(t, map[int64]bool{got[0]: true, got[2]: true, got[3]: true, got[4]: true}, 4)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals").Scan(&n))
	require.Equal(t, 4, n)
	_, err = b.client.Send(ctx, wharfflow.Signal{Instance: 1 << 40, Name: "go"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)

	rows, err := b.pool.Query(ctx, "SELECT id FROM "+b.schema+".flow_instances WHERE status = 'awaiting' AND run_at <= now() ORDER BY id")
	require.NoError(t, err)
	due, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{awaitA, awaitB}, due, "the awaiting instances are woken by the call")

	// The notifications of the first call's commit: one to wake claimers,
	// and the id of the instance it could not wake only, to every runner
	// (no live runner runs it).
	var payloads []string
	for len(payloads) < 2 {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		note, err := listener.Conn().WaitForNotification(nctx)
		cancel()
		require.NoError(t, err)
		payloads = append(payloads, note.Payload)
	}
	require.ElementsMatch(t, []string{"", fmt.Sprint("W0 ", running)}, payloads)
}
