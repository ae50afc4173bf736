package wharfmigrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// Reverting 007_flows drops flow_instances, flow_signals and flow_steps:
// every instance that has not ended (awaiting a payment, failed and waiting
// for an operator) and every pending signal is lost. Its down file is marked
// keeps-messages, and DownToIfEmpty (what `wharf migrate down` runs without
// --force) checks only the outbox and the dead letters, so
// `wharf migrate down --steps 3` drops live flows without --force, and
// `--dry-run` says "these reverts keep them". A revert that drops durable
// flow state must be refused like one that drops messages.
func TestDownToIfEmptyRefusesToDropLiveFlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.flow_definitions (flow, first_step, steps, runner) VALUES ('payout', 'charge', '{charge}', 'r')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT `+schema+`.start_flow('payout', '{"amount": 100}', 'p-1')`)
	require.NoError(t, err)

	_, err = m.DownToIfEmpty(ctx, pool, 6)
	require.ErrorIs(t, err, wharfmigrate.ErrNotEmpty, "reverting 007 drops a live flow instance")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.flow_instances`).Scan(&n))
	require.Equal(t, 1, n)
}
