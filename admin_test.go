package wharf_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// sameLaneKey returns a key other than key whose messages go to key's lane.
func sameLaneKey(t *testing.T, b *testBundle, key string) string {
	t.Helper()
	var k string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT 'x' || i FROM generate_series(1, 100000) i
WHERE hashtext('x' || i) & 63 = hashtext($1) & 63 LIMIT 1`, key).Scan(&k))
	return k
}

// insertAged inserts a message as if enqueued age ago.
func insertAged(t *testing.T, b *testBundle, topic, key string, age time.Duration, deliverIn *time.Duration) {
	t.Helper()
	var deliverAt *time.Time
	if deliverIn != nil {
		at := time.Now().Add(*deliverIn)
		deliverAt = &at
	}
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.outbox (topic, key, payload, deliver_at, created_at)
VALUES ($1, NULLIF($2, ''), '\x00', $3, now() - $4::interval)`, topic, key, deliverAt, fmt.Sprintf("%d milliseconds", age.Milliseconds()))
	require.NoError(t, err)
}

func statusOf(t *testing.T, b *testBundle, cfg *wharf.Config) *wharf.Status {
	t.Helper()
	if cfg == nil {
		cfg = testConfig(b.schema)
	}
	c, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	st, err := c.Status(context.Background())
	require.NoError(t, err)
	return st
}

func requireAbout(t *testing.T, want, got time.Duration, what string) {
	t.Helper()
	require.InDeltaf(t, want.Seconds(), got.Seconds(), 5, "%s: want about %s, got %s", what, want, got)
}

// On a small outbox the counts are exact at once (no statistics lag), the
// scheduled messages are counted apart, and the oldest due message skips
// scheduled ones and those held behind a scheduled message of their key,
// but not those behind a retrying one.
func TestStatusCountsExactlyAndFindsTheOldestDueMessage(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	empty := statusOf(t, b, nil)
	require.Equal(t, wharf.Count{N: 0, Exact: true}, empty.Messages)
	require.Zero(t, empty.OldestDueAge)
	require.Empty(t, empty.OldestDueUnknown)

	hour := time.Hour
	other := sameLaneKey(t, b, "A")
	insertAged(t, b, "t", "A", 3*time.Hour, &hour)       // scheduled head of its lane
	insertAged(t, b, "t", "A", 150*time.Minute, nil)     // held behind it: not due
	insertAged(t, b, "u", "A", 140*time.Minute, nil)     // same key, other topic: due by default
	insertAged(t, b, "t", other, 100*time.Minute, &hour) // scheduled
	insertAged(t, b, "t", other, 20*time.Minute, nil)    // held behind it
	insertAged(t, b, "t", "B", 30*time.Minute, nil)      // due, in its own lane
	c, err := wharf.NewClient(b.pool, testConfig(b.schema))
	require.NoError(t, err)
	ids, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "C", Payload: []byte("x")})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.dead_letters (id, nonce, topic, payload, created_at, attempts, last_error)
VALUES (100000, 1, 't', '\x00', now(), 3, 'x'), (100001, 1, 't', '\x00', now(), 3, 'x')`)
	require.NoError(t, err)
	addRetry(t, b, seqOf(t, ids[0]), 1, time.Now().Add(time.Hour), "failing")

	st := statusOf(t, b, nil)
	require.Equal(t, wharf.Count{N: 7, Exact: true}, st.Messages)
	require.Equal(t, wharf.Count{N: 2, Exact: true}, st.Scheduled)
	require.Equal(t, int64(5), st.Due())
	require.Equal(t, wharf.Count{N: 1, Exact: true}, st.Retrying)
	require.Equal(t, wharf.Count{N: 2, Exact: true}, st.DeadLetters)
	requireAbout(t, 140*time.Minute, st.OldestDueAge, "other topic, same key: not held by default")
	require.Empty(t, st.OldestDueUnknown)

	across := testConfig(b.schema)
	across.OrderAcrossTopics = true
	st = statusOf(t, b, across)
	requireAbout(t, 30*time.Minute, st.OldestDueAge, "with OrderAcrossTopics the key holds every topic")

	// A message waiting for its retry is late.
	insertAged(t, b, "t", "D", 4*time.Hour, nil)
	var seq int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT max(id) FROM "+b.schema+".outbox").Scan(&seq))
	addRetry(t, b, seq, 2, time.Now().Add(time.Hour), "failing")
	st = statusOf(t, b, nil)
	requireAbout(t, 4*time.Hour, st.OldestDueAge, "a retrying message is due")
	require.Equal(t, wharf.Count{N: 2, Exact: true}, st.Retrying)
}

// A lane whose first StatusScanBound messages are all scheduled is reported
// as not looked into, instead of being read to its end.
func TestStatusBoundsTheWalkPastScheduledMessages(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.outbox (topic, key, payload, deliver_at)
SELECT 't', 'A', '\x00', now() + interval '1 hour' FROM generate_series(1, $1)`, wharf.StatusScanBound)
	require.NoError(t, err)
	insertAged(t, b, "t", sameLaneKey(t, b, "A"), time.Hour, nil) // due, past the bound
	insertAged(t, b, "t", "B", 10*time.Minute, nil)
	var lane int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT hashtext('A') & 63").Scan(&lane))
	st := statusOf(t, b, nil)
	require.Equal(t, []int{lane}, st.OldestDueUnknown)
	requireAbout(t, 10*time.Minute, st.OldestDueAge, "the other lanes are still looked at")
	require.Equal(t, int64(wharf.StatusScanBound+2), st.Messages.N)
}

// A table larger than StatusExactPages is estimated from a sample of its
// pages, close to the truth, and says so.
func TestStatusEstimatesALargeOutbox(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	const n = 120000
	_, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.outbox (topic, key, payload, deliver_at)
SELECT 't', 'k' || (i % 1000), convert_to(repeat('p', 150), 'UTF8'),
    CASE WHEN i % 5 = 0 THEN now() + interval '1 hour' END
FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	var pages int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / 8192", b.schema+".outbox").Scan(&pages))
	require.Greater(t, pages, int64(wharf.StatusExactPages), "the table must be past the exact-count size")
	st := statusOf(t, b, nil)
	require.False(t, st.Messages.Exact)
	require.False(t, st.Scheduled.Exact)
	require.InEpsilon(t, n, st.Messages.N, 0.1, "estimate %d of %d", st.Messages.N, n)
	require.InEpsilon(t, n/5, st.Scheduled.N, 0.15, "scheduled estimate %d of %d", st.Scheduled.N, n/5)
}

// Relays are listed with their heartbeat age and the lanes they hold; a
// relay that stopped heartbeating (killed) is shown dead and owning nothing,
// its lanes as expired.
func TestStatusShowsDeadRelaysAndExpiredLanes(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
INSERT INTO `+b.schema+`.relays (relay_id, host, pid, heartbeat_at, lease_until) VALUES
    ('live', 'h1', 11, now() - interval '1 second', now() + interval '9 seconds'),
    ('killed', 'h2', 22, now() - interval '30 seconds', now() - interval '20 seconds');
UPDATE `+b.schema+`.lanes SET owner = 'live', fence = 1 WHERE lane BETWEEN 10 AND 20;
UPDATE `+b.schema+`.lanes SET owner = 'killed', fence = 1 WHERE lane < 10`)
	require.NoError(t, err)
	st := statusOf(t, b, nil)
	require.Equal(t, 10*time.Second, st.LeaseTTL, "the TTL is what the live relay's leases show")
	require.Len(t, st.Relays, 2)
	killed, live := st.Relays[0], st.Relays[1]
	require.Equal(t, "killed", killed.ID)
	require.False(t, killed.Live)
	require.Empty(t, killed.Lanes, "a dead relay owns no lane")
	requireAbout(t, 30*time.Second, killed.HeartbeatAge, "heartbeat age")
	require.Equal(t, "live", live.ID)
	require.True(t, live.Live)
	require.Equal(t, 11, live.PID)
	require.Len(t, live.Lanes, 11)
	require.Equal(t, 10, live.Lanes[0])
	require.Greater(t, live.LeaseLeft, 5*time.Second)
	for _, l := range st.Lanes[:10] {
		require.True(t, l.Expired(), "lane %d", l.Lane)
		require.Equal(t, "killed", l.Owner)
		require.Less(t, l.LeaseLeft, -15*time.Second)
	}
	uncovered := st.UncoveredLanes()
	require.Len(t, uncovered, 64-11)
	require.Equal(t, 0, uncovered[0])
	require.Equal(t, 21, uncovered[10])
}
