package wharf_test

import (
	"context"
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
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// The conformance suite: the guarantees the README states, run against both
// layouts of the outbox (rows in a table, logical messages in the WAL) with
// the same producers, relays and assertions. A scenario asserts the
// behaviour both layouts promise; where the layouts differ by design (what
// settles a message, whether a second relay shares the lanes or stands by)
// the layout says what it expects.

// layout is one of the outbox's two layouts.
type layout struct {
	name string
	wal  bool
}

var layouts = []layout{{name: "table"}, {name: "wal", wal: true}}

// db gives a scenario an outbox of this layout on a cluster with
// wal_level=logical (both layouts on the same server).
func (l layout) db(t testing.TB) *testBundle {
	if l.wal {
		return walDB(t)
	}
	return logicalDB(t)
}

// migrate makes schema an outbox of this layout on pool.
func (l layout) migrate(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(context.Background(), pool)
	require.NoError(t, err)
	if l.wal {
		require.NoError(t, m.SetWALMode(context.Background(), pool))
	}
}

// requireSettled waits until the outbox keeps nothing of what was delivered:
// no retry record, and then an empty outbox table, or a slot confirmed up to
// the WAL written so far.
func (l layout) requireSettled(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".retries").Scan(&n))
		return n == 0
	}, time.Minute, 20*time.Millisecond, "retry records left")
	if !l.wal {
		require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond,
			"delivered messages left in the outbox")
		return
	}
	end := b.committedTo()
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= end }, time.Minute, 50*time.Millisecond,
		"the slot was not confirmed past the last commit (%s)", end)
}

// logicalDB gives a test a migrated schema (table mode) on a cluster with
// wal_level=logical (the shared test server may run with replica), dropped
// at cleanup with whatever WAL mode created.
func logicalDB(t testing.TB) *testBundle {
	t.Helper()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	pool, schema, m := migratedSchema(t, url, "ww_")
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

// runRelay starts a relay of b's outbox, recording what it delivers (fail,
// if not nil, decides which deliveries fail); stop stops it gracefully
// (once).
func runRelay(t *testing.T, b *testBundle, fail func(*wharf.Message) error, configure func(*wharf.Config)) (rec *recorder, stop func()) {
	t.Helper()
	_, rec, stop = runRelayClient(t, b, fail, configure)
	return rec, stop
}

// runRelayClient is runRelay that returns the relay's client too.
func runRelayClient(t *testing.T, b *testBundle, fail func(*wharf.Message) error, configure func(*wharf.Config)) (c *wharf.Client, rec *recorder, stop func()) {
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

// commitMessages commits msgs in one transaction (EnqueueTx) into b's
// outbox, whatever its layout, and returns their ids; b.committedTo is past
// the commit then.
func commitMessages(t *testing.T, b *testBundle, msgs ...wharf.Message) []string {
	t.Helper()
	ctx := context.Background()
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := c.EnqueueTx(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var lsn string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn))
	end, err := walstream.ParseLSN(lsn)
	require.NoError(t, err)
	b.mu.Lock()
	b.committed = max(b.committed, end)
	b.mu.Unlock()
	return ids
}

// keyed is n messages of topic t over keys k0…k(keys-1), payloads tag-i.
func keyed(tag string, n, keys int) []wharf.Message {
	out := make([]wharf.Message, n)
	for i := range out {
		out[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(fmt.Sprintf("%s-%d", tag, i))}
	}
	return out
}

func TestConformance(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(*testing.T, layout)
	}{
		{"EveryMessageInKeyOrder", conformEveryMessageInKeyOrder},
		{"ResumesWhereTheLastRelayStopped", conformResumes},
		{"SinkOutage", conformSinkOutage},
		{"PoisonDeadLettersAndReplayInOrder", conformPoisonAndReplay},
		{"ScheduledHoldsOnlyItsKey", conformScheduled},
		{"SecondRelayTakesOver", conformTakeover},
		{"Drain", conformDrain},
		{"PostgresRestartAndCrash", conformPostgresRestart},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, l)
				})
			}
		})
	}
}

// Producers committing concurrently, each with keys of its own: every
// message is delivered with the id its producer got back, its payload and
// headers, each key's in commit order, and then settled.
func conformEveryMessageInKeyOrder(t *testing.T, l layout) {
	b := l.db(t)
	rec, _ := runRelay(t, b, nil, nil)

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
				got := commitMessages(t, b, msgs...)
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
	l.requireSettled(t, b)
}

// A relay stopped after delivering leaves its messages settled: the next
// relay delivers only what was committed after, not what was delivered
// before. A relay whose deliveries all fail settles nothing, and the next
// one delivers those messages.
func conformResumes(t *testing.T, l layout) {
	b := l.db(t)
	first := commitMessages(t, b, keyed("first", 300, 7)...)
	rec1, stop1 := runRelay(t, b, nil, nil)
	requireAllDelivered(t, rec1, first)
	stop1()

	second := commitMessages(t, b, keyed("second", 300, 7)...)
	rec2, stop2 := runRelay(t, b, nil, nil)
	requireAllDelivered(t, rec2, second)
	again := deliveredIDs(rec2.snapshot())
	for _, id := range first {
		require.Zero(t, again[id], "message %s delivered by the first relay came again", id)
	}
	requireKeyOrder(t, rec2.snapshot())
	stop2()

	third := commitMessages(t, b, keyed("third", 300, 7)...)
	_, stop3 := runRelay(t, b, func(*wharf.Message) error { return errors.New("down") },
		func(cfg *wharf.Config) { cfg.MaxAttempts = 1000 })
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".retries").Scan(&n))
		return n > 0
	}, time.Minute, 20*time.Millisecond, "no delivery failed")
	stop3()
	rec4, _ := runRelay(t, b, nil, nil)
	requireAllDelivered(t, rec4, third)
	requireKeyOrder(t, rec4.snapshot())
	l.requireSettled(t, b)
}

// The sink is down for a while (every delivery fails) while producers go on
// committing: nothing is lost or dead-lettered, each key's first deliveries
// stay in commit order, and once the sink is back everything is delivered
// and settled.
func conformSinkOutage(t *testing.T, l layout) {
	b := l.db(t)
	var down atomic.Bool
	var failed atomic.Int64
	rec, _ := runRelay(t, b, func(*wharf.Message) error {
		if down.Load() {
			failed.Add(1)
			return errors.New("broker unavailable")
		}
		return nil
	}, func(cfg *wharf.Config) { cfg.MaxAttempts = 1000 })

	var ids []string
	for i := 0; i < 10; i++ {
		ids = append(ids, commitMessages(t, b, keyed(fmt.Sprintf("before%d", i), 100, 17)...)...)
	}
	down.Store(true)
	for i := 0; i < 20; i++ {
		ids = append(ids, commitMessages(t, b, keyed(fmt.Sprintf("during%d", i), 100, 17)...)...)
		time.Sleep(50 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return failed.Load() > 0 }, time.Minute, 10*time.Millisecond,
		"no delivery was attempted during the outage")
	down.Store(false)
	for i := 0; i < 10; i++ {
		ids = append(ids, commitMessages(t, b, keyed(fmt.Sprintf("after%d", i), 100, 17)...)...)
	}
	requireAllDelivered(t, rec, ids)
	requireKeyOrder(t, rec.snapshot())
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	dead, err := c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)
	l.requireSettled(t, b)
	t.Logf("%d deliveries failed during the outage", failed.Load())
}

// A message whose delivery fails is retried, its key's later messages wait
// behind it and other keys go on; a message that fails MaxAttempts times
// becomes a dead letter with its content, and its key goes on after it.
// Sent again, a key's dead letters keep their ids and content and are
// delivered in their commit order.
func conformPoisonAndReplay(t *testing.T, l layout) {
	b := l.db(t)
	var failMu sync.Mutex
	fails := map[string]int{"slow-0": 2} // payload → failures left
	cured := false                       // poison is delivered from now on
	rec, _ := runRelay(t, b, func(m *wharf.Message) error {
		failMu.Lock()
		defer failMu.Unlock()
		if m.Key == "bad" && string(m.Payload) != "after-poison" && !cured {
			return errors.New("poison")
		}
		if fails[string(m.Payload)] > 0 {
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
	for i := 0; i < 3; i++ {
		all = append(all, wharf.Message{Topic: "t", Key: "bad", Payload: []byte(fmt.Sprintf("poison-%d", i)),
			Headers: map[string]string{"h": fmt.Sprint(i)}})
	}
	all = append(all, wharf.Message{Topic: "t", Key: "bad", Payload: []byte("after-poison")})
	ids := commitMessages(t, b, all...)
	poison := ids[10:13]
	good := append(append([]string{}, ids[:10]...), ids[13])
	requireAllDelivered(t, rec, good)
	requireKeyOrder(t, rec.snapshot())

	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	var dead []wharf.DeadLetter
	require.Eventually(t, func() bool {
		dead, err = c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
		require.NoError(t, err)
		return len(dead) == 3
	}, time.Minute, 50*time.Millisecond)
	for i, d := range dead {
		require.Contains(t, poison, d.ID)
		require.Equal(t, "bad", d.Key)
		require.Equal(t, 3, d.Attempts, "dead letter %d", i)
	}

	failMu.Lock()
	cured = true
	failMu.Unlock()
	n, err := c.RetryDeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	requireAllDelivered(t, rec, poison)
	var replayed []wharf.Message
	for _, m := range rec.snapshot() {
		if m.Key == "bad" && m.ID != ids[13] {
			replayed = append(replayed, m)
		}
	}
	require.Len(t, replayed, 3, "each dead letter delivered once")
	for i, m := range replayed {
		require.Equal(t, poison[i], m.ID, "dead letters delivered out of their commit order")
		require.Equal(t, fmt.Sprintf("poison-%d", i), string(m.Payload))
		require.Equal(t, map[string]string{"h": fmt.Sprint(i)}, m.Headers)
	}
	dead, err = c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)
	l.requireSettled(t, b)
}

// A message scheduled for later is not delivered before its time, holds the
// later messages of its key, and not other keys.
func conformScheduled(t *testing.T, l layout) {
	b := l.db(t)
	rec, _ := runRelay(t, b, nil, nil)
	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT now()").Scan(&dbNow))
	at := dbNow.Add(1500 * time.Millisecond)
	ids := commitMessages(t, b,
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
	l.requireSettled(t, b)
}

// A second relay joins a running one: between them every message is
// delivered once. In WAL mode the second stands by and delivers nothing
// while the first streams; in table mode they share the lanes. When the
// first stops, the second holds every lane and delivers what comes next,
// and nothing the first delivered comes again.
func conformTakeover(t *testing.T, l layout) {
	b := l.db(t)
	first := commitMessages(t, b, keyed("first", 200, 11)...)
	recA, stopA := runRelay(t, b, nil, func(cfg *wharf.Config) { cfg.RelayID = "relay-a" })
	requireAllDelivered(t, recA, first)
	recB, _ := runRelay(t, b, nil, func(cfg *wharf.Config) { cfg.RelayID = "relay-b" })
	if !l.wal {
		require.Eventually(t, func() bool { return leasedLanes(t, b, "relay-b") > 0 }, time.Minute, 20*time.Millisecond,
			"the second relay took no lane")
	}
	second := commitMessages(t, b, keyed("second", 200, 11)...)
	both := func() []wharf.Message { return append(recA.snapshot(), recB.snapshot()...) }
	require.Eventually(t, func() bool {
		got := deliveredIDs(both())
		for _, id := range second {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond)
	if l.wal {
		require.Empty(t, recB.snapshot(), "the standby delivered while the other relay streams")
		require.Equal(t, 64, leasedLanes(t, b, "relay-a"))
	}

	stopA()
	third := commitMessages(t, b, keyed("third", 200, 11)...)
	requireAllDelivered(t, recB, third)
	require.Eventually(t, func() bool { return leasedLanes(t, b, "relay-b") == 64 }, time.Minute, 20*time.Millisecond)
	for id, n := range deliveredIDs(both()) {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
	requireKeyOrder(t, recA.snapshot())
	requireKeyOrder(t, recB.snapshot())
	l.requireSettled(t, b)
}

// Drain returns once everything committed before it started is delivered;
// an empty outbox drains at once.
func conformDrain(t *testing.T, l layout) {
	b := l.db(t)
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, commitMessages(t, b, keyed(fmt.Sprint(i), 500, 13)...)...)
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
	l.requireSettled(t, b)
}

// Producers commit keyed messages (synchronous_commit on, so a crash loses
// no acknowledged commit) while PostgreSQL is restarted and then crashed
// under a running relay: every committed message is delivered, each key's
// first deliveries in order. In WAL mode the slot survives both.
func conformPostgresRestart(t *testing.T, l layout) {
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
	schema := "wc_restart"
	l.migrate(t, pool, schema)
	b := &testBundle{pool: pool, schema: schema}
	rec, _ := runRelay(t, b, nil, nil)

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
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ids, err := producer.Enqueue(cctx, keyed(fmt.Sprint(i), 20, 10)...)
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
	// Each phase (before the restart, between it and the crash, after the
	// crash) lasts until 400 more messages committed, however slow the
	// machine: the relay sees traffic on both sides of each outage.
	want := 0
	waitCommitted := func() {
		want += 400
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(committed) >= want
		}, 5*time.Minute, 10*time.Millisecond, "the producer did not commit %d messages", want)
	}
	for _, mode := range []string{"fast", "immediate"} {
		waitCommitted()
		require.NoError(t, cluster.StopServer(mode))
		time.Sleep(300 * time.Millisecond) // down for a moment: the relay's round trips fail
		require.NoError(t, cluster.StartServer(ctx))
	}
	waitCommitted()
	close(stop)
	<-done
	mu.Lock()
	ids := append([]string(nil), committed...)
	mu.Unlock()
	require.Greater(t, len(ids), 1000)
	requireAllDeliveredWithin(t, rec, ids, 60*time.Second, "committed messages not delivered after the restarts")
	requireKeyOrder(t, rec.snapshot())
	if l.wal {
		var slots int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", schema).Scan(&slots))
		require.Equal(t, 1, slots, "the slot did not survive the restarts")
	}
}
