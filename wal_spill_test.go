package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A relay that takes over a WAL outbox whose table holds many more spilled
// rows in one lane than a fetch reads, analyzed with them there, while
// producers committed newer messages of the same key meanwhile: every
// spilled row is delivered, once, before the key's newer messages, and the
// table ends empty. The times are logged (read a slow run with -v).
func TestWALRelayTakeoverDeliversEverySpilledRow(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	var failing atomic.Bool
	failing.Store(true)
	spill := func(cfg *wharf.Config) {
		wharf.SetWALSpillAfter(cfg, 300*time.Millisecond)
		cfg.MaxAttempts = 1000
		cfg.FetchBatch = 64
	}
	_, stopA := runRelay(t, b, func(m *wharf.Message) error {
		if m.Key == "bad" && failing.Load() {
			return errors.New("sink refuses")
		}
		return nil
	}, spill)
	// 10,000 held messages, all of one key, so of one lane.
	var held []string
	for i := 0; i < 20; i++ {
		msgs := make([]wharf.Message, 500)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "t", Key: "bad", Payload: []byte(fmt.Sprintf("held-%d-%d", i, j))}
		}
		held = append(held, commitMessages(t, b, msgs...)...)
	}
	began := time.Now()
	require.Eventually(t, func() bool { return outboxCount(t, b) == len(held) }, 5*time.Minute, 50*time.Millisecond,
		"the failing key's messages were not all moved to the table")
	t.Logf("%d held messages moved to the table in %v", len(held), time.Since(began).Round(time.Millisecond))
	stopA()
	failing.Store(false)
	// Autovacuum's ANALYZE, which sees every row in one lane: the
	// takeover's fetches must still read the table through its indexes
	// (they scanned the whole outbox once per lane, three rows a fetch).
	_, err := b.pool.Exec(context.Background(), "ANALYZE "+b.schema+".outbox")
	require.NoError(t, err)

	// Producers go on while no relay runs (a restart, a takeover).
	var later []string
	for i := 0; i < 5; i++ {
		later = append(later, commitMessages(t, b, wharf.Message{Topic: "t", Key: "bad", Payload: []byte(fmt.Sprintf("later-%d", i))})...)
	}
	clientB, recB, _ := runRelayClient(t, b, nil, spill)
	all := append(append([]string{}, held...), later...)
	defer func() {
		if t.Failed() {
			got := deliveredIDs(recB.snapshot())
			missing, laterOK := 0, 0
			for _, id := range held {
				if got[id] == 0 {
					missing++
				}
			}
			for _, id := range later {
				if got[id] > 0 {
					laterOK++
				}
			}
			var retries int
			_ = b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".retries").Scan(&retries)
			t.Logf("%d of %d moved messages not delivered, %d of %d later ones delivered, %d rows in the table, %d retry records, %d bytes held",
				missing, len(held), laterOK, len(later), outboxCount(t, b), retries, clientB.Metrics().WALHeldBytes.Load())
		}
	}()
	began = time.Now()
	requireAllDeliveredWithin(t, recB, all, 5*time.Minute, "spilled messages not delivered after the takeover")
	t.Logf("%d messages delivered after the takeover in %v", len(all), time.Since(began).Round(time.Millisecond))
	got := recB.snapshot()
	requireKeyOrder(t, got)
	for id, n := range deliveredIDs(got) {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
	require.Len(t, got, len(all))
	for i, m := range got {
		require.Equal(t, all[i], m.ID, "delivery %d out of order", i)
	}
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, 60*time.Second, 50*time.Millisecond,
		"delivered rows left in the outbox table")
}

// Dead letters retried in WAL mode go back as rows of the outbox table with
// their ids, while the relay streams with an empty table: it notices them,
// delivers each once with the same id and payload, removes them, and goes on
// delivering what is committed after.
func TestWALRelayRetriesDeadLettersFromTheTable(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	var cured atomic.Bool
	client, rec, _ := runRelayClient(t, b, func(m *wharf.Message) error {
		if m.Key == "bad" && !cured.Load() {
			return wharf.Permanent(errors.New("sink refuses it for good"))
		}
		return nil
	}, nil)
	ids := commitMessages(t, b,
		wharf.Message{Topic: "t", Key: "bad", Payload: []byte("poison-0"), Headers: map[string]string{"h": "0"}},
		wharf.Message{Topic: "t", Key: "bad", Payload: []byte("poison-1")},
		wharf.Message{Topic: "t", Key: "good", Payload: []byte("fine")})
	requireAllDelivered(t, rec, ids[2:])
	var dead []wharf.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		dead, err = client.DeadLetters(ctx, wharf.DeadLetterFilter{})
		require.NoError(t, err)
		return len(dead) == 2
	}, 60*time.Second, 20*time.Millisecond, "the failing messages were not dead-lettered")
	// The relay holds nothing and its table is empty: it streams, reading no table.
	require.Eventually(t, func() bool { return client.Metrics().WALHeldBytes.Load() == 0 }, 60*time.Second, 20*time.Millisecond)
	require.Zero(t, outboxCount(t, b))

	cured.Store(true)
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	after := commitMessages(t, b, wharf.Message{Topic: "t", Key: "good", Payload: []byte("after")})
	requireAllDeliveredWithin(t, rec, append(ids[:2:2], after...), 60*time.Second, "retried dead letters not delivered")
	var got []wharf.Message
	for _, m := range rec.snapshot() {
		if m.Key == "bad" {
			got = append(got, m)
		}
	}
	require.Len(t, got, 2, "each retried dead letter delivered once")
	require.Equal(t, []string{ids[0], ids[1]}, []string{got[0].ID, got[1].ID}, "retried dead letters out of order, or with new ids")
	require.Equal(t, "poison-0", string(got[0].Payload))
	require.Equal(t, map[string]string{"h": "0"}, got[0].Headers)
	require.Equal(t, "poison-1", string(got[1].Payload))
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, 60*time.Second, 20*time.Millisecond,
		"retried dead letters left in the outbox table")
	dead, err = client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)
}

// One producer transaction much larger than MaxBufferedBytes: the relay
// never holds more of it than its budget (plus one message), and delivers
// every message once, each key's in order.
func TestWALRelayLargeTransactionStaysWithinTheBudget(t *testing.T) {
	t.Parallel()
	walLargeTransaction(t, 20000, 4000, 1<<20)
}

// walLargeTransaction commits n messages of size payload bytes of 256 keys
// in one transaction and drains them with a relay whose budget is budget bytes,
// sampling the bytes its WAL store holds until the last one is delivered;
// it returns the peak of the live heap (as of each garbage collection)
// meanwhile.
func walLargeTransaction(t *testing.T, n, size int, budget int64) (peakHeap uint64) {
	b := walDB(t)
	payload := make([]byte, size)
	msgs := make([]wharf.Message, n)
	for i := range msgs {
		msgs[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%256), Payload: payload}
	}
	ids := commitMessages(t, b, msgs...)
	runtime.GC() // what committing them left
	// The recorder keeps every message delivered: without their payloads,
	// or the heap would grow with the transaction in the test's own record.
	relay, rec, _ := runRelayClient(t, b, func(m *wharf.Message) error {
		if len(m.Payload) != size {
			return wharf.Permanent(fmt.Errorf("payload of %d bytes, want %d", len(m.Payload), size))
		}
		m.Payload = nil
		return nil
	}, func(c *wharf.Config) { c.MaxBufferedBytes = budget })
	var peak atomic.Int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		tick := 0
		for {
			select {
			case <-done:
				return
			default:
			}
			if h := relay.Metrics().WALHeldBytes.Load(); h > peak.Load() {
				peak.Store(h)
			}
			if tick%100 == 0 {
				metrics.Read(live)
				peakHeap = max(peakHeap, live[0].Value.Uint64())
			}
			tick++
			time.Sleep(time.Millisecond)
		}
	}()
	requireAllDeliveredWithin(t, rec, ids, 10*time.Minute, "the large transaction was not delivered")
	close(done)
	<-stopped
	// One message's bytes as the store counts them: its payload and an
	// allowance for the rest of it.
	const overhead = 512
	require.LessOrEqual(t, peak.Load(), budget+int64(size)+overhead, "the WAL store held more than its budget")
	got := rec.snapshot()
	require.Len(t, got, len(ids), "messages delivered more than once")
	requireKeyOrder(t, got)
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, 60*time.Second, 50*time.Millisecond,
		"delivered rows left in the outbox table")
	t.Logf("%d messages of %d bytes, budget %d: peak held %d, peak live heap %d MiB", n, size, budget, peak.Load(), peakHeap>>20)
	return peakHeap
}

// After a crash, messages a relay had moved to the outbox table whose
// transactions the slot was not confirmed past are both table rows and
// streamed again, with the same ids. The next relay delivers each once, in
// its key's order, before the key's newer messages, and removes the rows.
func TestWALRelayAfterACrashDeliversTableAndStreamCopiesOnce(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 4; i++ {
		msgs := make([]wharf.Message, 50)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", j%3), Payload: []byte(fmt.Sprintf("m-%d-%d", i, j)),
				Headers: map[string]string{"i": fmt.Sprint(i)}}
		}
		ids = append(ids, commitMessages(t, b, msgs...)...)
	}
	// The first 120 as a spill would have written them, the slot still
	// before all of them (as after a crash before the confirmation).
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL wharf.spill = 'on'")
	require.NoError(t, err)
	for i, id := range ids[:120] {
		seq, nonce, err := wharf.ParseID(id)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO `+b.schema+`.outbox (id, nonce, topic, key, payload, headers) OVERRIDING SYSTEM VALUE
VALUES ($1, $2, 't', $3, $4, $5)`, seq, nonce, fmt.Sprintf("k%d", (i%50)%3), []byte(fmt.Sprintf("m-%d-%d", i/50, i%50)), fmt.Sprintf(`{"i": "%d"}`, i/50))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	rec, _ := runRelay(t, b, nil, nil)
	later := commitMessages(t, b, wharf.Message{Topic: "t", Key: "k0", Payload: []byte("later")})
	requireAllDelivered(t, rec, append(append([]string{}, ids...), later...))
	got := rec.snapshot()
	requireKeyOrder(t, got)
	for id, n := range deliveredIDs(got) {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
	require.Len(t, got, len(ids)+1)
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, 60*time.Second, 20*time.Millisecond,
		"rows left in the outbox table")
}
