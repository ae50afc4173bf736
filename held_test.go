package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// watchPeak samples g every millisecond until the returned function is
// called (or the test ends); the function returns the highest value seen.
func watchPeak(t *testing.T, g *atomic.Int64) func() int64 {
	var peak atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if n := g.Load(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var once sync.Once
	finish := func() int64 {
		once.Do(func() { close(stop); <-done })
		return peak.Load()
	}
	t.Cleanup(func() { finish() })
	return finish
}

// smallBuffer is a relay configuration whose memory budget a few hundred
// held messages would fill if they counted against it.
func smallBuffer(schema string) *wharf.Config {
	cfg := testConfig(schema)
	cfg.MaxBuffered = 200
	cfg.FetchBatch = 64
	return cfg
}

func enqueueN(t *testing.T, c *wharf.Client, n int, mk func(i int) wharf.Message) []string {
	t.Helper()
	var ids []string
	for done := 0; done < n; {
		batch := make([]wharf.Message, 0, 500)
		for ; done < n && len(batch) < 500; done++ {
			batch = append(batch, mk(done))
		}
		got, err := c.Enqueue(context.Background(), batch...)
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	return ids
}

// One key whose head is scheduled an hour ahead, with far more messages
// behind it than the relay may buffer, holds only itself: messages of other
// keys enqueued afterwards are delivered, in normal and in drain mode, and the
// loaded messages stay within the budget.
func TestHeldKeyWithDeepBacklogDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	for _, drain := range []bool{false, true} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			t.Parallel()
			b := setupDB(t)
			ctx := context.Background()
			rec := &recorder{}
			cfg := smallBuffer(b.schema)
			cfg.Handler = rec.handle
			client, err := wharf.NewClient(b.pool, cfg)
			require.NoError(t, err)
			enqueueN(t, client, 1, func(int) wharf.Message {
				return wharf.Message{Topic: "t", Key: "held", Payload: []byte("0"), DeliverAt: time.Now().Add(time.Hour)}
			})
			enqueueN(t, client, 3000, func(int) wharf.Message { return wharf.Message{Topic: "t", Key: "held", Payload: []byte("1")} })
			peak := watchPeak(t, &client.Metrics().Buffered)
			if drain {
				others := enqueueN(t, client, 100, func(i int) wharf.Message {
					return wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%7), Payload: []byte("2")}
				})
				// A hang guard only: the drain ends when the other keys are
				// delivered, however slow the machine.
				dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				defer cancel()
				require.NoError(t, client.Drain(dctx), "drain must finish: only the scheduled key is left")
				got := deliveredIDs(rec.snapshot())
				for _, id := range others {
					require.Equal(t, 1, got[id])
				}
				require.Len(t, got, 100, "nothing of the held key is delivered")
			} else {
				require.NoError(t, client.Start(ctx))
				defer func() { require.NoError(t, client.Stop(ctx)) }()
				time.Sleep(time.Second) // the relay has read past the held key
				others := enqueueN(t, client, 100, func(i int) wharf.Message {
					return wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%7), Payload: []byte("2")}
				})
				waitDelivered(t, rec, others...)
				require.Len(t, deliveredIDs(rec.snapshot()), 100)
				require.Eventually(t, func() bool { return client.Metrics().Held.Load() == 3001 }, time.Minute, 10*time.Millisecond,
					"the held key is kept as positions: %d", client.Metrics().Held.Load())
			}
			require.LessOrEqual(t, peak(), int64(cfg.MaxBuffered), "loaded messages stay within MaxBuffered")
		})
	}
}

// Many keys each held by one failing message, and unkeyed messages scheduled
// or retrying, are more than the budget holds; none of it stops the others.
func TestManyHeldKeysAndUnkeyedDoNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{fail: func(m *wharf.Message) error {
		if m.Topic == "bad" {
			return errors.New("downstream refuses")
		}
		return nil
	}}
	cfg := smallBuffer(b.schema)
	cfg.Handler = rec.handle
	cfg.MaxAttempts = 1000
	cfg.RetryBackoff = time.Second
	cfg.MaxRetryBackoff = 2 * time.Second
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	// 600 keys with a failing head and a good message behind each.
	enqueueN(t, client, 1200, func(i int) wharf.Message {
		topic := "bad"
		if i%2 == 1 {
			topic = "good-after-bad"
		}
		return wharf.Message{Topic: topic, Key: fmt.Sprintf("h%d", i/2), Payload: []byte("1")}
	})
	// 600 unkeyed messages scheduled an hour ahead, 300 unkeyed failing.
	enqueueN(t, client, 600, func(int) wharf.Message {
		return wharf.Message{Topic: "later", Payload: []byte("1"), DeliverAt: time.Now().Add(time.Hour)}
	})
	enqueueN(t, client, 300, func(int) wharf.Message { return wharf.Message{Topic: "bad", Payload: []byte("1")} })
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	time.Sleep(time.Second)
	others := enqueueN(t, client, 200, func(i int) wharf.Message {
		return wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%11), Payload: []byte("2")}
	})
	waitDelivered(t, rec, others...)
	for _, m := range rec.snapshot() {
		require.NotEqual(t, "later", m.Topic, "a scheduled message was delivered early")
	}
}

// A message scheduled (or failing) in one topic does not hold the same key in
// another topic; within one topic and key, order holds through retries and a
// dead-letter replay.
func TestHeldKeyHoldsOnlyItsTopic(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var mu sync.Mutex
	failing := map[string]bool{}
	refused := map[string]bool{}
	rec := &recorder{fail: func(m *wharf.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Topic == "orders.paid" && failing[m.ID] {
			delete(failing, m.ID)
			return errors.New("first attempt fails")
		}
		if m.Topic == "orders.refunded" && !refused[m.ID] {
			refused[m.ID] = true
			return wharf.Permanent(errors.New("refused"))
		}
		return nil
	}}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	held, err := client.Enqueue(ctx, wharf.Message{Topic: "orders.shipped", Key: "43", Payload: []byte("later"), DeliverAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	paid := enqueueN(t, client, 50, func(i int) wharf.Message {
		return wharf.Message{Topic: "orders.paid", Key: "43", Payload: []byte(fmt.Sprint(i))}
	})
	mu.Lock()
	failing[paid[0]], failing[paid[10]] = true, true
	mu.Unlock()
	refunded := enqueueN(t, client, 5, func(i int) wharf.Message {
		return wharf.Message{Topic: "orders.refunded", Key: "43", Payload: []byte(fmt.Sprint(i))}
	})
	other := enqueueN(t, client, 20, func(i int) wharf.Message {
		return wharf.Message{Topic: "load.t", Key: "43", Payload: []byte(fmt.Sprint(i))}
	})
	require.NoError(t, client.Drain(ctx))
	got := deliveredIDs(rec.snapshot())
	for _, id := range append(append([]string{}, paid...), other...) {
		require.Equal(t, 1, got[id], "the scheduled orders.shipped message must not hold topic %s", id)
	}
	require.Zero(t, got[held[0]])
	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{Topic: "orders.refunded"})
	require.NoError(t, err)

	require.Len(t, dead, 5, "each refunded message failed permanently on its first attempt")
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{Topic: "orders.refunded"})
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.NoError(t, client.Drain(ctx))
	var replayed []wharf.Message
	for _, m := range rec.snapshot() {
		if m.Topic == "orders.refunded" {
			replayed = append(replayed, m)
		}
	}
	require.Len(t, replayed, 5)
	for i, m := range replayed {
		require.Equal(t, refunded[i], m.ID, "dead letters are replayed in seq order")
	}
	requireKeyOrder(t, rec.snapshot())
}

// Large payloads are bounded in bytes, not only in count: the loaded payload
// bytes stay within MaxBufferedBytes (plus one message per lane read).
func TestLargePayloadsStayWithinTheByteBudget(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	const size = 512 << 10
	var peak atomic.Int64
	cfg := testConfig(b.schema)
	cfg.MaxBufferedBytes = 8 << 20
	var client *wharf.Client
	cfg.Handler = func(context.Context, *wharf.Message) error {
		if n := client.Metrics().BufferedBytes.Load(); n > peak.Load() {
			peak.Store(n)
		}
		return nil
	}
	var err error
	client, err = wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	payload := make([]byte, size)
	ids := enqueueN(t, client, 120, func(i int) wharf.Message {
		return wharf.Message{Topic: "big", Key: fmt.Sprintf("k%d", i%2), Payload: payload}
	})
	require.NoError(t, client.Drain(ctx))
	require.Equal(t, int64(len(ids)), client.Metrics().Delivered.Load())
	// Two keys live in at most two lanes: a fetch may bring one message per
	// lane past its share.
	require.LessOrEqual(t, peak.Load(), cfg.MaxBufferedBytes+2*size, "loaded payload bytes exceeded the budget")
	require.Positive(t, peak.Load())
}

// A key whose head waits for a short retry backoff keeps its loaded messages
// instead of dropping them to positions: they would all be read again when
// the backoff ends, once per retry.
func TestShortRetryKeepsKeyLoaded(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var failures atomic.Int32
	rec := &recorder{fail: func(m *wharf.Message) error {
		if string(m.Payload) == "0" && failures.Add(1) <= 2 {
			return errors.New("refused")
		}
		return nil
	}}
	cfg := testConfig(b.schema)
	cfg.RetryBackoff = 200 * time.Millisecond
	cfg.MaxRetryBackoff = 400 * time.Millisecond
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	ids := enqueueN(t, client, 50, func(i int) wharf.Message {
		return wharf.Message{Topic: "t", Key: "k", Payload: []byte(fmt.Sprint(i))}
	})
	peakHeld := watchPeak(t, &client.Metrics().Held)
	require.NoError(t, client.Start(ctx))
	defer func() { require.NoError(t, client.Stop(ctx)) }()
	waitDelivered(t, rec, ids...)
	require.EqualValues(t, 3, failures.Load(), "the head failed twice, then went through")
	requireKeyOrder(t, rec.snapshot())
	require.Zero(t, peakHeld(), "the key's messages stayed loaded through both backoffs")
}
