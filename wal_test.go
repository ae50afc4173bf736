package wharf_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// logicalDB gives a test a migrated schema (table mode) on a cluster with
// wal_level=logical (the shared test server may run with replica), dropped
// at cleanup with whatever WAL mode created.
func logicalDB(t testing.TB) *testBundle {
	t.Helper()
	ctx := context.Background()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "ww_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	t.Cleanup(func() {
		// The relays have stopped; their walsenders end a moment later,
		// and the slot cannot be dropped before.
		for i := 0; i < 50; i++ {
			if _, err := m.Down(context.Background(), pool, 0); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		pool.Close()
	})
	return &testBundle{pool: pool, schema: schema}
}

// walDB is logicalDB switched to WAL mode.
func walDB(t testing.TB) *testBundle {
	t.Helper()
	b := logicalDB(t)
	m, err := wharfmigrate.New(b.schema)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(context.Background(), b.pool))
	return b
}

// walRelay starts a relay of b's outbox in WAL mode, recording what it
// delivers (fail, if not nil, decides which deliveries fail); stop stops it
// gracefully (once).
func walRelay(t *testing.T, b *testBundle, fail func(*wharf.Message) error, configure func(*wharf.Config)) (rec *recorder, stop func()) {
	t.Helper()
	_, rec, stop = walRelayClient(t, b, fail, configure)
	return rec, stop
}

// walRelayClient is walRelay that returns the relay's client too.
func walRelayClient(t *testing.T, b *testBundle, fail func(*wharf.Message) error, configure func(*wharf.Config)) (c *wharf.Client, rec *recorder, stop func()) {
	t.Helper()
	c, rec = recordingClient(t, b, configure)
	rec.fail = fail
	require.NoError(t, c.Start(context.Background()))
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			require.NoError(t, c.Stop(context.Background()))
		}
	}
	t.Cleanup(stop)
	return c, rec, stop
}

// enqueueWAL commits msgs in one transaction (EnqueueTx) into b's outbox.
func enqueueWAL(t *testing.T, b *testBundle, msgs ...wharf.Message) []string {
	t.Helper()
	ctx := context.Background()
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := c.EnqueueTx(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return ids
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

// Producers committing concurrently, each with keys of its own: the relay
// streams every message from the slot, delivers each key's messages in the
// order they were committed, with the ids the producers got back, and
// confirms the slot past all of them once they are delivered.
func TestWALRelayDeliversEveryMessageInKeyOrder(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := walRelay(t, b, nil, nil)

	const producers, txs, perTx, keysEach = 4, 60, 25, 5
	var mu sync.Mutex
	var ids []string
	payload := map[string]string{}
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < txs; i++ {
				msgs := make([]wharf.Message, perTx)
				for j := range msgs {
					msgs[j] = wharf.Message{Topic: "orders", Key: fmt.Sprintf("p%d-k%d", p, j%keysEach),
						Payload: []byte(fmt.Sprintf("p%d-%d-%d", p, i, j)), Headers: map[string]string{"n": fmt.Sprint(j)}}
				}
				got := enqueueWAL(t, b, msgs...)
				mu.Lock()
				ids = append(ids, got...)
				for j, id := range got {
					payload[id] = string(msgs[j].Payload)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	requireAllDelivered(t, rec, ids)
	got := rec.snapshot()
	requireKeyOrder(t, got)
	for _, m := range got {
		require.Equal(t, payload[m.ID], string(m.Payload), "message %s", m.ID)
		require.NotEmpty(t, m.Headers["n"])
	}
	require.Len(t, deliveredIDs(got), producers*txs*perTx)

	var last string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&last))
	end, err := walstream.ParseLSN(last)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end-1024 }, 10*time.Second, 50*time.Millisecond,
		"the slot was not confirmed past the delivered messages")
}

// A relay stopped after delivering leaves the slot confirmed: the next relay
// streams only what was committed after, not what was delivered before.
// A relay that stops before delivering leaves it for the next one.
func TestWALRelayResumesFromTheConfirmedPosition(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	msgs := func(tag string, n int) []wharf.Message {
		out := make([]wharf.Message, n)
		for i := range out {
			out[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%7), Payload: []byte(fmt.Sprintf("%s-%d", tag, i))}
		}
		return out
	}
	first := enqueueWAL(t, b, msgs("first", 300)...)
	rec1, stop1 := walRelay(t, b, nil, nil)
	requireAllDelivered(t, rec1, first)
	stop1()

	second := enqueueWAL(t, b, msgs("second", 300)...)
	rec2, stop2 := walRelay(t, b, nil, nil)
	requireAllDelivered(t, rec2, second)
	again := deliveredIDs(rec2.snapshot())
	for _, id := range first {
		require.Zero(t, again[id], "message %s delivered by the first relay came again", id)
	}
	requireKeyOrder(t, rec2.snapshot())
	stop2()

	// A relay whose deliveries all fail settles nothing: the slot stays
	// before the messages, and the next relay delivers them.
	third := enqueueWAL(t, b, msgs("third", 300)...)
	_, stop3 := walRelay(t, b, func(*wharf.Message) error { return errors.New("down") },
		func(cfg *wharf.Config) { cfg.MaxAttempts = 1000 })
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".retries").Scan(&n))
		return n > 0
	}, 10*time.Second, 20*time.Millisecond, "no delivery failed")
	stop3()
	rec4, _ := walRelay(t, b, nil, nil)
	requireAllDelivered(t, rec4, third)
	requireKeyOrder(t, rec4.snapshot())
}

// When the stream breaks (its walsender terminated), the relay starts it
// again from the slot's confirmed position and skips the transactions it
// already holds or settled: every message is delivered once.
func TestWALRelayStreamsAgainAfterTheConnectionDies(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := walRelay(t, b, nil, nil)
	var ids []string
	for round := 0; round < 5; round++ {
		msgs := make([]wharf.Message, 200)
		for i := range msgs {
			msgs[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%9), Payload: []byte(fmt.Sprintf("%d-%d", round, i))}
		}
		ids = append(ids, enqueueWAL(t, b, msgs...)...)
		var n int
		require.Eventually(t, func() bool {
			require.NoError(t, b.pool.QueryRow(context.Background(),
				"SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", b.schema).Scan(&n))
			return n == 1
		}, 10*time.Second, 10*time.Millisecond, "no walsender streams the slot")
	}
	requireAllDelivered(t, rec, ids)
	got := rec.snapshot()
	requireKeyOrder(t, got)
	for id, n := range deliveredIDs(got) {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
}

// A message whose delivery fails is retried from memory with a retry record
// in the table, its key's later messages wait behind it, other keys go on;
// a message that fails MaxAttempts times becomes a dead letter with its
// content, and the key goes on after it. The slot is confirmed past them
// only once they are settled.
func TestWALRelayRetriesAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	var failMu sync.Mutex
	fails := map[string]int{"slow-0": 3} // payload → failures left
	cured := false                       // the poison message is delivered from now on
	rec, _ := walRelay(t, b, func(m *wharf.Message) error {
		failMu.Lock()
		defer failMu.Unlock()
		if string(m.Payload) == "poison" && !cured {
			return errors.New("poison")
		}
		if fails[string(m.Payload)] > 1 {
			fails[string(m.Payload)]--
			return errors.New("not yet")
		}
		return nil
	}, func(cfg *wharf.Config) { cfg.MaxAttempts = 3 })
	var all []wharf.Message
	for i := 0; i < 5; i++ {
		all = append(all, wharf.Message{Topic: "t", Key: "slow", Payload: []byte(fmt.Sprintf("slow-%d", i))})
		all = append(all, wharf.Message{Topic: "t", Key: "other", Payload: []byte(fmt.Sprintf("other-%d", i))})
	}
	all = append(all, wharf.Message{Topic: "t", Key: "bad", Payload: []byte("poison"), Headers: map[string]string{"h": "v"}},
		wharf.Message{Topic: "t", Key: "bad", Payload: []byte("after-poison")})
	ids := enqueueWAL(t, b, all...)
	good := append(append([]string{}, ids[:10]...), ids[11])
	requireAllDelivered(t, rec, good)
	got := rec.snapshot()
	requireKeyOrder(t, got)

	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	var dead []wharf.DeadLetter
	require.Eventually(t, func() bool {
		dead, err = c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
		require.NoError(t, err)
		return len(dead) == 1
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, ids[10], dead[0].ID)
	require.Equal(t, "poison", string(dead[0].Payload))
	require.Equal(t, "bad", dead[0].Key)
	require.Equal(t, map[string]string{"h": "v"}, dead[0].Headers)
	require.Equal(t, 3, dead[0].Attempts)

	// Sent again, the dead letter keeps its id and is delivered once the
	// sink takes it.
	failMu.Lock()
	cured = true
	failMu.Unlock()
	n, err := c.RetryDeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireAllDelivered(t, rec, ids[10:11])
	dead, err = c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)
	for _, m := range rec.snapshot() {
		if m.ID == ids[10] {
			require.Equal(t, "poison", string(m.Payload))
			require.Equal(t, map[string]string{"h": "v"}, m.Headers)
		}
	}

	// The retry record of the slow message was written while it failed
	// and removed when it was delivered.
	require.Eventually(t, func() bool {
		var retries int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".retries").Scan(&retries))
		return retries == 0
	}, 10*time.Second, 20*time.Millisecond, "retry records left")
	var last string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&last))
	end, err := walstream.ParseLSN(last)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end-1024 }, 10*time.Second, 50*time.Millisecond)
}

// A logical message of the outbox's prefix that is not a Wharf content
// cannot be delivered; it becomes a dead letter of topic wharf.undecodable
// with the raw content, and the messages around it are delivered.
func TestWALRelayDeadLettersUndecodableContent(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := walRelay(t, b, nil, nil)
	before := enqueueWAL(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("before")})
	_, err := b.pool.Exec(context.Background(), "SELECT pg_logical_emit_message(true, $1, '\\x0900000001ff'::bytea)", b.schema)
	require.NoError(t, err)
	after := enqueueWAL(t, b, wharf.Message{Topic: "t", Key: "k", Payload: []byte("after")})
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
}

// Two relays of one WAL outbox: one streams the slot, the other stands by
// and delivers nothing; when the first stops, the other takes every lane
// and the slot, and delivers what comes next, not what was delivered before.
func TestWALRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	batch := func(tag string) []string {
		msgs := make([]wharf.Message, 200)
		for i := range msgs {
			msgs[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%11), Payload: []byte(fmt.Sprintf("%s-%d", tag, i))}
		}
		return enqueueWAL(t, b, msgs...)
	}
	first := batch("first")
	recA, stopA := walRelay(t, b, nil, func(cfg *wharf.Config) { cfg.RelayID = "relay-a" })
	requireAllDelivered(t, recA, first)
	recB, _ := walRelay(t, b, nil, func(cfg *wharf.Config) { cfg.RelayID = "relay-b" })
	second := batch("second")
	requireAllDelivered(t, recA, second)
	require.Empty(t, recB.snapshot(), "the standby delivered while the other relay streams")
	require.Equal(t, 64, leasedLanes(t, b, "relay-a"))

	stopA()
	third := batch("third")
	requireAllDelivered(t, recB, third)
	require.Equal(t, 64, leasedLanes(t, b, "relay-b"))
	got := deliveredIDs(recB.snapshot())
	for _, id := range append(first, second...) {
		require.Zero(t, got[id], "message %s delivered before the takeover came again", id)
	}
}

// Drain returns once everything committed before it started is delivered:
// the stream's first empty fetches, before it reached the WAL end it
// started at, do not count as an empty outbox. An empty outbox drains at
// once.
func TestWALDrainDeliversTheBacklogAndReturns(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	var ids []string
	for i := 0; i < 20; i++ {
		msgs := make([]wharf.Message, 500)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", j%13), Payload: []byte(fmt.Sprintf("%d-%d", i, j))}
		}
		ids = append(ids, enqueueWAL(t, b, msgs...)...)
	}
	drain := func() *recorder {
		c, rec := recordingClient(t, b, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Drain(ctx))
		return rec
	}
	rec := drain()
	got := deliveredIDs(rec.snapshot())
	for _, id := range ids {
		require.NotZero(t, got[id], "message %s not delivered when Drain returned", id)
	}
	requireKeyOrder(t, rec.snapshot())

	start := time.Now()
	rec = drain()
	require.Empty(t, rec.snapshot())
	require.Less(t, time.Since(start), 10*time.Second)
}

// A message scheduled for later is not delivered before its time, holds the
// later messages of its key, and not other keys.
func TestWALRelayScheduledMessages(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	rec, _ := walRelay(t, b, nil, nil)
	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT now()").Scan(&dbNow))
	at := dbNow.Add(1500 * time.Millisecond)
	ids := enqueueWAL(t, b,
		wharf.Message{Topic: "t", Key: "later", Payload: []byte("scheduled"), DeliverAt: at},
		wharf.Message{Topic: "t", Key: "later", Payload: []byte("behind")},
		wharf.Message{Topic: "t", Key: "now", Payload: []byte("free")})
	requireAllDelivered(t, rec, ids[2:])
	require.Len(t, rec.snapshot(), 1, "a message of the scheduled key went out early")
	requireAllDelivered(t, rec, ids)
	var deliveredAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT now()").Scan(&deliveredAt))
	require.False(t, deliveredAt.Before(at), "delivered at %v, scheduled for %v", deliveredAt, at)
	got := rec.snapshot()
	require.Equal(t, "scheduled", string(got[1].Payload))
	require.Equal(t, "behind", string(got[2].Payload))
}

// Producers commit keyed messages (synchronous_commit on, so a crash loses
// no acknowledged commit) while PostgreSQL is restarted and then crashed
// under a running relay: every committed message is delivered, each key's
// first deliveries in order.
func TestWALRelaySurvivesPostgresRestartAndCrash(t *testing.T) {
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
	schema := "ww_restart"
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	b := &testBundle{pool: pool, schema: schema}
	rec, _ := walRelay(t, b, nil, nil)

	producer, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	var mu sync.Mutex
	var committed []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			msgs := make([]wharf.Message, 20)
			for j := range msgs {
				msgs[j] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", j%10), Payload: []byte(fmt.Sprintf("%d-%d", i, j))}
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ids, err := producer.Enqueue(cctx, msgs...)
			cancel()
			if err != nil {
				time.Sleep(50 * time.Millisecond) // the server is down: try again
				continue
			}
			mu.Lock()
			committed = append(committed, ids...)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for _, mode := range []string{"fast", "immediate"} {
		time.Sleep(time.Second)
		require.NoError(t, cluster.StopServer(mode))
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, cluster.StartServer(ctx))
	}
	time.Sleep(time.Second)
	close(stop)
	<-done
	mu.Lock()
	ids := append([]string(nil), committed...)
	mu.Unlock()
	require.Greater(t, len(ids), 1000)
	require.Eventually(t, func() bool {
		got := deliveredIDs(rec.snapshot())
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "committed messages not delivered after the restarts")
	requireKeyOrder(t, rec.snapshot())
}

// A backlog many times the relay's memory budget: the store stops reading
// the stream while it holds twice MaxBufferedBytes (the walsender then
// waits: what it sent stays far behind the WAL end), and goes on as
// deliveries free room; everything arrives, keys in order.
func TestWALRelayBacklogLargerThanItsMemory(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	var startLSN string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&startLSN))
	payload := make([]byte, 2000)
	var ids []string
	for i := 0; i < 60; i++ {
		msgs := make([]wharf.Message, 500)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", j%50), Payload: payload}
		}
		ids = append(ids, enqueueWAL(t, b, msgs...)...)
	}
	var total int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", startLSN).Scan(&total))
	// 30,000 messages of 2,000 bytes (about 60 MB of WAL) against a budget
	// of 2 × 1 MiB, delivered one at a time at about a millisecond each
	// until the check. Between the walsender and the store, the sockets'
	// buffers hold about 10 MB more on loopback (measured: 15 MB sent).
	var fast atomic.Bool
	relay, rec, _ := walRelayClient(t, b, func(*wharf.Message) error {
		if !fast.Load() {
			time.Sleep(time.Millisecond)
		}
		return nil
	},
		func(cfg *wharf.Config) {
			cfg.MaxBufferedBytes, cfg.MaxBuffered, cfg.FetchBatch, cfg.HandlerConcurrency = 1<<20, 500, 100, 1
		})
	require.Eventually(t, func() bool { return len(rec.snapshot()) > 200 }, 20*time.Second, 10*time.Millisecond)
	time.Sleep(time.Second) // a relay that did not stop reading has read everything by now
	var sent int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(sent_lsn, $2::pg_lsn)::bigint FROM pg_stat_replication r
JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, b.schema, startLSN).Scan(&sent))
	require.Less(t, sent, total/2, "the walsender sent %d of %d bytes while %d messages were delivered: the relay did not stop reading", sent, total, len(rec.snapshot()))
	t.Logf("sent %d of %d bytes after %d deliveries", sent, total, len(rec.snapshot()))
	// The metrics show it: what is held stays within the budget and one
	// transaction (500 messages) more; the lag is most of the backlog.
	held, lag := relay.Metrics().WALHeldBytes.Load(), relay.Metrics().WALLagBytes.Load()
	require.Positive(t, held)
	require.LessOrEqual(t, held, int64(2<<20+500*(2000+256)))
	require.Greater(t, lag, total/2)
	fast.Store(true)
	require.Eventually(t, func() bool { return len(deliveredIDs(rec.snapshot())) >= len(ids) }, time.Minute, 50*time.Millisecond)
	requireAllDelivered(t, rec, ids)
	requireKeyOrder(t, rec.snapshot())
	require.Eventually(t, func() bool { return relay.Metrics().WALHeldBytes.Load() == 0 }, 10*time.Second, 20*time.Millisecond)
}
