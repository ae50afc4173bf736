package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Messages enqueued inside savepoints of a transaction that commits after
// later transactions were read: the released savepoint's messages are
// delivered (late, before the key's later message), the rolled-back
// savepoint's never are. The rows of a subtransaction carry its own xmin, but
// the relay tracks the top-level transaction, whose commit makes them visible.
func TestLateCommitWithSavepoints(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// A top-level xid first, as an application's own writes would take.
	before, err := client.EnqueueTx(ctx, tx, wharf.Message{Topic: "t", Key: "K", Payload: []byte(`"top"`)})
	require.NoError(t, err)
	sp1, err := tx.Begin(ctx) // SAVEPOINT
	require.NoError(t, err)
	kept, err := client.EnqueueTx(ctx, sp1, wharf.Message{Topic: "t", Key: "K", Payload: []byte(`"kept"`)})
	require.NoError(t, err)
	require.NoError(t, sp1.Commit(ctx)) // RELEASE SAVEPOINT
	sp2, err := tx.Begin(ctx)
	require.NoError(t, err)
	undone, err := client.EnqueueTx(ctx, sp2, wharf.Message{Topic: "t", Key: "K", Payload: []byte(`"undone"`)})
	require.NoError(t, err)
	require.NoError(t, sp2.Rollback(ctx)) // ROLLBACK TO SAVEPOINT
	// A savepoint left open at commit: its work commits with the transaction.
	sp3, err := tx.Begin(ctx)
	require.NoError(t, err)
	nested, err := client.EnqueueTx(ctx, sp3, wharf.Message{Topic: "t", Key: "K2", Payload: []byte(`"nested"`)})
	require.NoError(t, err)

	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	// Later transactions commit and are delivered while tx is open.
	others, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "other", Payload: []byte(`"o"`)})
	require.NoError(t, err)
	waitDelivered(t, rec, others...)

	require.NoError(t, tx.Commit(ctx))
	want := append(append(append([]string{}, before...), kept...), nested...)
	waitDelivered(t, rec, want...)
	after, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "K", Payload: []byte(`"after"`)})
	require.NoError(t, err)
	waitDelivered(t, rec, after...)

	got := rec.snapshot()
	requireKeyOrder(t, got)
	for _, m := range got {
		require.NotEqual(t, undone[0], m.ID, "a rolled-back savepoint's message was delivered")
	}
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond,
		"delivered rows are removed")
}

// A prepared transaction (two-phase commit) holds its xid in every snapshot
// until COMMIT PREPARED, possibly long after the session that prepared it is
// gone: its messages are delivered once it commits, after later transactions
// were read; a ROLLBACK PREPARED transaction's messages never are.
func TestLateCommitOfPreparedTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"max_prepared_transactions": "10"}})
	require.NoError(t, err)
	defer func() { _ = cluster.Stop() }()
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	defer pool.Close()
	m, err := wharfmigrate.New("wharf")
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)

	rec := &recorder{}
	cfg := testConfig("wharf")
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(pool, cfg)
	require.NoError(t, err)

	prepare := func(gid, key string) []string {
		conn, err := pgx.Connect(ctx, cluster.URL())
		require.NoError(t, err)
		defer conn.Close(ctx) // the prepared transaction outlives its session
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		ids, err := client.EnqueueTx(ctx, tx, wharf.Message{Topic: "t", Key: key, Payload: []byte(`"2pc"`)})
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'")
		require.NoError(t, err)
		return ids
	}
	committed := prepare("wharf-commit", "K")
	aborted := prepare("wharf-abort", "K")

	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	others, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "other", Payload: []byte(`"o"`)})
	require.NoError(t, err)
	waitDelivered(t, rec, others...)
	time.Sleep(200 * time.Millisecond) // a few more fetch rounds past the prepared xids
	require.Zero(t, deliveredIDs(rec.snapshot())[committed[0]], "not committed yet")

	_, err = pool.Exec(ctx, "COMMIT PREPARED 'wharf-commit'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ROLLBACK PREPARED 'wharf-abort'")
	require.NoError(t, err)
	waitDelivered(t, rec, committed...)
	after, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "K", Payload: []byte(`"after"`)})
	require.NoError(t, err)
	waitDelivered(t, rec, after...)

	got := rec.snapshot()
	requireKeyOrder(t, got)
	for _, m := range got {
		require.NotEqual(t, aborted[0], m.ID, "a rolled-back prepared transaction's message was delivered")
	}
}
