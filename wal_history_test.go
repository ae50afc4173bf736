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
	"github.com/wharfhq/wharf/internal/walstream"
)

// walInsertLSN is the server's current WAL insert position.
func walInsertLSN(t *testing.T, pool *pgxpool.Pool) walstream.LSN {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&s))
	lsn, err := walstream.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// walSettled is the position recorded in the outbox's wal_progress.
func walSettled(t *testing.T, b *testBundle) walstream.LSN {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT settled::text FROM "+b.schema+".wal_progress").Scan(&s))
	lsn, err := walstream.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// The WAL counterpart of TestRelayReadsAgainAfterTheDatabaseWentBackInTime.
// After the database goes back in time under a running relay (a copy of the
// data directory put back; a point-in-time recovery, which also starts a new
// timeline, as a promotion does), new commits reuse WAL positions the relay
// already streamed and settled. The relay notices at its next stream start
// (the server's WAL end is below what it streamed, or the timeline changed)
// and starts over from the slot: every message committed on the new history
// is delivered, and neither the slot nor wal_progress is moved past the new
// history's WAL end; wal_progress then names the new timeline.
func TestWALRelayAfterTheDatabaseWentBackInTime(t *testing.T) {
	t.Parallel()
	t.Run("copy put back", func(t *testing.T) {
		t.Parallel()
		walWentBackInTime(t, (*pgembed.Cluster).RestoreData, false)
	})
	t.Run("point-in-time recovery", func(t *testing.T) {
		t.Parallel()
		walWentBackInTime(t, (*pgembed.Cluster).RecoverData, true)
	})
}

func walWentBackInTime(t *testing.T, restore func(*pgembed.Cluster, context.Context) error, newTimeline bool) {
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
	b := &testBundle{pool: pool, schema: "ww_rewind"}
	layouts[1].migrate(t, pool, b.schema)

	relay, rec, _ := runRelayClient(t, b, nil, func(c *wharf.Config) {
		c.LeaseTTL = 30 * time.Second // the lanes stay ours across the restore
		c.RebalanceInterval = 200 * time.Millisecond
	})
	requireAllDelivered(t, rec, commitMessages(t, b, keyed("a", 20, 5)...))
	require.NoError(t, cluster.SaveData(ctx))
	// Traffic the restore forgets: delivered, settled and recorded.
	var forgotten []string
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, "SELECT 1")
		return err == nil
	}, 60*time.Second, 100*time.Millisecond, "the server did not come back after the copy")
	for i := 0; i < 20; i++ {
		forgotten = append(forgotten, commitMessages(t, b, keyed(fmt.Sprintf("b%d", i), 100, 7)...)...)
	}
	requireAllDelivered(t, rec, forgotten)
	oldEnd := b.committedTo()
	require.Eventually(t, func() bool { return walSettled(t, b) >= oldEnd }, 60*time.Second, 20*time.Millisecond,
		"the relay did not record the old history's settled position")
	timelineBefore := walTimeline(t, pool)
	require.NoError(t, restore(cluster, ctx))

	// New history: these commits are new messages, at positions the relay
	// passed on the old one.
	var again []string
	require.Eventually(t, func() bool {
		c, err := wharf.NewClient(pool, &wharf.Config{Schema: b.schema})
		if err != nil {
			return false
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return false
		}
		ids, err := c.EnqueueTx(ctx, tx, wharf.Message{Topic: "t", Key: "c", Payload: []byte("first")})
		if err != nil {
			_ = tx.Rollback(ctx)
			return false
		}
		if tx.Commit(ctx) != nil {
			return false
		}
		again = append(again, ids...)
		return true
	}, 60*time.Second, 100*time.Millisecond, "the server did not come back after the restore")
	for i := 0; i < 10; i++ {
		again = append(again, commitMessages(t, b, keyed(fmt.Sprintf("c%d", i), 10, 3)...)...)
	}
	newEnd := walInsertLSN(t, pool)
	require.Less(t, newEnd, oldEnd, "the new history must reuse positions the old one passed, or the test shows nothing")
	requireAllDeliveredWithin(t, rec, again, 60*time.Second, "messages committed after the restore were not delivered")
	require.Positive(t, relay.Metrics().Rewinds.Load(), "the engine was not told to read again")

	// A later commit delivered proves the relay streams and settles on the
	// new history; by then nothing points past the WAL.
	last := commitMessages(t, b, wharf.Message{Topic: "t", Key: "d", Payload: []byte("last")})
	requireAllDelivered(t, rec, last)
	end := b.committedTo()
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end }, 60*time.Second, 20*time.Millisecond,
		"the slot was not confirmed past the last commit of the new history")
	require.Eventually(t, func() bool { return walSettled(t, b) >= end }, 60*time.Second, 20*time.Millisecond,
		"the relay did not record the new history's settled position")
	// Read the positions before the WAL end: the relay goes on writing
	// (its lease rounds, wal_progress) and confirming, so a WAL end read
	// first can be passed legitimately by the time the slot is read.
	confirmed, settled := slotConfirmed(t, b), walSettled(t, b)
	insert := walInsertLSN(t, pool)
	require.LessOrEqual(t, confirmed, insert, "the slot was confirmed past the WAL end")
	require.LessOrEqual(t, settled, insert, "wal_progress points past the WAL end")
	timeline := walTimeline(t, pool)
	if newTimeline {
		require.Greater(t, timeline, timelineBefore, "the recovery did not start a new timeline")
	} else {
		require.Equal(t, timelineBefore, timeline)
	}
	var recordedOn int32
	require.NoError(t, pool.QueryRow(ctx, "SELECT timeline_id FROM "+b.schema+".wal_progress").Scan(&recordedOn))
	require.Equal(t, timeline, recordedOn, "wal_progress does not name the server's timeline")
	got := deliveredIDs(rec.snapshot())
	twice := 0
	for _, id := range again {
		twice += got[id] - 1
	}
	t.Logf("old history reached %s on timeline %d, new history at %s on timeline %d: all %d new messages delivered (%d twice), slot confirmed %s, wal_progress %s",
		oldEnd, timelineBefore, newEnd, timeline, len(again), twice, slotConfirmed(t, b), walSettled(t, b))
}

// walTimeline is the timeline the server writes, as SQL can read it.
func walTimeline(t *testing.T, pool *pgxpool.Pool) int32 {
	t.Helper()
	var tl int32
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int").Scan(&tl))
	return tl
}

// wal_progress.settled ahead of the WAL (as after pg_dump/pg_restore to a
// server whose WAL is not as far along, or a position written by a relay
// that streamed another history) is never used to skip or confirm: the
// relay ignores it, every new message is delivered, the slot is never
// confirmed past the server's WAL end, and the row is written again with a
// position of this history.
func TestWALProgressAheadOfTheWALIsIgnored(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "UPDATE "+b.schema+".wal_progress SET settled = pg_current_wal_insert_lsn() + 100000000")
	require.NoError(t, err)
	ahead := walSettled(t, b)
	rec, _ := runRelay(t, b, nil, nil)
	ids := commitMessages(t, b, keyed("x", 50, 5)...)
	requireAllDeliveredWithin(t, rec, ids, 60*time.Second, "new messages skipped because of wal_progress")
	t.Logf("wal_progress was %s with the WAL at %s: %d of %d delivered", ahead, b.committedTo(), len(deliveredIDs(rec.snapshot())), len(ids))
	end := b.committedTo()
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end }, 60*time.Second, 20*time.Millisecond,
		"the slot was not confirmed past the last commit")
	require.Eventually(t, func() bool { s := walSettled(t, b); return s >= end && s < ahead }, 60*time.Second, 20*time.Millisecond,
		"wal_progress was not written again with a position of this WAL")
	confirmed, settled := slotConfirmed(t, b), walSettled(t, b) // before the WAL end: see above
	insert := walInsertLSN(t, b.pool)
	require.LessOrEqual(t, confirmed, insert, "the slot was confirmed past the WAL end")
	require.LessOrEqual(t, settled, insert, "wal_progress points past the WAL end")
}

// wal_progress recorded on another cluster (its system identifier differs:
// a dump restored to a new server) or on another timeline of this one is
// never used to skip: messages committed after the slot's position and
// before the recorded one are delivered.
func TestWALProgressOfAnotherHistoryIsIgnored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, identity string }{
		{"another cluster", "system_identifier = (pg_control_system()).system_identifier + 1, timeline_id = 1"},
		{"another timeline", "system_identifier = (pg_control_system()).system_identifier, timeline_id = 7"},
		{"no identity (an earlier build)", "system_identifier = NULL, timeline_id = NULL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := walDB(t)
			ctx := context.Background()
			ids := commitMessages(t, b, keyed("x", 50, 5)...)
			// WAL past the messages, so the recorded position lies inside
			// this server's WAL.
			_, err := b.pool.Exec(ctx, "SELECT pg_logical_emit_message(true, 'someone_else', repeat('x', 10000))")
			require.NoError(t, err)
			_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".wal_progress SET settled = pg_current_wal_insert_lsn(), "+tc.identity)
			require.NoError(t, err)
			require.Less(t, slotConfirmed(t, b), walSettled(t, b))
			rec, _ := runRelay(t, b, nil, nil)
			later := commitMessages(t, b, keyed("y", 10, 5)...)
			requireAllDeliveredWithin(t, rec, append(ids, later...), 60*time.Second, "messages skipped because of a wal_progress of another history")
			t.Logf("%d of %d delivered", len(deliveredIDs(rec.snapshot())), len(ids)+len(later))
		})
	}
}
