package wharfflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// Finished instances stay in the instance table for the retention period
// (7 days by default), so it grows with the traffic; a call that scans it
// whole costs more every day. A start looked its new ids up through a join
// the planner turned into a hash of the whole table (13 ms a call at
// 110,000 instances), and the claim's lease update did the same before.
// Here the table holds 20,000 instances and has never been analyzed (the
// statistics a queue table mostly has): starts, signals, claims, a lease
// renewal, an outcome write, a wake by id and a hand-back, in one
// transaction, must not read it sequentially (pg_stat_xact_user_tables
// counts the scans).
func TestFlowCallsDoNotScanTheInstanceTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := wharfflow.New[counter]("plan", nil).
		Step("wait", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("go", "go")
		}).
		Step("go", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	var ids []int64
	for range 20 {
		starts := make([]wharfflow.Start, 1000)
		for i := range starts {
			starts[i] = f.Start(counter{}, wharfflow.StartOptions{})
		}
		got, err := b.client.Start(ctx, starts...)
		require.NoError(t, err)
		ids = append(ids, got...)
	}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The view also counts the connection's earlier transactions whose
	// counts it has not reported yet; within a transaction it only grows.
	var scans int64
	seqScans := func(step string) {
		t.Helper()
		var n int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'flow_instances'",
			b.schema).Scan(&n))
		if step == "" {
			scans = n
			return
		}
		require.Equal(t, scans, n, "%s read the whole instance table", step)
	}
	seqScans("")
	starts := make([]wharfflow.Start, 50)
	for i := range starts {
		starts[i] = f.Start(counter{}, wharfflow.StartOptions{Key: fmt.Sprint("order-", i%25)})
	}
	_, err = b.client.StartTx(ctx, tx, starts...)
	require.NoError(t, err)
	seqScans("a start")

	sigs := make([]wharfflow.Signal, 50)
	for i := range sigs {
		sigs[i] = wharfflow.Signal{Instance: ids[i*7], Name: "go", DedupKey: "go"}
	}
	_, err = b.client.SignalTx(ctx, tx, sigs...)
	require.NoError(t, err)
	seqScans("a signal")

	rows, err := tx.Query(ctx, "SELECT id, lease_token FROM "+b.schema+".claim_flow_steps('plan-test', ARRAY['plan'], 100, '30 seconds') WHERE id > 0")
	require.NoError(t, err)
	type lease struct{ id, token int64 }
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
		var l lease
		return l, r.Scan(&l.id, &l.token)
	})
	require.NoError(t, err)
	require.Len(t, claimed, 100)
	seqScans("a claim")
	ids100, tokens := make([]int64, len(claimed)), make([]int64, len(claimed))
	for i, l := range claimed {
		ids100[i], tokens[i] = l.id, l.token
	}
	var renewed int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".renew_flow_leases('plan-test', $1, $2, '30 seconds')",
		ids100, tokens).Scan(&renewed))
	require.Equal(t, len(claimed), renewed)
	seqScans("a lease renewal")

	// The outcome write, as the runner sends it: half await (some of
	// those have their signal already), half end.
	var outcomes []map[string]any
	for i, l := range claimed {
		o := map[string]any{"id": l.id, "token": l.token, "kind": "done", "attempt": 0, "ran_step": "wait", "started_at": time.Now()}
		if i%2 == 0 {
			o["kind"], o["step"], o["await_names"] = "await", "go", []string{"go"}
		}
		outcomes = append(outcomes, o)
	}
	doc, err := json.Marshal(outcomes)
	require.NoError(t, err)
	var applied int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id > 0) FROM "+b.schema+".complete_flow_steps('plan-test', $1::jsonb, '30 seconds')",
		string(doc)).Scan(&applied))
	require.Equal(t, len(claimed), applied)
	seqScans("an outcome write")

	var woken int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".wake_flows($1)", ids100).Scan(&woken))
	seqScans("a wake by id")

	// A stopping runner hands back what it claimed.
	rows, err = tx.Query(ctx, "SELECT id, lease_token FROM "+b.schema+".claim_flow_steps('plan-test', ARRAY['plan'], 100, '30 seconds') WHERE id > 0")
	require.NoError(t, err)
	again, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
		var l lease
		return l, r.Scan(&l.id, &l.token)
	})
	require.NoError(t, err)
	require.Len(t, again, 100)
	seqScans("a claim")
	for i, l := range again {
		ids100[i], tokens[i] = l.id, l.token
	}
	var released int
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+b.schema+".release_flow_leases('plan-test', $1, $2)", ids100, tokens).Scan(&released))
	require.Equal(t, len(again), released)
	seqScans("a hand-back")
}
