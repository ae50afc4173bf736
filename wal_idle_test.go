package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/walstream"
)

// A slot keeps every WAL byte after its restart position, whatever database
// wrote it. An outbox in WAL mode that is idle while the rest of its
// database, or another database of the cluster, writes heavily must still
// let its slot advance (confirmed_flush_lsn and restart_lsn), or the WAL
// piles up behind it. The relay confirms the WAL end of the walsender's
// keepalives while it holds nothing; this test shows that suffices: after
// each load the slot passes a position written after the load.
func TestWALIdleOutboxSlotFollowsOtherWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, schema: "ww_idle"}
	layouts[1].migrate(t, pool, b.schema)
	_, err = pool.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE DATABASE wharf_other")
	require.NoError(t, err)
	ocfg, err := pgxpool.ParseConfig(cluster.URL())
	require.NoError(t, err)
	ocfg.ConnConfig.Database = "wharf_other"
	other, err := pgxpool.NewWithConfig(ctx, ocfg)
	require.NoError(t, err)
	t.Cleanup(other.Close)
	_, err = other.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)")
	require.NoError(t, err)

	rec, _ := runRelay(t, b, nil, nil)
	requireAllDelivered(t, rec, commitMessages(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("streaming")}))

	slot := func() (confirmed, restart walstream.LSN) {
		var c, r string
		require.NoError(t, pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1", b.schema).Scan(&c, &r))
		confirmed, err := walstream.ParseLSN(c)
		require.NoError(t, err)
		restart, err = walstream.ParseLSN(r)
		require.NoError(t, err)
		return confirmed, restart
	}
	// 100 transactions of 1,000 rows of 200 bytes: about 30 MB of WAL.
	load := func(p *pgxpool.Pool) {
		for i := 0; i < 100; i++ {
			_, err := p.Exec(ctx, "INSERT INTO busy (pad) SELECT repeat(md5(g::text), 6) FROM generate_series(1, 1000) g")
			require.NoError(t, err)
		}
	}
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"the outbox's database", pool}, {"another database", other}} {
		start := walInsertLSN(t, pool)
		load(tc.pool)
		after := walInsertLSN(t, pool)
		_, restartBefore := slot()
		loaded := time.Now()
		t.Logf("%s wrote %d MB of WAL; the slot's restart position was %s", tc.name, (after-start)>>20, restartBefore)
		require.Eventually(t, func() bool {
			confirmed, restart := slot()
			return confirmed >= after && restart >= after
		}, 120*time.Second, 100*time.Millisecond, "the idle outbox's slot did not pass %s, written after the load in %s", after, tc.name)
		confirmed, restart := slot()
		t.Logf("the slot passed it %s after the load: confirmed %s, restart %s, the WAL at %s",
			time.Since(loaded).Round(100*time.Millisecond), confirmed, restart, walInsertLSN(t, pool))
	}
	// The outbox still works.
	requireAllDelivered(t, rec, commitMessages(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("after")}))
}
