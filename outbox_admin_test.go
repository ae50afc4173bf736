package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

func adminClient(t *testing.T, b *testBundle) *wharf.Client {
	t.Helper()
	c, err := wharf.NewClient(b.pool, testConfig(b.schema))
	require.NoError(t, err)
	return c
}

func pendingSeqs(ps []wharf.PendingMessage) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.Seq
	}
	return out
}

// rowState is what the outbox stores for one message, for before/after checks.
type rowState struct {
	nonce     int64
	xid       string
	createdAt time.Time
	deliverAt *time.Time
	dedupKey  *string
	headers   *string
	payload   []byte
}

func readRow(t *testing.T, b *testBundle, seq int64) (rowState, bool) {
	t.Helper()
	var r rowState
	err := b.pool.QueryRow(context.Background(), `SELECT nonce, xid::text, created_at, deliver_at, dedup_key, headers::text, payload
FROM `+b.schema+`.outbox WHERE id = $1`, seq).Scan(&r.nonce, &r.xid, &r.createdAt, &r.deliverAt, &r.dedupKey, &r.headers, &r.payload)
	if err != nil {
		return r, false
	}
	return r, true
}

func addRetry(t *testing.T, b *testBundle, seq int64, attempts int, next time.Time, lastErr string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.retries (id, lane, attempts, next_attempt_at, last_error)
SELECT id, lane, $2, $3, $4 FROM `+b.schema+`.outbox WHERE id = $1`, seq, attempts, next, lastErr)
	require.NoError(t, err)
}

// PendingMessages lists in Seq order with payload, headers, schedule and the
// retry state, and each selector (ids, seqs, both, topic, key, limit) picks
// exactly its messages; an id of another outbox (same seq, other nonce)
// picks nothing.
func TestPendingMessagesListsAndFilters(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	c := adminClient(t, b)
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	var ids []string
	for i := 0; i < 40; i++ {
		m := wharf.Message{Topic: []string{"orders", "invoices"}[i%2], Key: fmt.Sprintf("k%d", i%5), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if i%10 == 9 {
			m.Key = ""
		}
		if i == 3 {
			m.DeliverAt = later
			m.Headers = map[string]string{"trace": "t3"}
			m.DedupKey = "d3"
		}
		got, err := c.Enqueue(ctx, m)
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	addRetry(t, b, seqOf(t, ids[7]), 3, time.Now().Add(time.Minute), "broker said no")

	all, err := c.PendingMessages(ctx, wharf.PendingFilter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, all, 40)
	for i, p := range all {
		require.Equal(t, ids[i], p.ID, "Seq order")
		require.Equal(t, seqOf(t, ids[i]), p.Seq)
		require.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(p.Payload))
		require.False(t, p.CreatedAt.IsZero())
		require.GreaterOrEqual(t, p.Lane, 0)
		require.Less(t, p.Lane, 64)
	}
	m3 := all[3]
	require.True(t, m3.Scheduled)
	require.True(t, m3.DeliverAt.Equal(later), "%s != %s", m3.DeliverAt, later)
	require.Equal(t, map[string]string{"trace": "t3"}, m3.Headers)
	require.Equal(t, "d3", m3.DedupKey)
	require.False(t, all[4].Scheduled)
	require.Equal(t, 3, all[7].Attempts)
	require.Equal(t, "broker said no", all[7].LastError)
	require.False(t, all[7].NextAttemptAt.IsZero())
	require.Zero(t, all[8].Attempts)
	require.True(t, all[8].NextAttemptAt.IsZero())
	require.Equal(t, "", all[9].Key)

	def, err := c.PendingMessages(ctx, wharf.PendingFilter{})
	require.NoError(t, err)
	require.Len(t, def, 40, "the default limit is 100")
	first, err := c.PendingMessages(ctx, wharf.PendingFilter{Limit: 5})
	require.NoError(t, err)
	require.Equal(t, pendingSeqs(all[:5]), pendingSeqs(first), "the limit keeps the lowest seqs")

	byTopic, err := c.PendingMessages(ctx, wharf.PendingFilter{Topic: "invoices", Limit: 1000})
	require.NoError(t, err)
	require.Len(t, byTopic, 20)
	for _, p := range byTopic {
		require.Equal(t, "invoices", p.Topic)
	}
	byKey, err := c.PendingMessages(ctx, wharf.PendingFilter{Key: "k2", Limit: 1000})
	require.NoError(t, err)
	require.NotEmpty(t, byKey)
	for i, p := range byKey {
		require.Equal(t, "k2", p.Key)
		if i > 0 {
			require.Greater(t, p.Seq, byKey[i-1].Seq)
		}
	}
	both, err := c.PendingMessages(ctx, wharf.PendingFilter{Key: "k2", Topic: "orders", Limit: 1000})
	require.NoError(t, err)
	for _, p := range both {
		require.Equal(t, "orders", p.Topic)
		require.Equal(t, "k2", p.Key)
	}
	require.Less(t, len(both), len(byKey))

	byIDs, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{ids[12], ids[2]}})
	require.NoError(t, err)
	require.Equal(t, []string{ids[2], ids[12]}, []string{byIDs[0].ID, byIDs[1].ID})
	union, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{ids[1]}, Seqs: []int64{seqOf(t, ids[30])}})
	require.NoError(t, err)
	require.Equal(t, []int64{seqOf(t, ids[1]), seqOf(t, ids[30])}, pendingSeqs(union), "ids and seqs select their union")

	foreign := wharf.FormatID(seqOf(t, ids[5]), 12345)
	none, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{foreign}})
	require.NoError(t, err)
	require.Empty(t, none, "an id with another nonce is another outbox's message")

	_, err = c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{"not-a-uuid"}})
	require.ErrorIs(t, err, wharf.ErrBadID)
}

// CancelMessages deletes exactly the selected rows and their retry state,
// refuses a filter that selects nothing in particular, and with All empties
// the outbox.
func TestCancelMessagesDeletesRowsAndRetries(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	c := adminClient(t, b)
	ids := enqueueN(t, c, 30, func(i int) wharf.Message {
		return wharf.Message{Topic: []string{"a", "b", "c"}[i%3], Key: fmt.Sprintf("k%d", i%4), Payload: []byte("x")}
	})
	addRetry(t, b, seqOf(t, ids[4]), 2, time.Now().Add(time.Hour), "failing")

	n, err := c.CancelMessages(ctx, wharf.PendingFilter{IDs: []string{ids[4], wharf.FormatID(seqOf(t, ids[5]), 1)}})
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the id with the right nonce is cancelled")
	_, ok := readRow(t, b, seqOf(t, ids[4]))
	require.False(t, ok)
	var retries int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".retries").Scan(&retries))
	require.Zero(t, retries, "the cancelled message's retry state goes with it")

	n, err = c.CancelMessages(ctx, wharf.PendingFilter{Topic: "b"})
	require.NoError(t, err)
	require.Equal(t, 9, n, "topic b: i%3 == 1, but i = 4 is gone already")
	n, err = c.CancelMessages(ctx, wharf.PendingFilter{Topic: "a", Key: "k0"})
	require.NoError(t, err)
	require.Equal(t, 3, n, "topic a and key k0: i = 0, 12, 24")
	require.Equal(t, 30-1-9-3, outboxCount(t, b))

	_, err = c.CancelMessages(ctx, wharf.PendingFilter{})
	require.ErrorIs(t, err, wharf.ErrNoSelection)
	_, err = c.RescheduleMessages(ctx, wharf.PendingFilter{Limit: 5}, time.Time{})
	require.ErrorIs(t, err, wharf.ErrNoSelection)
	n, err = c.CancelMessages(ctx, wharf.PendingFilter{All: true})
	require.NoError(t, err)
	require.Equal(t, 17, n)
	require.Zero(t, outboxCount(t, b))
}

// RescheduleMessages re-inserts each row with the same seq, nonce, creation
// time, headers, payload and dedup key and the new deliver_at, in a new
// transaction (so relays read it again as a late commit); a retry keeps its
// attempts and moves its next attempt; zero means now; a dedup key stays
// effective.
func TestRescheduleMessagesKeepsIdentity(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	c := adminClient(t, b)
	ids, err := c.Enqueue(ctx,
		wharf.Message{Topic: "t", Key: "k", Payload: []byte("a"), Headers: map[string]string{"h": "1"}, DedupKey: "dk", DeliverAt: time.Now().Add(time.Hour)},
		wharf.Message{Topic: "t", Key: "k", Payload: []byte("b")},
		wharf.Message{Topic: "t", Payload: []byte("c")},
	)
	require.NoError(t, err)
	s0, s1 := seqOf(t, ids[0]), seqOf(t, ids[1])
	addRetry(t, b, s1, 4, time.Now().Add(time.Hour), "boom")
	before0, ok := readRow(t, b, s0)
	require.True(t, ok)
	before1, _ := readRow(t, b, s1)

	at := time.Now().Add(10 * time.Minute).Truncate(time.Microsecond)
	n, err := c.RescheduleMessages(ctx, wharf.PendingFilter{IDs: []string{ids[0], ids[1]}}, at)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	after0, ok := readRow(t, b, s0)
	require.True(t, ok)
	require.Equal(t, before0.nonce, after0.nonce)
	require.True(t, before0.createdAt.Equal(after0.createdAt))
	require.Equal(t, before0.headers, after0.headers)
	require.Equal(t, before0.payload, after0.payload)
	require.Equal(t, before0.dedupKey, after0.dedupKey)
	require.NotEqual(t, before0.xid, after0.xid, "the row must belong to the rescheduling transaction")
	require.True(t, after0.deliverAt.Equal(at))
	after1, _ := readRow(t, b, s1)
	require.True(t, after1.deliverAt.Equal(at))
	require.Equal(t, before1.nonce, after1.nonce)
	var attempts int
	var next time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT attempts, next_attempt_at FROM "+b.schema+".retries WHERE id = $1", s1).Scan(&attempts, &next))
	require.Equal(t, 4, attempts, "a rescheduled retry keeps its attempts")
	require.True(t, next.Equal(at), "its next attempt moves to the new time")

	got, err := c.PendingMessages(ctx, wharf.PendingFilter{Seqs: []int64{s0}})
	require.NoError(t, err)
	require.Equal(t, ids[0], got[0].ID, "same message id")

	// The dedup key still names the rescheduled message.
	again, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("dup"), DedupKey: "dk"})
	require.NoError(t, err)
	require.Equal(t, ids[0], again[0])

	n, err = c.RescheduleMessages(ctx, wharf.PendingFilter{Seqs: []int64{s0}}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	now0, _ := readRow(t, b, s0)
	require.Nil(t, now0.deliverAt, "a zero time means due now")
	require.Equal(t, 3, outboxCount(t, b))
}

// seenSink records deliveries by id with their attempt numbers.
type seenSink struct {
	mu   sync.Mutex
	seen map[string][]int
	fail func(m *wharf.Message) error
}

func (s *seenSink) handle(_ context.Context, m *wharf.Message) error {
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string][]int{}
	}
	s.seen[m.ID] = append(s.seen[m.ID], m.Attempt)
	f := s.fail
	s.mu.Unlock()
	if f != nil {
		return f(m)
	}
	return nil
}

func (s *seenSink) attempts(id string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.seen[id]...)
}

func startHandlerRelay(t *testing.T, b *testBundle, s *seenSink) *wharf.Client {
	t.Helper()
	cfg := testConfig(b.schema)
	cfg.Handler = s.handle
	c, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

func waitSeen(t *testing.T, s *seenSink, within time.Duration, ids ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if len(s.attempts(id)) == 0 {
				return false
			}
		}
		return true
	}, within, 10*time.Millisecond, "not delivered within %s", within)
}

// A scheduled message cancelled while a running relay holds it is never
// delivered: when its time comes the relay reads it again and finds it gone;
// the message behind it on its key is then delivered. Its time is seconds
// ahead, not an hour, so that the test sees the moment it would have gone out.
func TestCancelledScheduledMessageIsNeverDelivered(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	s := &seenSink{}
	c := startHandlerRelay(t, b, s)
	far, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("far"), DeliverAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	// Far enough ahead that the cancel below comes before it on a loaded
	// machine.
	soonAt := time.Now().Add(15 * time.Second)
	soon, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "j", Payload: []byte("soon"), DeliverAt: soonAt})
	require.NoError(t, err)
	behind, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "j", Payload: []byte("behind")})
	require.NoError(t, err)
	other, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "o", Payload: []byte("other")})
	require.NoError(t, err)
	waitSeen(t, s, time.Minute, other[0]) // the relay has read past both held keys

	require.True(t, time.Now().Before(soonAt), "the cancel came after the message's time: the test cannot show it is not delivered")
	n, err := c.CancelMessages(ctx, wharf.PendingFilter{IDs: []string{far[0], soon[0]}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	waitSeen(t, s, time.Minute, behind[0]) // after soon's time, which the relay finds cancelled
	require.Empty(t, s.attempts(soon[0]), "the cancelled message was delivered")
	require.Empty(t, s.attempts(far[0]))
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 10*time.Millisecond,
		"the delivered messages are removed and the cancelled ones are gone")
}

// A message waiting for its retry, cancelled, is not tried again, and its
// key moves on.
func TestCancelledRetryingMessageIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	s := &seenSink{fail: func(m *wharf.Message) error {
		if string(m.Payload) == "bad" {
			return wharf.RetryAfter(3*time.Second, errors.New("not now"))
		}
		return nil
	}}
	c := startHandlerRelay(t, b, s)
	bad, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("bad")})
	require.NoError(t, err)
	next, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("next")})
	require.NoError(t, err)
	waitSeen(t, s, time.Minute, bad[0])
	require.Eventually(t, func() bool {
		ps, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: bad})
		return err == nil && len(ps) == 1 && ps[0].Attempts == 1
	}, time.Minute, 10*time.Millisecond, "the failure must be recorded")
	n, err := c.CancelMessages(ctx, wharf.PendingFilter{IDs: bad})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitSeen(t, s, 15*time.Second, next[0])
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, []int{1}, s.attempts(bad[0]), "the cancelled message was tried again")
}

// A scheduled message rescheduled to now is delivered within seconds, before
// the message behind it on its key; one rescheduled from seconds ahead to an
// hour ahead is not delivered at its old time.
func TestRescheduledMessageIsDeliveredAtItsNewTime(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	s := &seenSink{}
	c := startHandlerRelay(t, b, s)
	held, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("held"), DeliverAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	behind, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("behind")})
	require.NoError(t, err)
	// Far enough ahead that the reschedule below comes before it on a
	// loaded machine; the test waits past it to show it is not used.
	soonAt := time.Now().Add(15 * time.Second)
	soon, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "j", Payload: []byte("soon"), DeliverAt: soonAt})
	require.NoError(t, err)
	other, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "o", Payload: []byte("other")})
	require.NoError(t, err)
	waitSeen(t, s, time.Minute, other[0])

	n, err := c.RescheduleMessages(ctx, wharf.PendingFilter{IDs: held}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = c.RescheduleMessages(ctx, wharf.PendingFilter{IDs: soon}, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	start := time.Now()
	require.True(t, time.Now().Before(soonAt), "the reschedule came after the message's old time: the test cannot show it is not used")
	waitSeen(t, s, time.Minute, held[0], behind[0])
	t.Logf("rescheduled message delivered %s after the reschedule", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Until(soonAt.Add(2 * time.Second)))
	require.Empty(t, s.attempts(soon[0]), "delivered at its old time")
	ps, err := c.PendingMessages(ctx, wharf.PendingFilter{})
	require.NoError(t, err)
	require.Equal(t, []int64{seqOf(t, soon[0])}, pendingSeqs(ps))
}

// A message waiting an hour for its retry, rescheduled to now, is tried again
// within seconds.
func TestRescheduledRetryIsTriedAgainNow(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var once sync.Once
	s := &seenSink{}
	s.fail = func(m *wharf.Message) error {
		var err error
		once.Do(func() { err = wharf.RetryAfter(time.Hour, errors.New("come back in an hour")) })
		return err
	}
	c := startHandlerRelay(t, b, s)
	ids, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("x")})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ps, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: ids})
		return err == nil && len(ps) == 1 && ps[0].Attempts == 1
	}, time.Minute, 10*time.Millisecond, "the failure must be recorded")
	n, err := c.RescheduleMessages(ctx, wharf.PendingFilter{IDs: ids}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Eventually(t, func() bool { return len(s.attempts(ids[0])) == 2 }, time.Minute, 10*time.Millisecond,
		"the rescheduled retry was not tried again (its own backoff was an hour)")
	require.Equal(t, []int{1, 2}, s.attempts(ids[0]))
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 10*time.Millisecond)
}

// A message queued behind an earlier held message of its ordering key
// (scheduled for later, or waiting for a retry) names that message and why
// it is held; the key's first message itself, other keys, the same key in
// another topic and unkeyed messages are not held.
func TestPendingMessagesSayWhatTheyWaitBehind(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	c := adminClient(t, b)
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	ids, err := c.Enqueue(ctx,
		wharf.Message{Topic: "orders", Key: "s", Payload: []byte(`1`), DeliverAt: later}, // 0: scheduled head
		wharf.Message{Topic: "orders", Key: "s", Payload: []byte(`2`)},                   // 1: held behind 0
		wharf.Message{Topic: "orders", Key: "r", Payload: []byte(`3`)},                   // 2: retrying head
		wharf.Message{Topic: "orders", Key: "s", Payload: []byte(`4`)},                   // 3: held behind 0
		wharf.Message{Topic: "orders", Key: "r", Payload: []byte(`5`)},                   // 4: held behind 2
		wharf.Message{Topic: "invoices", Key: "s", Payload: []byte(`6`)},                 // 5: other topic: due
		wharf.Message{Topic: "orders", Key: "d", Payload: []byte(`7`)},                   // 6: due
		wharf.Message{Topic: "orders", Key: "d", Payload: []byte(`8`)},                   // 7: behind a due message: due
		wharf.Message{Topic: "orders", Payload: []byte(`9`)},                             // 8: unkeyed: due
	)
	require.NoError(t, err)
	next := time.Now().Add(10 * time.Minute).Truncate(time.Microsecond)
	addRetry(t, b, seqOf(t, ids[2]), 2, next, "sink said no")

	all, err := c.PendingMessages(ctx, wharf.PendingFilter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, all, len(ids))
	for i, p := range all {
		switch i {
		case 1, 3:
			require.NotNil(t, p.HeldBehind, "message %d", i)
			require.True(t, p.Held())
			require.Equal(t, ids[0], p.HeldBehind.ID, "message %d", i)
			require.Equal(t, seqOf(t, ids[0]), p.HeldBehind.Seq)
			require.Equal(t, wharf.BlockedScheduled, p.HeldBehind.Reason)
			require.True(t, p.HeldBehind.Until.Equal(later), "%s != %s", p.HeldBehind.Until, later)
		case 4:
			require.NotNil(t, p.HeldBehind, "message %d", i)
			require.Equal(t, ids[2], p.HeldBehind.ID)
			require.Equal(t, wharf.BlockedRetrying, p.HeldBehind.Reason)
			require.Equal(t, 2, p.HeldBehind.Attempts)
			require.True(t, p.HeldBehind.Until.Equal(next), "%s != %s", p.HeldBehind.Until, next)
		default:
			require.Nil(t, p.HeldBehind, "message %d is not held behind another", i)
			require.False(t, p.Held())
		}
	}

	// Selected alone (by id, by key), a held message still names its holder.
	one, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{ids[3]}})
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.NotNil(t, one[0].HeldBehind)
	require.Equal(t, ids[0], one[0].HeldBehind.ID)
	byKey, err := c.PendingMessages(ctx, wharf.PendingFilter{Key: "r"})
	require.NoError(t, err)
	require.Len(t, byKey, 2)
	require.Nil(t, byKey[0].HeldBehind)
	require.Equal(t, ids[2], byKey[1].HeldBehind.ID)

	// Ordered across topics, the same key in another topic is held too.
	cfg := testConfig(b.schema)
	cfg.OrderAcrossTopics = true
	across, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	inv, err := across.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{ids[5]}})
	require.NoError(t, err)
	require.Len(t, inv, 1)
	require.NotNil(t, inv[0].HeldBehind)
	require.Equal(t, ids[0], inv[0].HeldBehind.ID)
}
