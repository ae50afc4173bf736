package wharfflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Decide, then lock (found by the review of the flows rework, A3).
//
// cleanup_flows decides which trees to delete by reading their statuses
// (flow_tree, then "a tree with an instance that has not ended is kept
// whole") without locking the descendants, then deletes them by id. A failed
// child under a done parent (a parent whose join took the child's failure
// and ended) is retried by an operator (retry_flow: failed → ready) while
// the cleanup runs: the cleanup's check saw it failed, its DELETE waits for
// the retry's row lock, re-checks only `id = ANY (tree)` once the retry
// commits, and deletes the instance the retry has just made ready. Retry
// reported success; the instance is gone (had a runner claimed it
// meanwhile, it would run a step whose outcome is then fenced away).
//
// The retry is held open in a transaction (as `wharf flow retry` inside an
// operator's transaction, or any retry whose commit comes after the
// cleanup's check) until the cleanup waits for its lock.
//
// Fixed: the cleanup locks the trees' ended rows before deciding, skipping
// rows others hold, and keeps a tree whole when one of its rows was not
// locked so: the retried child survives.
func TestCleanupKeepsAChildRetriedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	S := b.schema
	var parent, child int64
	require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+S+`.flow_instances (flow, step, status, run_at, finished_at, spawn_round, joined)
VALUES ('order', 'joined', 'done', 'infinity', now() - interval '30 days', 1, true) RETURNING id`).Scan(&parent))
	require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+S+`.flow_instances (flow, step, status, run_at, finished_at, parent_id, spawn_round, error)
VALUES ('ship', 'ship', 'failed', 'infinity', now() - interval '30 days', $1, 1, 'carrier down') RETURNING id`, parent).Scan(&child))

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var retried bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+S+".retry_flow($1)", child).Scan(&retried))
	require.True(t, retried)

	// The cleanup skips the tree whose child the retry holds, without
	// waiting for it; and once the retry commits, the child has not ended.
	cleanup := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+S+".cleanup_flows(clock_timestamp() - interval '7 days', 100)").Scan(&n))
		return n
	}
	require.Zero(t, cleanup())
	require.NoError(t, tx.Commit(ctx))
	require.Zero(t, cleanup())

	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+S+".flow_instances WHERE id IN ($1, $2)", parent, child).Scan(&n))
	require.Equal(t, 2, n, "the tree of a child retried meanwhile is kept whole")
	require.Equal(t, "ready", b.status(t, child))
}
