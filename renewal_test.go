package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// Every lease extension leaves a dead lane row version that nothing removes
// while a long transaction holds the xmin horizon: a relay extends a lease
// only once it has less than LeaseTTL - (LeaseTTL/3 - RebalanceInterval)
// left, not every round, and no lease ever runs low.
func TestLeasesAreNotExtendedEveryRound(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	cfg := testConfig(b.schema) // LeaseTTL 3s, RebalanceInterval 200ms: extend about every 0.8s
	cfg.RelayID = "renewer"
	cfg.Handler = func(context.Context, *wharf.Message) error { return nil }
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".lanes WHERE owner = 'renewer'").Scan(&n))
		return n == 64
	}, 10*time.Second, 20*time.Millisecond)

	const watch = 4 * time.Second
	changes := 0
	var last time.Time
	minLeft := time.Hour
	for end := time.Now().Add(watch); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var until time.Time
		var left float64
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT lease_until, extract(epoch FROM lease_until - now())::float8 FROM "+b.schema+".lanes WHERE lane = 0").Scan(&until, &left))
		if !until.Equal(last) {
			changes++
			last = until
		}
		minLeft = min(minLeft, time.Duration(left*float64(time.Second)))
	}
	// Every round (200 ms) would be 20 extensions in 4 s; every 0.8 s, 5
	// (plus the first reading).
	require.LessOrEqual(t, changes, 8, "the lease was extended %d times in %s", changes, watch)
	require.GreaterOrEqual(t, changes, 3, "the lease was extended only %d times in %s", changes, watch)
	require.Greater(t, minLeft, cfg.LeaseTTL/3, "a lease ran down to %s", minLeft)
}
