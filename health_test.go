package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Health follows the database: ready while it answers, not ready (naming
// why) while it is down, ready again once it is back; a second relay that
// finds every lane owned is a ready spare.
func TestHealthFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	defer func() { _ = cluster.Stop() }()
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	defer pool.Close()
	m, err := wharfmigrate.New("wharf")
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	cfg := testConfig("wharf")
	cfg.Handler = func(context.Context, *wharf.Message) error { return nil }
	client, err := wharf.NewClient(pool, cfg)
	require.NoError(t, err)
	require.False(t, client.Health(ctx).Running)
	require.NoError(t, client.Start(ctx))
	defer func() { _ = client.Stop(ctx) }()
	ready := func(want bool) func() bool {
		return func() bool {
			hctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return client.Health(hctx).Ready == want
		}
	}
	require.Eventually(t, ready(true), time.Minute, 50*time.Millisecond)
	h := client.Health(ctx)
	require.True(t, h.Live)
	require.Equal(t, 64, h.LanesOwned)

	spareCfg := testConfig("wharf")
	spareCfg.Handler = cfg.Handler
	spare, err := wharf.NewClient(pool, spareCfg)
	require.NoError(t, err)
	require.NoError(t, spare.Start(ctx))
	require.Eventually(t, func() bool { return spare.Health(ctx).Ready }, time.Minute, 50*time.Millisecond)
	require.NoError(t, spare.Stop(ctx))

	require.NoError(t, cluster.StopServer("fast"))
	require.Eventually(t, ready(false), time.Minute, 100*time.Millisecond)
	h = client.Health(ctx)
	require.True(t, h.Live, "the engine goes on while the database is down")
	require.ErrorIs(t, h.Err(), wharf.ErrNotReady)
	require.NotEmpty(t, h.Problems)
	require.NoError(t, cluster.StartServer(ctx))
	require.Eventually(t, ready(true), time.Minute, 100*time.Millisecond)
}
