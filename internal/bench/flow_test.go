package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testtool"
)

// smokeFlow runs the flow bench in miniature: a drain and a short paced
// phase (none when paced is negative).
func smokeFlow(t *testing.T, url string, paced time.Duration) []FlowResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := RunFlow(ctx, FlowOptions{DatabaseURL: url, Instances: 200, Paced: paced})
	require.NoError(t, err)
	require.Len(t, rs, len(DefaultFlowWorkloads))
	return rs
}

// On a server that loads pg_stat_statements, the flow bench reports the
// statements per step by kind: a claim and an outcome call at least, and
// signal calls for the signal workload.
func TestFlowStatementsPerStep(t *testing.T) {
	dir, err := pgembed.FindBinaries()
	if err != nil {
		testtool.Missing(t, "initdb", err.Error())
	}
	if !pgembed.HasLibrary(dir, "pg_stat_statements") {
		testtool.Missing(t, "pg_stat_statements", "the server's package library directory has no pg_stat_statements")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })

	rs := smokeFlow(t, c.URL(), 300*time.Millisecond)
	for _, r := range rs {
		require.Empty(t, r.StatementsNote, r.Workload)
		require.Greater(t, r.Statements["claim"], 0.0, r.Workload)
		require.Greater(t, r.Statements["outcome"], 0.0, r.Workload)
		require.Greater(t, r.Statements["in functions"], 0.0, r.Workload)
		// The total is the top-level statements, every kind but those run
		// inside functions.
		sum := 0.0
		for k, v := range r.Statements {
			if k != "total" && k != "in functions" {
				sum += v
			}
		}
		require.InDelta(t, sum, r.Statements["total"], 1e-9, r.Workload)
		if r.Workload == "signal" {
			require.Greater(t, r.Statements["signal"], 0.0)
		}
		if r.Workload == "children" {
			// Every paced parent gives eleven step-to-step gaps (to each
			// of its ten children, and from the last one to the join),
			// each within its spawn → join.
			require.Positive(t, r.SpanSamples)
			require.Equal(t, 11*r.SpanSamples, r.Samples)
			require.LessOrEqual(t, r.P50Ms, r.SpanP50Ms)
			require.LessOrEqual(t, r.P99Ms, r.SpanP99Ms)
		}
		// One step-to-step p99 per second of the paced phase (300 ms: one).
		require.Len(t, r.P99PerSecondMs, 1, r.Workload)
		require.Positive(t, r.P99PerSecondMs[0], r.Workload)
		// The paced phase times the claims and outcome writes.
		for _, k := range []string{"claim", "outcome"} {
			c := r.Calls[k]
			require.Positive(t, c.Calls, "%s: %s calls timed", r.Workload, k)
			require.LessOrEqual(t, c.P50Ms, c.P99Ms, r.Workload)
			require.LessOrEqual(t, c.P99Ms, c.MaxMs, r.Workload)
		}
	}
	var out bytes.Buffer
	require.NoError(t, WriteFlowSummary(&out, rs))
	require.Contains(t, out.String(), "steps: statements per step (pg_stat_statements): ")
	require.Contains(t, out.String(), "signal: paced calls, ms p50/p99/max (calls): claim ")
	require.Contains(t, out.String(), "children: spawn → join (two step-to-step gaps), ms p50/p99: ")
	require.Contains(t, out.String(), "steps: step-to-step p99 in each second of the paced phase, ms: ")
}

// On a server that does not load pg_stat_statements, the flow bench still
// runs and says in one line per workload why it has no statement counts.
func TestFlowStatementsNotLoaded(t *testing.T) {
	conn, err := pgx.Connect(context.Background(), databaseURL)
	require.NoError(t, err)
	var libs string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW shared_preload_libraries").Scan(&libs))
	require.NoError(t, conn.Close(context.Background()))
	if bytes.Contains([]byte(libs), []byte("pg_stat_statements")) {
		t.Skip("the test database's server loads pg_stat_statements")
	}
	rs := smokeFlow(t, databaseURL, -1)
	var out bytes.Buffer
	require.NoError(t, WriteFlowSummary(&out, rs))
	for _, r := range rs {
		require.Nil(t, r.Statements, r.Workload)
		require.Contains(t, r.StatementsNote, "does not load pg_stat_statements", r.Workload)
		require.Greater(t, r.StepsPerSec, 0.0, r.Workload)
	}
	require.Contains(t, out.String(), "signal: statements per step: not measured: this server does not load pg_stat_statements")
}
