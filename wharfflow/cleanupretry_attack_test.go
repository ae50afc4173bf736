package wharfflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ATTACK A3 (decide, then lock).
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
// Fixed when: the retried child survives (the cleanup locks the tree's rows
// before checking them, or deletes only rows still ended, and keeps the
// whole tree when one is not).
func TestAttackCleanupDeletesAChildRetriedMeanwhile(t *testing.T) {
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

	done := make(chan error, 1)
	go func() {
		var n int
		done <- b.pool.QueryRow(ctx, "SELECT "+S+".cleanup_flows(clock_timestamp() - interval '7 days', 100)").Scan(&n)
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
AND datname = current_database() AND query LIKE '%' || $1 || '.cleanup_flows%'`, S).Scan(&n))
		return n > 0
	}, time.Minute, 5*time.Millisecond,
		"the cleanup waits for the retry's row lock")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)

	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+S+".flow_instances WHERE id = $1", child).Scan(&n))
	require.Equal(t, 1, n, "retry_flow(%d) returned true and committed, then the cleanup that had seen it failed deleted it", child)
	require.Equal(t, "ready", b.status(t, child))
}
