package wharfflow_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// queryCounter counts the statements a pool sends (BEGIN and COMMIT
// included: pgx sends them as queries).
type queryCounter struct{ n atomic.Int64 }

// countedPool is a pool on the bundle's database whose statements queries
// counts, connected before it returns (so its own queries are not).
func (b *testBundle) countedPool(t *testing.T) (*pgxpool.Pool, *queryCounter) {
	t.Helper()
	cfg := b.pool.Config()
	queries := &queryCounter{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(context.Background()))
	return pool, queries
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Start and Send outside the caller's transaction are one statement each,
// one round trip (they were BEGIN, the call and COMMIT), and Send stays all
// or nothing: a batch with one signal to no active instance records none of
// them and names that signal, by instance or by flow and key.
func TestStartAndSendAreOneRoundTripAndSendIsAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool, queries := b.countedPool(t)
	client, err := wharfflow.NewClient(pool, b.schema)
	require.NoError(t, err)

	f := wharfflow.New[counter]("send", nil).Step("wait", func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Await("done", "go")
	})
	n0 := queries.n.Load()
	ids, err := client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Key: "order-1"}), f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Len(t, ids, 2)
	require.Equal(t, int64(1), queries.n.Load()-n0, "Start is one statement")

	n0 = queries.n.Load()
	_, err = client.Send(ctx, wharfflow.Signal{Instance: ids[0], Name: "go", DedupKey: "a"},
		wharfflow.Signal{Instance: 1 << 40, Name: "go"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)
	require.EqualError(t, err, "wharfflow: signal 1 (go): there is no instance 1099511627776")
	require.Equal(t, int64(1), queries.n.Load()-n0, "Send is one statement, failed or not")
	_, err = client.Send(ctx, wharfflow.Signal{Instance: ids[1], Name: "go"},
		wharfflow.Signal{Flow: "send", Key: "order-2", Name: "go"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)
	require.EqualError(t, err, `wharfflow: signal 1 (go): flow send has no active instance with key "order-2"`)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals").Scan(&n))
	require.Zero(t, n, "a failed Send records none of its signals")

	n0 = queries.n.Load()
	got, err := client.Send(ctx, wharfflow.Signal{Instance: ids[1], Name: "go"},
		wharfflow.Signal{Flow: "send", Key: "order-1", Name: "go"})
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, int64(1), queries.n.Load()-n0, "Send is one statement")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals").Scan(&n))
	require.Equal(t, 2, n)

	// Inside the caller's transaction a signal to no active instance still
	// fails the call, not the transaction: the caller decides.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.client.SignalTx(ctx, tx, wharfflow.Signal{Instance: 1 << 40, Name: "go"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)
	require.EqualError(t, err, "wharfflow: signal go: instance 1099511627776 is not active (it ended, or there is none)")
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
}

// A runner batches: its claims lease many steps at once, its outcome
// writes carry many outcomes, and a step a signal resumes comes in the
// signal's notification. So 1,000 three-step flows started before it, or
// 1,000 flows awaiting a signal sent in one batch, cost it a small fraction
// of a statement per step, every statement it sends counted (claims,
// outcome writes, reads of leased steps, wakes, listening, registering,
// heartbeats). A runner that wrote each outcome on its own, or read each
// resumed step, would send at least one per step.
func TestRunnerSendsAFractionOfAStatementPerStep(t *testing.T) {
	t.Parallel()
	next := func(step string) wharfflow.StepFunc[counter] {
		return func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome {
			if step == "" {
				return wharfflow.Done(nil)
			}
			return wharfflow.Next(step)
		}
	}
	for _, tc := range []struct {
		name   string
		flow   *wharfflow.Flow[counter]
		steps  int
		signal bool
	}{
		{"three steps", wharfflow.New[counter]("batched", nil).Step("a", next("b")).Step("b", next("c")).Step("c", next("")), 3, false},
		{"await a signal", wharfflow.New[counter]("signalled", nil).
			Step("a", func(context.Context, *counter, wharfflow.Input) wharfflow.Outcome { return wharfflow.Await("b", "go") }).
			Step("b", next("")), 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			starts := make([]wharfflow.Start, 1000)
			for i := range starts {
				starts[i] = tc.flow.Start(counter{}, wharfflow.StartOptions{})
			}
			ids, err := b.client.Start(ctx, starts...)
			require.NoError(t, err)

			pool, queries := b.countedPool(t)
			b.startRunnerOn(t, pool, wharfflow.Config{Flows: []wharfflow.Definition{tc.flow}, RunnerID: "counted"})
			count := func(status string) func() bool {
				return func() bool {
					var n int
					require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE status = $1", status).Scan(&n))
					return n == len(ids)
				}
			}
			if tc.signal {
				require.Eventually(t, count("awaiting"), time.Minute, 10*time.Millisecond, "the flows never all awaited")
				b.waitRegistered(t, "counted")
				sigs := make([]wharfflow.Signal, len(ids))
				for i, id := range ids {
					sigs[i] = wharfflow.Signal{Instance: id, Name: "go"}
				}
				_, err := b.client.Send(ctx, sigs...)
				require.NoError(t, err)
			}
			require.Eventually(t, count("done"), time.Minute, 10*time.Millisecond, "the flows never all ended")
			perStep := float64(queries.n.Load()) / float64(tc.steps*len(ids))
			t.Logf("%d statements for %d steps: %.3f per step", queries.n.Load(), tc.steps*len(ids), perStep)
			require.Less(t, perStep, 0.2, "statements per step")
		})
	}
}
