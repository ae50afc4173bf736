package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A lease is the relay's, not the lane's: the heartbeat every round writes
// anyway extends it, and lane rows change only when lanes change hands. A
// new lane row version per lane and extension is what nothing removes while
// a long transaction holds the xmin horizon; for an hour of that, the lanes
// table would hold a quarter of a million of them for every renewal to walk.
func TestLeaseRoundsWriteNoLaneRows(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	cfg := testConfig(b.schema) // RebalanceInterval 200ms
	// A lease long enough that a loaded machine never lets it run out:
	// a lease that expired is claimed again, with new lane rows.
	cfg.LeaseTTL = 30 * time.Second
	cfg.RelayID = "renewer"
	cfg.Handler = func(context.Context, *wharf.Message) error { return nil }
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	require.Eventually(t, func() bool { return leasedLanes(t, b, "renewer") == 64 }, time.Minute, 20*time.Millisecond)

	versions := func() map[int]string {
		rows, err := b.pool.Query(ctx, "SELECT lane, xmin::text || ctid::text FROM "+b.schema+".lanes")
		require.NoError(t, err)
		out := map[int]string{}
		var lane int
		var v string
		for rows.Next() {
			require.NoError(t, rows.Scan(&lane, &v))
			out[lane] = v
		}
		require.NoError(t, rows.Err())
		return out
	}
	before := versions()
	// 15 lease rounds, counted, however long they take.
	rounds := func() int64 { return client.Metrics().LeaseRenewals.Load() / 64 }
	until := rounds() + 15
	minLeft := time.Hour
	for start := time.Now(); rounds() < until; time.Sleep(20 * time.Millisecond) {
		require.Less(t, time.Since(start), 5*time.Minute, "no 15 lease rounds in five minutes")
		var left float64
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT extract(epoch FROM lease_until - now())::float8 FROM "+b.schema+".relays WHERE relay_id = 'renewer'").Scan(&left))
		minLeft = min(minLeft, time.Duration(left*float64(time.Second)))
	}
	require.Equal(t, before, versions(), "lease rounds wrote new lane row versions")
	require.Equal(t, 64, leasedLanes(t, b, "renewer"), "the relay kept every lane")
	// Extended every round (200 ms): it never runs low.
	require.Greater(t, minLeft, cfg.LeaseTTL/2, "the lease ran down to %s", minLeft)
}
