package wharf_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// exclusiveRelay starts a relay with Exclusive set, recording what it
// delivers; stop stops it gracefully (once).
func exclusiveRelay(t *testing.T, b *testBundle, id string, ttl time.Duration) (rec *recorder, stop func()) {
	t.Helper()
	return runRelay(t, b, nil, func(cfg *wharf.Config) { cfg.RelayID, cfg.Exclusive, cfg.LeaseTTL = id, true, ttl })
}

func enqueueKeyed(t *testing.T, b *testBundle, n, keys int) []string {
	t.Helper()
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	msgs := make([]wharf.Message, n)
	for i := range msgs {
		msgs[i] = wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(fmt.Sprint(i))}
	}
	ids, err := c.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	return ids
}

func requireAllDelivered(t *testing.T, rec *recorder, ids []string) {
	t.Helper()
	requireAllDeliveredWithin(t, rec, ids, 20*time.Second, "")
}

// requireAllDeliveredWithin is requireAllDelivered with a time limit and a
// message of its own.
func requireAllDeliveredWithin(t *testing.T, rec *recorder, ids []string, limit time.Duration, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := deliveredIDs(rec.snapshot())
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, limit, 20*time.Millisecond, msg)
}

// Two relays with Exclusive: while another relay holds the lanes (a crashed
// one whose lease has not run out) both stand by; when it runs out exactly
// one of them takes every lane, although both claim in the same round, and
// keeps them all; it drains everything while the other delivers nothing.
// When it stops, the other takes every lane at once, without waiting for a
// lease to run out, and delivers what comes next.
func TestExclusiveRelaysOneDrainsTheOtherStandsBy(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	first := enqueueKeyed(t, b, 2000, 50)
	// A relay that crashed holding every lane: its lease runs until the
	// test ends it below, so the check that nobody takes its lanes does not
	// depend on how fast the relays start.
	leaseLanes(t, b, "crashed", time.Hour, "true")
	const ttl = 20 * time.Second // takeovers below must not wait for a lease to end
	recA, stopA := exclusiveRelay(t, b, "relay-a", ttl)
	recB, stopB := exclusiveRelay(t, b, "relay-b", ttl)

	held := func() (a, c int) { return leasedLanes(t, b, "relay-a"), leasedLanes(t, b, "relay-b") }
	requireNever(t, func() bool { a, c := held(); return a+c > 0 }, time.Second,
		"a relay took lanes another live relay holds")
	leaseLanes(t, b, "crashed", -time.Second, "false") // its lease ends
	require.Eventually(t, func() bool { a, c := held(); return a+c == 64 }, time.Minute, 20*time.Millisecond)
	a, c := held()
	require.True(t, a == 64 || c == 64, "the lanes were split %d/%d", a, c)
	holder, standby, stopHolder, other := "relay-a", "relay-b", stopA, recB
	recHolder := recA
	if c == 64 {
		holder, standby, stopHolder, other, recHolder = "relay-b", "relay-a", stopB, recA, recB
	}
	requireNever(t, func() bool { a, c := held(); return leasedLanes(t, b, holder) != 64 || a+c != 64 }, time.Second,
		"the lanes moved or split while both relays ran")
	requireAllDelivered(t, recHolder, first)
	require.Empty(t, other.snapshot(), "the standby delivered messages")
	requireKeyOrder(t, recHolder.snapshot())

	stopHolder()
	start := time.Now()
	require.Eventually(t, func() bool { return leasedLanes(t, b, standby) == 64 }, ttl/2, 20*time.Millisecond,
		"the standby did not take the lanes a stopped relay released")
	t.Logf("%s took every lane %s after %s stopped", standby, time.Since(start).Round(time.Millisecond), holder)
	second := enqueueKeyed(t, b, 500, 50)
	requireAllDelivered(t, other, second)
	requireKeyOrder(t, other.snapshot())
}

// A relay with Exclusive beside one without it (a rolling change of the
// setting) leaves no lane without a relay: it covers the lanes the other
// leaves free, and does not take or hand back lanes after that.
func TestExclusiveRelayCoversLanesNobodyHolds(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	leaseLanes(t, b, "fair-share", time.Minute, "lane < 32") // alive, holding half
	ids := enqueueKeyed(t, b, 1000, 100)
	var onFree []string
	lanes := map[string]int16{}
	rows, err := b.pool.Query(context.Background(), "SELECT "+b.schema+".message_id(id, nonce)::text, lane FROM "+b.schema+".outbox")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var lane int16
		require.NoError(t, rows.Scan(&id, &lane))
		lanes[id] = lane
	}
	require.NoError(t, rows.Err())
	for _, id := range ids {
		if lanes[id] >= 32 {
			onFree = append(onFree, id)
		}
	}
	require.NotEmpty(t, onFree)
	rec, _ := exclusiveRelay(t, b, "relay-x", 3*time.Second)
	require.Eventually(t, func() bool { return leasedLanes(t, b, "relay-x") == 32 }, time.Minute, 20*time.Millisecond)
	requireNever(t, func() bool { return leasedLanes(t, b, "relay-x") != 32 || leasedLanes(t, b, "fair-share") != 32 },
		time.Second, "the lanes moved after the free ones were covered")
	requireAllDelivered(t, rec, onFree)
	for _, m := range rec.snapshot() {
		if l := lanes[m.ID]; l < 32 {
			t.Fatalf("message %s of lane %d, held by the other relay, was delivered", m.ID, l)
		}
	}
}

// requireNever checks cond every 50 ms for d and fails if it ever holds. It
// checks in the test's goroutine: unlike require.Never, no check is still
// running (and reading the test's schema) when it returns. A sample, not a
// proof: it can miss a brief violation, never report one that did not happen.
func requireNever(t *testing.T, cond func() bool, d time.Duration, msg string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		require.False(t, cond(), msg)
	}
}
