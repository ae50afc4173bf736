package wharf_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// After the database goes back in time under a running relay (a failover to
// a standby that lost commits, a point-in-time restore), transaction ids and
// sequence values are handed out again below what the relay already read.
// Messages committed on the new history are still delivered.
func TestRelayReadsAgainAfterTheDatabaseWentBackInTime(t *testing.T) {
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

	rec := &recorder{}
	cfg := testConfig("wharf")
	cfg.Logger = testLogT(t)
	cfg.Handler = rec.handle
	cfg.LeaseTTL = 30 * time.Second // the lanes stay ours across the restore
	cfg.RebalanceInterval = time.Second
	client, err := wharf.NewClient(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { _ = client.Stop(ctx) }()
	enqueue := func(prefix string, n int) []string {
		var ids []string
		for i := 0; i < n; i++ {
			got, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: fmt.Sprintf("%s%d", prefix, i%5), Payload: []byte("1")})
			require.NoError(t, err)
			ids = append(ids, got...)
		}
		return ids
	}
	waitDelivered(t, rec, enqueue("a", 20)...)
	require.NoError(t, cluster.SaveData(ctx))
	// Traffic the restore will forget: the relay reads and delivers it, so
	// its cursors and snapshot move past what the saved state knows.
	waitDelivered(t, rec, enqueue("b", 200)...)
	require.NoError(t, cluster.RestoreData(ctx))

	// The restored database hands out the same seqs and xids again.
	var again []string
	require.Eventually(t, func() bool {
		got, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "c", Payload: []byte("1")})
		if err == nil {
			again = append(again, got...)
		}
		return err == nil
	}, time.Minute, 100*time.Millisecond)
	again = append(again, enqueue("c", 20)...)
	require.LessOrEqual(t, seqOf(t, again[0]), int64(25), "the restore must have rewound the sequence")
	waitDelivered(t, rec, again...)
	require.Positive(t, client.Metrics().Rewinds.Load())
}
