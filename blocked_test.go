package wharf_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

func enqueueSeqs(t *testing.T, c *wharf.Client, msgs ...wharf.Message) []int64 {
	t.Helper()
	ids, err := c.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	seqs := make([]int64, len(ids))
	for i, id := range ids {
		seqs[i], _, err = wharf.ParseID(id)
		require.NoError(t, err)
	}
	return seqs
}

// BlockedKeys lists the keys whose first message is scheduled or retrying,
// with the messages behind them, and leaves out keys whose first message is
// due, unkeyed messages and other topics' keys of the same name.
func TestBlockedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDB(t)
	c := adminClient(t, b)
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	msg := func(topic, key string, at time.Time) wharf.Message {
		return wharf.Message{Topic: topic, Key: key, Payload: []byte(`{}`), DeliverAt: at}
	}
	aHead := enqueueSeqs(t, c, msg("t", "a", later))[0]
	enqueueSeqs(t, c, msg("t", "a", time.Time{}), msg("t", "a", time.Time{}), msg("t", "a", time.Time{}))
	bHead := enqueueSeqs(t, c, msg("t", "b", time.Time{}))[0]
	enqueueSeqs(t, c, msg("t", "b", time.Time{}), msg("t", "b", later))
	next := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	addRetry(t, b, bHead, 3, next, "sink said <no>")
	// Due heads: not blocked, whatever follows.
	enqueueSeqs(t, c, msg("t", "c", time.Time{}), msg("t", "c", later))
	// Key a of another topic: its own scope by default.
	enqueueSeqs(t, c, msg("u", "a", time.Time{}))
	// Unkeyed and scheduled: blocks nothing.
	enqueueSeqs(t, c, msg("t", "", later))

	got, err := c.BlockedKeys(ctx, 0)
	require.NoError(t, err)
	require.False(t, got.More)
	require.Empty(t, got.UnscannedLanes)
	require.Len(t, got.Keys, 2, "%v", got.Keys)
	a, bk := got.Keys[0], got.Keys[1]
	require.Equal(t, "a", a.Key)
	require.Equal(t, "t", a.Topic)
	require.Equal(t, wharf.BlockedScheduled, a.Reason)
	require.Equal(t, aHead, a.HeadSeq)
	require.True(t, a.DeliverAt.Equal(later), "%s != %s", a.DeliverAt, later)
	require.Equal(t, 3, a.Waiting)
	require.False(t, a.WaitingAtLeast)
	require.Zero(t, a.Attempts)
	seq, _, err := wharf.ParseID(a.HeadID)
	require.NoError(t, err)
	require.Equal(t, aHead, seq)

	require.Equal(t, "b", bk.Key)
	require.Equal(t, wharf.BlockedRetrying, bk.Reason)
	require.Equal(t, bHead, bk.HeadSeq)
	require.Equal(t, 3, bk.Attempts)
	require.Equal(t, "sink said <no>", bk.LastError)
	require.True(t, bk.NextAttemptAt.Equal(next))
	require.Equal(t, 2, bk.Waiting)
	require.Contains(t, bk.String(), "retrying after 3 attempts")

	// The limit keeps the oldest and says there are more.
	got, err = c.BlockedKeys(ctx, 1)
	require.NoError(t, err)
	require.True(t, got.More)
	require.Len(t, got.Keys, 1)
	require.Equal(t, aHead, got.Keys[0].HeadSeq)

	// Across topics, key a's scope takes in topic u's message too.
	cfg := testConfig(b.schema)
	cfg.OrderAcrossTopics = true
	across, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	got, err = across.BlockedKeys(ctx, 0)
	require.NoError(t, err)
	require.Len(t, got.Keys, 2)
	require.Equal(t, 4, got.Keys[0].Waiting)

	// Once the head is cancelled the key is free.
	_, err = c.CancelMessages(ctx, wharf.PendingFilter{Seqs: []int64{aHead}})
	require.NoError(t, err)
	got, err = c.BlockedKeys(ctx, 0)
	require.NoError(t, err)
	require.Len(t, got.Keys, 1)
	require.Equal(t, "b", got.Keys[0].Key)
}

// A lane longer than the bound is reported, the count behind a key stops at
// the bound, and a retrying head beyond the scanned rows is still found.
func TestBlockedKeysBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDB(t)
	c := adminClient(t, b)
	later := time.Now().Add(time.Hour)
	// Every message of key "k" is in one lane: a scheduled head, then more
	// than the bound behind it.
	n := wharf.BlockedScanBound + 10
	msgs := []wharf.Message{{Topic: "t", Key: "k", Payload: []byte(`1`), DeliverAt: later}}
	for i := 0; i < n; i++ {
		msgs = append(msgs, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	}
	enqueueSeqs(t, c, msgs...)
	// A key of the same lane whose head lies past the bound, retrying.
	var far string
	var lane, farLane int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT (hashtext('k') & 63)::int`).Scan(&lane))
	for i := 0; ; i++ {
		far = fmt.Sprintf("far-%d", i)
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT (hashtext($1) & 63)::int`, far).Scan(&farLane))
		if farLane == lane {
			break
		}
	}
	farSeq := enqueueSeqs(t, c, wharf.Message{Topic: "t", Key: far, Payload: []byte(`1`)})[0]
	addRetry(t, b, farSeq, 1, time.Now().Add(time.Minute), "boom")

	start := time.Now()
	got, err := c.BlockedKeys(ctx, 0)
	t.Logf("BlockedKeys on a %d-row lane: %s", n+2, time.Since(start))
	require.NoError(t, err)
	require.Equal(t, []int{lane}, got.UnscannedLanes)
	require.Len(t, got.Keys, 2)
	require.Equal(t, "k", got.Keys[0].Key)
	require.Equal(t, wharf.BlockedScanBound, got.Keys[0].Waiting)
	require.True(t, got.Keys[0].WaitingAtLeast)
	require.Equal(t, far, got.Keys[1].Key)
	require.Equal(t, wharf.BlockedRetrying, got.Keys[1].Reason)
	require.Equal(t, 0, got.Keys[1].Waiting)
	require.False(t, got.Keys[1].WaitingAtLeast)
}

// The cost on a large outbox, measured on demand (WHARF_MEASURE_BLOCKED=1):
// 300k messages over 20k keys, 1000 keys behind a scheduled first message
// and 200 behind a retrying one.
func TestBlockedKeysCostLarge(t *testing.T) {
	if os.Getenv("WHARF_MEASURE_BLOCKED") == "" {
		t.Skip("set WHARF_MEASURE_BLOCKED=1 to measure BlockedKeys on a 300k-message outbox")
	}
	ctx := context.Background()
	b := setupDB(t)
	c := adminClient(t, b)
	_, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.outbox (topic, key, payload, deliver_at)
SELECT 't', 'k' || (i % 20000), '\x00', CASE WHEN i <= 20000 AND i % 20 = 0 THEN now() + interval '1 hour' END
FROM generate_series(1, 300000) i`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.retries (id, lane, attempts, next_attempt_at, last_error)
SELECT id, lane, 3, now() + interval '1 minute', 'boom' FROM `+b.schema+`.outbox WHERE id <= 20000 AND id % 100 = 1`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `VACUUM ANALYZE `+b.schema+`.outbox`)
	require.NoError(t, err)
	for _, limit := range []int{100, 1000} {
		for i := 0; i < 3; i++ {
			start := time.Now()
			got, err := c.BlockedKeys(ctx, limit)
			require.NoError(t, err)
			t.Logf("limit %d: %d keys, more=%v, unscanned lanes %d: %s", limit, len(got.Keys), got.More, len(got.UnscannedLanes), time.Since(start))
		}
	}
}
