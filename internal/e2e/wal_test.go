package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// setupWAL is setup for an outbox in WAL mode (wharf migrate up --mode wal)
// on a cluster with wal_level=logical; it returns the cluster's URL too.
func setupWAL(t *testing.T) (*bundle, string) {
	t.Helper()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	schema := "wew_" + randHex(5)
	res := runCLI(t, nil, time.Minute, "migrate", "up", "--mode", "wal", "--schema", schema, "--database-url", url)
	require.Equalf(t, 0, res.code, "wharf migrate up --mode wal failed:\nstdout: %s\nstderr: %s", res.stdout, res.stderr)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() {
		m, _ := wharfmigrate.New(schema)
		for i := 0; i < 50; i++ { // the relays' walsenders end a moment after them
			if _, err := m.Down(context.Background(), pool, 0); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		pool.Close()
	})
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, client: client}, url
}

// A relay of a WAL outbox SIGKILLed in the middle of a backlog loses
// nothing: a second relay takes the lanes and the slot over after the lease
// TTL and drains the rest; every duplicate is a message the dead relay
// delivered after the slot's last confirmation (measured: all of A's 3,000 to
// 4,400, since the settled prefix of the stream trails the deliveries of
// the fastest keys).
func TestWALKill9MidStreamThenNewRelayFinishes(t *testing.T) {
	t.Parallel()
	b, url := setupWAL(t)
	dir := t.TempDir()
	const total, batch, nkeys = 30000, 500, 200
	enq := newEnqueued()
	for start := 0; start < total; start += batch {
		msgs := make([]wharf.Message, batch)
		for j := range msgs {
			i := start + j
			msgs[j] = wharf.Message{Topic: "orders", Key: fmt.Sprintf("k%03d", i%nkeys), Payload: payload100(i)}
		}
		enqueueAll(t, b, enq, msgs)
	}
	sent := enq.snapshot()
	require.Len(t, sent, total)

	aPath := filepath.Join(dir, "a.jsonl")
	a := startRelayAt(t, b, url, "A", "", "--sink", "file://"+aPath, "--fetch-batch", "500", "--max-buffered", "2000")
	deadline := time.Now().Add(30 * time.Second)
	for countLines(aPath) < 3000 {
		if a.exited() {
			t.Fatalf("relay A exited (%v) before delivering 3000 messages\nstderr:\n%s", a.waitErr, a.stderrTail(4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay A delivered only %d messages in 30s\nstderr:\n%s", countLines(aPath), a.stderrTail(4000))
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.kill9(t)

	bPath := filepath.Join(dir, "b.jsonl")
	rb := startRelayAt(t, b, url, "B", "", "--drain", "--sink", "file://"+bPath)
	rb.requireExitZero(t, 60*time.Second)

	as := readJSONL(t, aPath, 1) // A was SIGKILLed: its last line may be torn
	bs := readJSONL(t, bPath, 0)
	countA, countB := map[int64]int{}, map[int64]int{}
	for _, d := range as {
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "a.jsonl: seq %d was never enqueued", d.Seq)
		requireMatches(t, m, d)
		countA[d.Seq]++
		require.Equalf(t, 1, countA[d.Seq], "relay A delivered message %d twice", d.Seq)
	}
	dups := 0
	for _, d := range bs {
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "b.jsonl: seq %d was never enqueued", d.Seq)
		requireMatches(t, m, d)
		countB[d.Seq]++
		require.Equalf(t, 1, countB[d.Seq], "relay B (a clean drain) delivered message %d twice", d.Seq)
		if countA[d.Seq] > 0 {
			dups++
		}
	}
	missing, nMissing := firstMissing(sent, func(id int64) bool { return countA[id]+countB[id] > 0 }, 20)
	require.Zerof(t, nMissing, "%d of %d enqueued messages were never delivered; first: %v", nMissing, total, missing)
	requireKeyOrder(t, "a.jsonl", as)
	requireKeyOrder(t, "b.jsonl", bs)
	requireKeyOrder(t, "a.jsonl followed by b.jsonl", append(slices.Clip(as), bs...))
	t.Logf("A: %d parsed lines; B: %d lines in %s; %d delivered twice", len(as), len(bs), time.Since(rb.started).Round(time.Millisecond), dups)
}
