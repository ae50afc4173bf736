package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// walDB is logicalDB switched to WAL mode.
func walDB(t testing.TB) *testBundle {
	t.Helper()
	b := logicalDB(t)
	m, err := wharfmigrate.New(b.schema)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(context.Background(), b.pool))
	return b
}

// slotConfirmed is the slot's confirmed position.
func slotConfirmed(t *testing.T, b *testBundle) walstream.LSN {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", b.schema).Scan(&s))
	lsn, err := walstream.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// When the stream breaks (its walsender terminated), the relay starts it
// again from the slot's confirmed position and skips the transactions it
// already holds or settled: every message is delivered once.
func TestWALRelayStreamsAgainAfterTheConnectionDies(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := runRelay(t, b, nil, nil)
	var ids []string
	for round := 0; round < 5; round++ {
		msgs := make([]wharf.Message, 200)
		for i := range msgs {
			msgs[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%9), Payload: []byte(fmt.Sprintf("%d-%d", round, i))}
		}
		ids = append(ids, commitMessages(t, b, msgs...)...)
		var n int
		require.Eventually(t, func() bool {
			require.NoError(t, b.pool.QueryRow(context.Background(),
				"SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", b.schema).Scan(&n))
			return n == 1
		}, time.Minute, 10*time.Millisecond, "no walsender streams the slot")
	}
	requireAllDelivered(t, rec, ids)
	got := rec.snapshot()
	requireKeyOrder(t, got)
	for id, n := range deliveredIDs(got) {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
}

// A logical message of the outbox's prefix that is not a Wharf content
// cannot be delivered; it becomes a dead letter of topic wharf.undecodable
// with the raw content, and the messages around it are delivered.
func TestWALRelayDeadLettersUndecodableContent(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := runRelay(t, b, nil, nil)
	before := commitMessages(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("before")})
	_, err := b.pool.Exec(context.Background(), "SELECT pg_logical_emit_message(true, $1, '\\x0900000001ff'::bytea)", b.schema)
	require.NoError(t, err)
	after := commitMessages(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("after")})
	requireAllDelivered(t, rec, append(before, after...))

	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	dead, err := c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "wharf.undecodable", dead[0].Topic)
	require.Equal(t, []byte{0x09, 0, 0, 0, 1, 0xff}, dead[0].Payload)
	require.Contains(t, dead[0].LastError, walmsg.ErrVersion.Error())
}

// DedupKey needs the table to look the key up in.
func TestWALEnqueueRefusesDedupKey(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = c.EnqueueTx(context.Background(), tx, wharf.Message{Topic: "t", Payload: []byte("x"), DedupKey: "d"})
	require.ErrorContains(t, err, "DedupKey works only in an outbox in table mode")
	require.ErrorIs(t, err, wharf.ErrInvalidMessage)
}

// A backlog many times the relay's memory budget: the store stops reading
// the stream while it holds twice MaxBufferedBytes (the walsender then
// waits: what it sent stays far behind the WAL end), and goes on as
// deliveries free room; everything arrives, keys in order. The lag metrics
// show it while it lasts and fall back when it is over.
func TestWALRelayBacklogLargerThanItsMemory(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	var startLSN string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&startLSN))
	payload := make([]byte, 2000)
	var ids []string
	// Transactions of 100 messages: one of more than a quarter of the
	// budget would go to the outbox table as it streams (see
	// TestWALRelayLargeTransactionStaysWithinTheBudget), not be held.
	for i := 0; i < 300; i++ {
		msgs := make([]wharf.Message, 100)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", j%50), Payload: payload}
		}
		ids = append(ids, commitMessages(t, b, msgs...)...)
	}
	committedBy := time.Now()
	var total int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", startLSN).Scan(&total))
	// 30,000 messages of 2,000 bytes (about 60 MB of WAL) against a budget
	// of 2 × 1 MiB, delivered one at a time at about a millisecond each
	// until the check. Between the walsender and the store, the sockets'
	// buffers hold about 10 MB more on loopback (measured: 15 MB sent).
	var fast atomic.Bool
	relay, rec, _ := runRelayClient(t, b, func(*wharf.Message) error {
		if !fast.Load() {
			time.Sleep(time.Millisecond)
		}
		return nil
	},
		func(cfg *wharf.Config) {
			cfg.MaxBufferedBytes, cfg.MaxBuffered, cfg.FetchBatch, cfg.HandlerConcurrency = 1<<20, 500, 100, 1
		})
	require.Eventually(t, func() bool { return len(rec.snapshot()) > 200 }, time.Minute, 10*time.Millisecond)
	time.Sleep(time.Second) // a relay that did not stop reading has read everything by now
	var sent int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(sent_lsn, $2::pg_lsn)::bigint FROM pg_stat_replication r
JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, b.schema, startLSN).Scan(&sent))
	require.Less(t, sent, total/2, "the walsender sent %d of %d bytes while %d messages were delivered: the relay did not stop reading", sent, total, len(rec.snapshot()))
	t.Logf("sent %d of %d bytes after %d deliveries", sent, total, len(rec.snapshot()))
	// The metrics show it: what is held stays within the budget and one
	// transaction (100 messages) more; the lag is most of the backlog.
	held, lag := relay.Metrics().WALHeldBytes.Load(), relay.Metrics().WALLagBytes.Load()
	require.Positive(t, held)
	require.LessOrEqual(t, held, int64(2<<20+500*(2000+256)))
	require.Greater(t, lag, total/2)
	// The oldest unsettled message was committed before committedBy; the
	// lag in time is read at each lease round (every 200 ms here).
	// (A loaded machine may delay a round: wait for one.)
	require.Eventually(t, func() bool {
		return time.Duration(relay.Metrics().WALLag.Load()) >= time.Since(committedBy)-time.Second
	}, time.Minute, 10*time.Millisecond, "the lag in time does not show how long the oldest message waits")
	// So does status, from any process: what the relay records each round.
	require.Eventually(t, func() bool {
		st, err := relay.Status(ctx)
		require.NoError(t, err)
		require.True(t, st.WAL.Active)
		return st.WAL.OldestUnsettled >= time.Since(committedBy)-time.Second && st.WAL.RecordedAgo < time.Second
	}, time.Minute, 10*time.Millisecond, "status does not show what the relay records each round")
	fast.Store(true)
	require.Eventually(t, func() bool { return len(deliveredIDs(rec.snapshot())) >= len(ids) }, time.Minute, 50*time.Millisecond)
	requireAllDelivered(t, rec, ids)
	requireKeyOrder(t, rec.snapshot())
	require.Eventually(t, func() bool { return relay.Metrics().WALHeldBytes.Load() == 0 }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return relay.Metrics().WALLag.Load() == 0 }, time.Minute, 20*time.Millisecond,
		"a relay holding nothing unsettled still shows a lag in time")
	require.Eventually(t, func() bool {
		st, err := relay.Status(ctx)
		require.NoError(t, err)
		return st.WAL.OldestUnsettled == 0
	}, time.Minute, 20*time.Millisecond, "status still shows an unsettled commit")
}

// PostgreSQL saves a logical slot's confirmed position only at checkpoints:
// after a crash the slot starts from an older one. The relay records how far
// it settled in a table (wal_progress, WAL-logged like any write) and skips
// what ends at or before it, so a crash does not deliver again everything
// since the last checkpoint; what was committed and not delivered before the
// crash is delivered after it.
func TestWALRelayAfterPostgresCrashSkipsWhatWasSettled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on" // every commit survives the crash
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, schema: "ww_crash"}
	layouts[1].migrate(t, pool, b.schema)

	var delivered []string
	for i := 0; i < 20; i++ {
		delivered = append(delivered, commitMessages(t, b, keyed(fmt.Sprintf("a%d", i), 100, 7)...)...)
	}
	recA, stopA := runRelay(t, b, nil, nil)
	requireAllDelivered(t, recA, delivered)
	end := b.committedTo()
	var settled string
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, "SELECT settled::text FROM "+b.schema+".wal_progress").Scan(&settled))
		lsn, err := walstream.ParseLSN(settled)
		require.NoError(t, err)
		return lsn >= end
	}, time.Minute, 20*time.Millisecond, "the relay did not record the settled position")
	stopA()
	pending := commitMessages(t, b, keyed("pending", 300, 7)...)

	require.NoError(t, cluster.StopServer("immediate"))
	require.NoError(t, cluster.StartServer(ctx))
	var slotAt string
	require.Eventually(t, func() bool { // the pool's connections died with the server
		return pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", b.schema).Scan(&slotAt) == nil
	}, time.Minute, 20*time.Millisecond)
	t.Logf("after the crash the slot is confirmed to %s; recorded settled %s, last delivered commit %s", slotAt, settled, end)

	recB, _ := runRelay(t, b, nil, nil)
	after := commitMessages(t, b, keyed("after", 100, 7)...)
	requireAllDelivered(t, recB, append(pending, after...))
	got := deliveredIDs(recB.snapshot())
	again := 0
	for _, id := range delivered {
		again += got[id]
	}
	require.Zero(t, again, "%d of the %d messages settled before the crash were delivered again", again, len(delivered))
	requireKeyOrder(t, recB.snapshot())
}

// A message held in memory past the spill time (here one scheduled for
// later, and the message of its key behind it) moves to the outbox table:
// the slot is confirmed past it and the relay holds nothing, long before it
// is due. It is delivered from the table at its time, in order, once, also
// by another relay after the first stopped; the table ends empty.
func TestWALRelayMovesHeldMessagesToTheTable(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	spill := func(cfg *wharf.Config) { wharf.SetWALSpillAfter(cfg, 300*time.Millisecond) }
	relayA, recA, stopA := runRelayClient(t, b, nil, spill)
	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	at := dbNow.Add(6 * time.Second)
	ids := commitMessages(t, b,
		wharf.Message{Topic: "t", Key: "later", Payload: []byte("scheduled"), DeliverAt: at, Headers: map[string]string{"h": "v"}},
		wharf.Message{Topic: "t", Key: "later", Payload: []byte("behind")},
		wharf.Message{Topic: "t", Key: "now", Payload: []byte("free")})
	requireAllDelivered(t, recA, ids[2:])
	end := b.committedTo()
	require.Eventually(t, func() bool { return outboxCount(t, b) == 2 }, time.Minute, 20*time.Millisecond,
		"the held messages were not moved to the table")
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end }, time.Minute, 20*time.Millisecond,
		"the slot is not confirmed past the moved messages")
	require.Zero(t, relayA.Metrics().WALHeldBytes.Load())
	var now time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&now))
	require.True(t, now.Before(at), "moved only %s before the messages are due: the test shows nothing", at.Sub(now))
	stopA()
	require.Len(t, recA.snapshot(), 1, "a held message went out early")

	recB, _ := runRelay(t, b, nil, spill)
	requireAllDelivered(t, recB, ids[:2])
	var deliveredAt time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&deliveredAt))
	require.False(t, deliveredAt.Before(at), "delivered at %v, scheduled for %v", deliveredAt, at)
	got := recB.snapshot()
	require.Len(t, got, 2)
	require.Equal(t, []string{ids[0], ids[1]}, []string{got[0].ID, got[1].ID})
	require.Equal(t, "scheduled", string(got[0].Payload))
	require.Equal(t, map[string]string{"h": "v"}, got[0].Headers)
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond,
		"delivered messages left in the table")
}

// A key whose head keeps failing: its messages move to the table past the
// spill time (the slot goes on past them, as other keys' messages are
// delivered), and once the sink takes the head again, the key is delivered
// from the table in order, each message once.
func TestWALRelayMovesAFailingKeyToTheTable(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	var failing atomic.Bool
	failing.Store(true)
	rec, _ := runRelay(t, b, func(m *wharf.Message) error {
		if m.Key == "bad" && failing.Load() {
			return errors.New("sink refuses")
		}
		return nil
	}, func(cfg *wharf.Config) {
		wharf.SetWALSpillAfter(cfg, 300*time.Millisecond)
		cfg.MaxAttempts = 1000
	})
	var bad, good []string
	for i := 0; i < 5; i++ {
		ids := commitMessages(t, b,
			wharf.Message{Topic: "t", Key: "bad", Payload: []byte(fmt.Sprintf("bad-%d", i))},
			wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i), Payload: []byte(fmt.Sprintf("good-%d", i))})
		bad, good = append(bad, ids[0]), append(good, ids[1])
	}
	requireAllDelivered(t, rec, good)
	end := b.committedTo()
	require.Eventually(t, func() bool { return outboxCount(t, b) == 5 }, time.Minute, 20*time.Millisecond,
		"the failing key's messages were not moved to the table")
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end }, time.Minute, 20*time.Millisecond,
		"the slot is not confirmed past the failing key")
	failing.Store(false)
	requireAllDelivered(t, rec, bad)
	var got []string
	for _, m := range rec.snapshot() {
		if m.Key == "bad" {
			got = append(got, m.ID)
		}
	}
	require.Equal(t, bad, got, "the failing key's messages, once each, in order")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".retries").Scan(&n))
		return n == 0 && outboxCount(t, b) == 0
	}, time.Minute, 20*time.Millisecond, "retry records or rows left")
}
