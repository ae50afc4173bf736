package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
)

// Producers on several connections commit and roll back interleaved batches
// while a relay runs: every committed message arrives, no rolled-back one does,
// and each key's messages arrive in id order.
func TestConcurrentProducersDeliverCommittedInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))

	const producers, txPerProducer, perTx, keys = 6, 60, 25, 200
	var mu sync.Mutex
	committed := map[string]bool{}
	rolledBack := map[string]bool{}
	g, gctx := errgroup.WithContext(ctx)
	for p := 0; p < producers; p++ {
		g.Go(func() error {
			for i := 0; i < txPerProducer; i++ {
				msgs := make([]wharf.Message, perTx)
				for j := range msgs {
					msgs[j] = wharf.Message{
						Topic:   "orders",
						Key:     fmt.Sprintf("k%d", (p*7919+i*31+j)%keys),
						Payload: []byte(fmt.Sprintf(`{"p":%d,"i":%d,"j":%d}`, p, i, j)),
					}
				}
				tx, err := b.pool.Begin(gctx)
				if err != nil {
					return err
				}
				// Serialise writes per key as an aggregate's row lock would
				// (sorted, so producers never deadlock): the precondition
				// under which id order is commit order.
				if _, err := tx.Exec(gctx, `SELECT pg_advisory_xact_lock(hashtext(k)) FROM (SELECT DISTINCT k FROM unnest($1::text[]) k ORDER BY k) s`, keysOf(msgs)); err != nil {
					_ = tx.Rollback(gctx)
					return err
				}
				ids, err := client.EnqueueTx(gctx, tx, msgs...)
				if err != nil {
					_ = tx.Rollback(gctx)
					return err
				}
				rollback := i%5 == 3
				if rollback {
					err = tx.Rollback(gctx)
				} else {
					err = tx.Commit(gctx)
				}
				if err != nil {
					return err
				}
				mu.Lock()
				for _, id := range ids {
					if rollback {
						rolledBack[id] = true
					} else {
						committed[id] = true
					}
				}
				mu.Unlock()
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())

	require.Eventually(t, func() bool {
		got := deliveredIDs(rec.snapshot())
		for id := range committed {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "not every committed message was delivered")
	require.NoError(t, client.Stop(ctx))

	got := rec.snapshot()
	for _, m := range got {
		require.Falsef(t, rolledBack[m.ID], "rolled-back message %d was delivered", m.ID)
		require.Truef(t, committed[m.ID], "unknown message %d delivered", m.ID)
	}
	requireKeyOrder(t, got)
	require.Equal(t, producers*txPerProducer*perTx*4/5, len(committed))
	require.Equal(t, 0, outboxCount(t, b), "delivered rows must be removed")
}

// A transaction that enqueues the lowest id and commits late is still
// delivered, after the others; a transaction left open does not hold anyone up.
func TestLateCommitIsDeliveredAndLongTransactionDoesNotStall(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)

	// Open for the whole test: it holds an xid (and the oldest snapshot) and
	// its message must never block the others.
	idle, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = idle.Rollback(ctx) }()
	_, err = client.EnqueueTx(ctx, idle, wharf.Message{Topic: "t", Key: "idle", Payload: []byte(`"never"`)})
	require.NoError(t, err)

	txA, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	idsA, err := client.EnqueueTx(ctx, txA, wharf.Message{Topic: "t", Key: "K1", Payload: []byte(`"a"`)})
	require.NoError(t, err)

	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()

	idsB, err := client.Enqueue(ctx,
		wharf.Message{Topic: "t", Key: "K2", Payload: []byte(`"b2"`)},
		wharf.Message{Topic: "t", Key: "K3", Payload: []byte(`"b3"`)})
	require.NoError(t, err)
	require.Less(t, idsA[0], idsB[0], "A must hold the lower id")

	waitDelivered(t, rec, idsB...)
	require.Zero(t, deliveredIDs(rec.snapshot())[idsA[0]], "A is not committed yet")

	require.NoError(t, txA.Commit(ctx))
	waitDelivered(t, rec, idsA...)

	idsC, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "K1", Payload: []byte(`"c"`)})
	require.NoError(t, err)
	waitDelivered(t, rec, idsC...)

	got := rec.snapshot()
	requireKeyOrder(t, got)
	pos := map[string]int{}
	for i, m := range got {
		if _, ok := pos[m.ID]; !ok {
			pos[m.ID] = i
		}
	}
	require.Less(t, pos[idsA[0]], pos[idsC[0]], "K1: the late-committed message must arrive before the later one")
	for _, m := range got {
		require.NotEqual(t, "idle", m.Key, "an uncommitted message was delivered")
	}
}

func keysOf(msgs []wharf.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Key
	}
	return out
}

func waitDelivered(t *testing.T, rec *recorder, ids ...string) {
	t.Helper()
	var missing []string
	ok := assert.Eventually(t, func() bool {
		got := deliveredIDs(rec.snapshot())
		missing = missing[:0]
		for _, id := range ids {
			if got[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0
	}, time.Minute, 10*time.Millisecond)
	if !ok {
		t.Fatalf("%d of %d messages not delivered; first missing: %v", len(missing), len(ids), missing[:min(len(missing), 20)])
	}
}

// A message scheduled for later is not delivered before its time, and holds
// back later messages of its key; other keys flow.
func TestScheduledMessageWaitsForDeliverAt(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	type stamped struct {
		id string
		at time.Time
	}
	var mu sync.Mutex
	var got []stamped
	cfg := testConfig(b.schema)
	cfg.Handler = func(_ context.Context, m *wharf.Message) error {
		mu.Lock()
		got = append(got, stamped{m.ID, time.Now()})
		mu.Unlock()
		return nil
	}
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()

	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	at := dbNow.Add(1500 * time.Millisecond)
	ids, err := client.Enqueue(ctx,
		wharf.Message{Topic: "t", Key: "s", Payload: []byte(`1`), DeliverAt: at},
		wharf.Message{Topic: "t", Key: "s", Payload: []byte(`2`)},
		wharf.Message{Topic: "t", Key: "other", Payload: []byte(`3`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	}, time.Minute, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	when := map[string]time.Time{}
	order := []string{}
	for _, s := range got {
		when[s.id] = s.at
		order = append(order, s.id)
	}
	require.False(t, when[ids[0]].Before(at), "scheduled message delivered %s early", at.Sub(when[ids[0]]))
	require.False(t, when[ids[1]].Before(when[ids[0]]), "its key's next message must wait for it")
	require.True(t, when[ids[2]].Before(at), "another key must not wait")
	require.Equal(t, ids[2], order[0])
}

// A key whose messages always fail is retried with growing delays, moves to
// the dead-letter table with its error after MaxAttempts, and holds back only
// its own key; retrying dead letters redelivers them.
func TestPoisonMessageRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	healed := false
	rec := &recorder{fail: func(m *wharf.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Key == "poison" && !healed {
			attempts[m.ID] = append(attempts[m.ID], time.Now())
			return fmt.Errorf("boom %d", m.Attempt)
		}
		return nil
	}}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	cfg.MaxAttempts = 4
	cfg.RetryBackoff = 100 * time.Millisecond
	cfg.MaxRetryBackoff = time.Second
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))

	var msgs []wharf.Message
	msgs = append(msgs, wharf.Message{Topic: "t", Key: "poison", Payload: []byte(`"p1"`)})
	for i := 0; i < 50; i++ {
		msgs = append(msgs, wharf.Message{Topic: "t", Key: fmt.Sprintf("ok%d", i%5), Payload: []byte(`"ok"`)})
	}
	msgs = append(msgs, wharf.Message{Topic: "t", Key: "poison", Payload: []byte(`"p2"`)})
	ids, err := client.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	poison1, poison2 := ids[0], ids[len(ids)-1]

	// The healthy keys are not held up by the poison key's backoff.
	waitDelivered(t, rec, ids[1:len(ids)-1]...)
	require.Eventually(t, func() bool {
		var n int
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".dead_letters").Scan(&n)
		return n == 2
	}, time.Minute, 20*time.Millisecond, "both poison messages must reach the dead-letter table")
	require.NoError(t, client.Stop(ctx))

	mu.Lock()
	a1 := attempts[poison1]
	require.Len(t, a1, 4, "first poison message: MaxAttempts deliveries")
	require.Len(t, attempts[poison2], 4, "second poison message runs only after the first was dead-lettered")
	require.True(t, attempts[poison2][0].After(a1[3]), "key order: p2 only after p1 left")
	// Backoff grows: with equal jitter, gap n is within [base*2^(n-1)/2, base*2^(n-1)].
	for n := 1; n < len(a1); n++ {
		gap := a1[n].Sub(a1[n-1])
		lo := time.Duration(100<<(n-1)) * time.Millisecond / 2
		require.GreaterOrEqualf(t, gap, lo-10*time.Millisecond, "retry %d came after %s, before its backoff", n, gap)
	}
	mu.Unlock()

	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, poison1, dead[0].ID)
	require.Equal(t, 4, dead[0].Attempts)
	require.Equal(t, "boom 4", dead[0].LastError)
	require.Equal(t, `"p1"`, string(dead[0].Payload))

	// Fix the consumer and retry: both come back, in order.
	mu.Lock()
	healed = true
	mu.Unlock()
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, client.Drain(ctx))
	var redelivered []string
	for _, m := range rec.snapshot() {
		if m.Key == "poison" {
			redelivered = append(redelivered, m.ID)
		}
	}
	require.Equal(t, []string{poison1, poison2}, redelivered)
	dead, err = client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)
	require.Equal(t, 0, outboxCount(t, b))
}

// Permanent failures skip the retries.
func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	calls := 0
	cfg := testConfig(b.schema)
	cfg.Handler = func(context.Context, *wharf.Message) error {
		calls++
		return wharf.Permanent(errors.New("schema mismatch"))
	}
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	_, err = client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	require.NoError(t, err)
	require.NoError(t, client.Drain(ctx))
	require.Equal(t, 1, calls)
	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Contains(t, dead[0].LastError, "schema mismatch")
	require.Equal(t, 1, dead[0].Attempts)
}

// Enqueue through pgx, database/sql and SQL agree, and dedup keys make a
// second enqueue a no-op.
func TestEnqueueAPIsAndDedup(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	client, err := wharf.NewClient(b.pool, testConfig(b.schema))
	require.NoError(t, err)
	ids, err := client.Enqueue(ctx,
		wharf.Message{Topic: "a", Key: "k", Payload: []byte(`{"x":1}`), Headers: map[string]string{"h": "v"}},
		wharf.Message{Topic: "a", DedupKey: "once", Payload: []byte{0, 1, 2}},
		wharf.Message{Topic: "a", Payload: nil})
	require.NoError(t, err)
	require.Len(t, ids, 3)
	again, err := client.Enqueue(ctx,
		wharf.Message{Topic: "a", Payload: []byte(`1`)},
		wharf.Message{Topic: "a", DedupKey: "once", Payload: []byte(`"dup"`)})
	require.NoError(t, err)
	require.Equal(t, ids[1], again[1], "a duplicate returns the original id")
	require.Greater(t, again[0], ids[2])

	var sqlID string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+`.enqueue('a', 'k', '{"y":2}', '{"h":"w"}')`).Scan(&sqlID))
	var dupID string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+`.enqueue('a', 'k', '1', '{}', NULL, 'once')`).Scan(&dupID))
	require.Equal(t, ids[1], dupID)

	_, err = client.Enqueue(ctx, wharf.Message{Payload: []byte(`1`)})
	require.ErrorContains(t, err, "Topic is required")
	_, err = b.pool.Exec(ctx, "SELECT "+b.schema+`.enqueue('', 'k', '1')`)
	require.ErrorContains(t, err, "topic is required")
	_, err = b.pool.Exec(ctx, "SELECT "+b.schema+`.enqueue('t', 'k', '1', '{"n":1}')`)
	require.ErrorContains(t, err, "header values must be strings")

	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	relay, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, relay.Drain(ctx))
	got := map[string]wharf.Message{}
	for _, m := range rec.snapshot() {
		got[m.ID] = m
	}
	require.Len(t, got, 5)
	require.Equal(t, map[string]string{"h": "v"}, got[ids[0]].Headers)
	require.Equal(t, "k", got[ids[0]].Key)
	require.Equal(t, []byte{0, 1, 2}, got[ids[1]].Payload)
	require.Equal(t, "", got[ids[1]].Key)
	require.Equal(t, `{"y": 2}`, string(got[sqlID].Payload))
	require.Equal(t, map[string]string{"h": "w"}, got[sqlID].Headers)
	require.Equal(t, 1, got[sqlID].Attempt)
}

// The relay refuses to start on a schema that was never migrated.
func TestRelayRequiresMigratedSchema(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	cfg := testConfig("wt_never_migrated")
	cfg.Handler = func(context.Context, *wharf.Message) error { return nil }
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	err = client.Start(context.Background())
	require.ErrorIs(t, err, wharf.ErrNotMigrated)
	require.ErrorContains(t, err, "run `wharf migrate up`")

	_, err = wharf.NewClient(b.pool, &wharf.Config{Schema: "Bad-Name"})
	require.ErrorContains(t, err, `Config.Schema: invalid schema name "Bad-Name"`)
	_, err = wharf.NewClient(b.pool, &wharf.Config{LeaseTTL: time.Second, RebalanceInterval: time.Second})
	require.ErrorContains(t, err, "Config.LeaseTTL")

	_, err = client.EnqueueTx(context.Background(), mustBegin(t, b), wharf.Message{Topic: "t"})
	require.ErrorIs(t, err, wharf.ErrNotMigrated)
}

func mustBegin(t *testing.T, b *testBundle) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// With notifications on, an idle relay wakes at once on a new message instead
// of at its next poll; with them off (the default) it waits for the poll.
//
// The poll interval is five minutes, longer than anything here can take on
// a loaded machine: the quiet message cannot be delivered by a poll during
// the test, and a delivery of the loud one before the poll was due is the
// notification's doing.
func TestNotifyWakesIdleRelay(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	cfg.PollInterval = 5 * time.Minute
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	// The relay claims its lanes, fetches once (nothing), and goes idle
	// until its next poll.
	require.Eventually(t, func() bool { return client.Metrics().LanesOwned.Load() == 64 && fetches(client) > 0 },
		time.Minute, 10*time.Millisecond)
	idleSince := time.Now()

	ids, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "quiet", Payload: []byte(`1`)})
	require.NoError(t, err)
	time.Sleep(time.Second) // the relay would fetch now if it did not wait for its poll
	require.Zero(t, deliveredIDs(rec.snapshot())[ids[0]], "with notifications off the relay should wait for its poll")

	_, err = b.pool.Exec(ctx, "ALTER TABLE "+b.schema+".outbox ENABLE TRIGGER outbox_notify")
	require.NoError(t, err)
	ids2, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "loud", Payload: []byte(`2`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return deliveredIDs(rec.snapshot())[ids2[0]] > 0 }, 2*time.Minute, 5*time.Millisecond,
		"a notification must wake the idle relay")
	require.Less(t, time.Since(idleSince), cfg.PollInterval, "delivered before the next poll was due")
}

// Drain delivers what is due, waits for retries, and leaves messages scheduled
// for later in the outbox.
func TestDrainLeavesScheduledAndWaitsForRetries(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	failures := 0
	rec := &recorder{fail: func(m *wharf.Message) error {
		if m.Key == "flaky" && failures < 2 {
			failures++
			return errors.New("not yet")
		}
		return nil
	}}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	cfg.HandlerConcurrency = 1
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	ids, err := client.Enqueue(ctx,
		wharf.Message{Topic: "t", Key: "later", Payload: []byte(`1`), DeliverAt: time.Now().Add(time.Hour)},
		wharf.Message{Topic: "t", Key: "flaky", Payload: []byte(`2`)},
		wharf.Message{Topic: "t", Key: "now", Payload: []byte(`3`)})
	require.NoError(t, err)
	require.NoError(t, client.Drain(ctx))
	got := deliveredIDs(rec.snapshot())
	require.Zero(t, got[ids[0]], "a message scheduled for later must not be delivered")
	require.Equal(t, 1, got[ids[1]], "drain must wait for the retried message")
	require.Equal(t, 1, got[ids[2]])
	require.Equal(t, 2, failures)
	require.Equal(t, 1, outboxCount(t, b), "the scheduled message stays in the outbox")
}

// A relay joining a running one gets its fair share of the lanes within
// seconds, while messages keep flowing in key order.
func TestRebalanceWhenRelayJoins(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	recA, recB := &recorder{}, &recorder{}
	cfgA := testConfig(b.schema)
	cfgA.RelayID, cfgA.Handler = "relay-a", recA.handle
	cfgB := testConfig(b.schema)
	cfgB.RelayID, cfgB.Handler = "relay-b", recB.handle
	a, err := wharf.NewClient(b.pool, cfgA)
	require.NoError(t, err)
	bb, err := wharf.NewClient(b.pool, cfgB)
	require.NoError(t, err)
	owned := func(id string) int {
		return leasedLanes(t, b, id)
	}
	require.NoError(t, a.Start(ctx))
	defer func() { require.NoError(t, a.Stop(ctx)) }()
	require.Eventually(t, func() bool { return owned("relay-a") == 64 }, time.Minute, 20*time.Millisecond)

	stop := make(chan struct{})
	produced := make(chan []string, 1)
	go func() {
		var ids []string
		for i := 0; ; i++ {
			select {
			case <-stop:
				produced <- ids
				return
			default:
			}
			got, err := a.Enqueue(ctx, wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%50), Payload: []byte(`1`)})
			if err == nil {
				ids = append(ids, got...)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	require.NoError(t, bb.Start(ctx))
	defer func() { require.NoError(t, bb.Stop(ctx)) }()
	start := time.Now()
	require.Eventually(t, func() bool { return owned("relay-a") == 32 && owned("relay-b") == 32 }, time.Minute, 20*time.Millisecond,
		"lanes must split 32/32 after a relay joins")
	t.Logf("rebalanced in %s", time.Since(start).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	close(stop)
	ids := <-produced
	require.NotEmpty(t, ids)
	require.Eventually(t, func() bool {
		got := deliveredIDs(append(recA.snapshot(), recB.snapshot()...))
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond)
	require.NotEmpty(t, recB.snapshot(), "the new relay must deliver part of the work")
	// Per relay the log is in delivery order; a key moving between relays is
	// handed over only after its in-flight messages were acknowledged.
	requireKeyOrder(t, recA.snapshot())
	requireKeyOrder(t, recB.snapshot())
}

// A failing key with a long queue behind it must not fill the relay's buffer
// and stall everyone else: the other keys flow while it retries, and once it
// heals its whole backlog arrives, in order.
func TestPoisonKeyWithDeepBacklogDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var mu sync.Mutex
	healed := false
	rec := &recorder{fail: func(m *wharf.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Key == "poison" && !healed {
			return errors.New("downstream rejects this key")
		}
		return nil
	}}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	cfg.FetchBatch = 64
	cfg.MaxBuffered = 200 // a held key keeps at most 10 messages in memory
	cfg.MaxAttempts = 1000
	cfg.RetryBackoff = 20 * time.Millisecond
	cfg.MaxRetryBackoff = 50 * time.Millisecond
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)

	var poison, others []string
	for batch := 0; batch < 20; batch++ {
		var msgs []wharf.Message
		for i := 0; i < 50; i++ {
			msgs = append(msgs, wharf.Message{Topic: "t", Key: "poison", Payload: []byte(`"p"`)})
			msgs = append(msgs, wharf.Message{Topic: "t", Key: fmt.Sprintf("ok%d", i%20), Payload: []byte(`"ok"`)})
		}
		ids, err := client.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for i, id := range ids {
			if i%2 == 0 {
				poison = append(poison, id)
			} else {
				others = append(others, id)
			}
		}
	}
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()

	waitDelivered(t, rec, others...)
	require.Zero(t, deliveredIDs(rec.snapshot())[poison[0]], "the poison key must still be failing")

	// A second wave while the key keeps failing: new messages of other keys
	// still flow past the truncated key.
	var more []string
	for batch := 0; batch < 5; batch++ {
		var msgs []wharf.Message
		for i := 0; i < 50; i++ {
			msgs = append(msgs, wharf.Message{Topic: "t", Key: "poison", Payload: []byte(`"p"`)},
				wharf.Message{Topic: "t", Key: fmt.Sprintf("ok%d", i%20), Payload: []byte(`"ok"`)})
		}
		ids, err := client.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for i, id := range ids {
			if i%2 == 0 {
				poison = append(poison, id)
			} else {
				more = append(more, id)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitDelivered(t, rec, more...)
	require.Zero(t, deliveredIDs(rec.snapshot())[poison[0]], "the poison key must still be failing")

	mu.Lock()
	healed = true
	mu.Unlock()
	waitDelivered(t, rec, poison...)
	got := rec.snapshot()
	requireKeyOrder(t, got)
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond)
}
