package wharfflow_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// queryCounter counts the statements a pool sends (BEGIN and COMMIT
// included: pgx sends them as queries).
type queryCounter struct{ n atomic.Int64 }

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
	cfg := b.pool.Config()
	queries := &queryCounter{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	client, err := wharfflow.NewClient(pool, b.schema)
	require.NoError(t, err)
	require.NoError(t, pool.Ping(ctx)) // connect (and its own queries) before counting

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
	require.ErrorContains(t, err, "signal 1 (go) to instance 1099511627776")
	require.Equal(t, int64(1), queries.n.Load()-n0, "Send is one statement, failed or not")
	_, err = client.Send(ctx, wharfflow.Signal{Instance: ids[1], Name: "go"},
		wharfflow.Signal{Flow: "send", Key: "order-2", Name: "go"})
	require.ErrorIs(t, err, wharfflow.ErrNoInstance)
	require.ErrorContains(t, err, `signal 1 (go) to flow send key "order-2"`)
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
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
}
