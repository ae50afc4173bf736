package wharfflow_test

import (
	"context"
	"fmt"
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

// holdQueryEnd is a pgx query tracer that, once armed, holds the end of the
// first query whose SQL contains match and that returned at least minRows
// rows: the statement has committed (autocommit) and its rows are read, but
// the caller has not got them yet. It stands for the time a runner takes
// between a statement's commit and acting on its rows (network, a trace
// context read, a scheduler delay on a loaded machine).
type holdQueryEnd struct {
	match   string
	minRows int64
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

type holdKey struct{}

func newHoldQueryEnd(match string, minRows int64) *holdQueryEnd {
	return &holdQueryEnd{match: match, minRows: minRows, held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdQueryEnd) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, h.match) {
		return context.WithValue(ctx, holdKey{}, true)
	}
	return ctx
}

func (h *holdQueryEnd) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(holdKey{}) == nil || d.Err != nil || d.CommandTag.RowsAffected() < h.minRows {
		return
	}
	if h.armed.CompareAndSwap(true, false) {
		close(h.held)
		<-h.release
	}
}

// Trusting a channel anyone can write; two of the same (found by the review of the flows rework, A2).
//
// H4's fix makes a lease notification a hint: the runner runs a step named
// by 'L<key> <id>' once flow_leased_steps confirms that the database leased
// it to this runner. But the database also confirms leases the runner took
// by its own claims (and outcome writes) whose rows it has not acted on yet:
// between claim_flow_steps's commit and claimLoop's run (and between
// complete_flow_steps's commit and release), a confirmed row is in neither
// inflight nor ran. admitLeased then runs it, and claimLoop runs it again:
// the same step, same token, same idempotency key, executed twice at once by
// one runner. Any role that can connect can send the notification (runner
// keys are small sequential integers, instance ids sequential; a loop of
// NOTIFYs naming 300 ids each hits whatever falls in the window).
//
// Rows a claim returns with await_signals (and so confirmable by
// flow_leased_steps) are ordinary: any awaiting instance with a concurrency
// or rate key that a signal resumed (signals lease only keyless instances;
// keyed ones go through the claim), or one whose runner died.
//
// The window is made to last with a pgx tracer on the runner's pool that
// holds the end of the claim that returned the instance (its rows are read,
// the claim committed). Fixed: the step runs once: flow_leased_steps
// confirms only what a signal leased to the registration the notification
// names (lease_key), never a claim's lease.
func TestForgedLeaseNotificationDoesNotRunAClaimedStepTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	ranOnce := make(chan struct{}, 10)
	f := wharfflow.New[counter]("keyedwait", nil).
		Step("wait", func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			runs[in.IdempotencyKey]++
			mu.Unlock()
			ranOnce <- struct{}{}
			return wharfflow.Done(nil)
		})

	hold := newHoldQueryEnd("claim_flow_steps", 2) // the instance's row and the id-0 row
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.Tracer = hold
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	runner := b.startRunnerOn(t, pool, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "victim", MaxInFlight: 4})
	b.waitRegistered(t, "victim")
	key := runnerKey(t, b, "victim")
	attacker := nobody(t, b)

	ids, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "tenant-1"}}))
	require.NoError(t, err)
	id := ids[0]
	b.waitStatus(t, id, "awaiting")

	hold.armed.Store(true)
	_, err = b.client.Send(ctx, wharfflow.Signal{Instance: id, Name: "go"})
	require.NoError(t, err)
	select {
	case <-hold.held:
	case <-time.After(time.Minute):
		t.Fatal("the runner never claimed the signalled instance")
	}
	var owner string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status || ' ' || lease_owner FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&owner))
	require.Equal(t, "running victim", owner, "the claim committed its lease")

	_, err = attacker.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d %d", key, id))
	require.NoError(t, err)
	// The forged notification makes the runner run the step (confirmed by
	// flow_leased_steps: it is leased to the runner), or, once fixed, it
	// runs nothing: either way the runner reads it. Wait until it has run
	// the step or the notification's read is done (Signalled counts what
	// admitLeased ran; the claim loop is held, so nothing else runs it).
	select {
	case <-ranOnce:
	case <-time.After(5 * time.Second):
		// Fixed builds: nothing ran from the notification.
	}
	close(hold.release)
	b.waitStatus(t, id, "done")
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, runner.Stop(stopCtx)) // every step goroutine has returned

	mu.Lock()
	defer mu.Unlock()
	t.Logf("runs by idempotency key: %v; signalled %d, claimed %d", runs, runner.Stats().Signalled(), runner.Stats().Claimed())
	require.Equal(t, map[string]int{fmt.Sprintf("%d/go/0", id): 1}, runs,
		"one forged NOTIFY made the runner execute a step it had claimed a second time")
}

// The same through the outcome write's window (A2b). An await whose
// signal came first is leased back to its runner by complete_flow_steps
// ('await' row) and run by release; a forged 'L' read between the write's
// commit and release is confirmed by flow_leased_steps, and admitLeased,
// finding the step that wrote the await still in inflight with an older
// token, takes its slot and runs the resumed step; release then runs it
// again from wr.resumed without looking at inflight. Fixed: the step runs
// once (flow_leased_steps does not confirm a write's lease, and release
// skips a resumed step the runner already runs).
func TestForgedLeaseNotificationDoesNotRunAResumedAwaitTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	ranOnce := make(chan struct{}, 10)
	waiting, signalled := make(chan int64, 1), make(chan struct{})
	f := wharfflow.New[counter]("selfsignal", nil).
		Step("wait", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome {
			waiting <- in.Instance
			<-signalled // the signal commits before this await is written
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			runs[in.IdempotencyKey]++
			mu.Unlock()
			ranOnce <- struct{}{}
			return wharfflow.Done(nil)
		})

	hold := newHoldQueryEnd("complete_flow_steps", 3) // 'applied', 'await', 'due'
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.Tracer = hold
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	runner := b.startRunnerOn(t, pool, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "victim", MaxInFlight: 4})
	b.waitRegistered(t, "victim")
	key := runnerKey(t, b, "victim")
	attacker := nobody(t, b)

	_, err = b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	id := <-waiting
	_, err = b.client.Send(ctx, wharfflow.Signal{Instance: id, Name: "go"})
	require.NoError(t, err)
	hold.armed.Store(true)
	close(signalled)
	select {
	case <-hold.held:
	case <-time.After(time.Minute):
		t.Fatal("the await's write never leased the instance back")
	}
	var owner string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status || ' ' || lease_owner || ' ' || step FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&owner))
	require.Equal(t, "running victim go", owner, "the write committed the lease back")

	_, err = attacker.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d %d", key, id))
	require.NoError(t, err)
	select {
	case <-ranOnce:
	case <-time.After(5 * time.Second):
		// Fixed builds: nothing ran from the notification.
	}
	close(hold.release)
	b.waitStatus(t, id, "done")
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, runner.Stop(stopCtx))

	mu.Lock()
	defer mu.Unlock()
	t.Logf("runs by idempotency key: %v; signalled %d", runs, runner.Stats().Signalled())
	require.Equal(t, map[string]int{fmt.Sprintf("%d/go/0", id): 1}, runs,
		"one forged NOTIFY made the runner execute a step its own write leased back a second time")
}
