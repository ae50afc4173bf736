package wharfflow_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// PostgreSQL restarted, then crashed, under running flows: every instance
// finishes, and every step's outcome, with its message, was applied once.
func TestPostgresRestartAndCrashUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const schema = "wf_restart"
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	client, err := wharfflow.NewClient(pool, schema)
	require.NoError(t, err)
	b := &testBundle{pool: pool, schema: schema, client: client}

	var ran atomic.Int64
	const steps = 6
	f := wharfflow.New[counter]("restart", &wharfflow.FlowConfig{MaxAttempts: 100, RetryBackoff: 10 * time.Millisecond}).
		Step("s", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			ran.Add(1)
			time.Sleep(2 * time.Millisecond) // a step that does some work
			s.N++
			msg := wharf.Message{Topic: "steps", Key: fmt.Sprint(in.Instance), Payload: []byte(fmt.Sprint(s.N))}
			if s.N == steps {
				return wharfflow.Done(s.N).Emit(msg)
			}
			return wharfflow.Next("s").Emit(msg)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, LeaseTTL: 2 * time.Second, MaxInFlight: 32})
	var starts []wharfflow.Start
	for range 300 {
		starts = append(starts, f.Start(counter{}, wharfflow.StartOptions{}))
	}
	ids, err := client.Start(ctx, starts...)
	require.NoError(t, err)

	for i, mode := range []string{"fast", "immediate"} {
		before := ran.Load()
		require.Eventually(t, func() bool { return ran.Load() > before+200 }, time.Minute, time.Millisecond,
			"no progress before restart %d", i)
		require.NoError(t, cluster.StopServer(mode))
		require.NoError(t, cluster.StartServer(ctx))
	}
	for _, id := range ids {
		require.Eventually(t, func() bool {
			var s string
			return pool.QueryRow(ctx, "SELECT status FROM "+schema+".flow_instances WHERE id = $1", id).Scan(&s) == nil && s == "done"
		}, 2*time.Minute, 10*time.Millisecond, "instance %d never finished", id)
	}
	var outcomes, messages, distinct int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".flow_steps").Scan(&outcomes))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT (key, payload)) FROM "+schema+".outbox").Scan(&messages, &distinct))
	require.Equal(t, steps*len(ids), outcomes, "one outcome per step, none applied twice")
	require.Equal(t, steps*len(ids), messages, "one message per applied outcome")
	require.Equal(t, messages, distinct)
	var wrong int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".flow_instances WHERE state <> $1::jsonb", fmt.Sprintf(`{"n": %d}`, steps)).Scan(&wrong))
	require.Zero(t, wrong, "every instance's state counted each step once")
	t.Logf("%d step runs for %d outcomes (runs whose outcome the restarts lost ran again)", ran.Load(), outcomes)
}
