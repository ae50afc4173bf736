package wharf_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

type testBundle struct {
	pool   *pgxpool.Pool
	schema string

	mu        sync.Mutex
	committed walstream.LSN // a WAL position past every commitMessages
}

// committedTo is a WAL position past every commit of commitMessages.
func (b *testBundle) committedTo() walstream.LSN {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.committed
}

// setupDB gives a test its own freshly migrated schema, dropped at cleanup, so
// tests that need committed rows can run in parallel.
func setupDB(t *testing.T) *testBundle {
	t.Helper()
	pool, schema, _ := migratedSchema(t, databaseURL, "wt_")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	})
	return &testBundle{pool: pool, schema: schema}
}

// migratedSchema migrates a fresh schema, prefix and random letters, at url
// and returns a pool of 12 connections to it; the caller cleans up.
func migratedSchema(t testing.TB, url, prefix string) (*pgxpool.Pool, string, *wharfmigrate.Migrator) {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := prefix + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	return pool, schema, m
}

var (
	sharedOnce   sync.Once
	sharedSchema string
	sharedPool   *pgxpool.Pool
	sharedErr    error
)

// testTx gives a test a transaction in one migrated schema shared by the
// package, rolled back at cleanup: for tests that need no committed rows
// (enqueue and its validation), far cheaper than a schema each.
func testTx(t *testing.T) (pgx.Tx, string) {
	t.Helper()
	sharedOnce.Do(func() {
		ctx := context.Background()
		// One fixed schema, reused by every run: it only ever holds
		// rolled-back rows, and migrating it again is a no-op.
		sharedSchema = "wt_shared"
		if sharedPool, sharedErr = pgxpool.New(ctx, databaseURL); sharedErr != nil {
			return
		}
		m, err := wharfmigrate.New(sharedSchema)
		if err != nil {
			sharedErr = err
			return
		}
		_, sharedErr = m.Up(ctx, sharedPool)
	})
	require.NoError(t, sharedErr)
	tx, err := sharedPool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(context.Background())) })
	return tx, sharedSchema
}

// testConfig is a relay configuration fast enough for tests.
func testConfig(schema string) *wharf.Config {
	return &wharf.Config{
		Schema:            schema,
		Logger:            testLogger(),
		LeaseTTL:          3 * time.Second,
		RebalanceInterval: 200 * time.Millisecond,
		RetryBackoff:      20 * time.Millisecond,
		MaxRetryBackoff:   200 * time.Millisecond,
		PollInterval:      50 * time.Millisecond,
	}
}

// recordingClient returns a client of b's outbox whose handler records what
// it delivers, with testConfig changed by configure (may be nil); not started.
func recordingClient(t *testing.T, b *testBundle, configure func(*wharf.Config)) (*wharf.Client, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Logger = testLogT(t)
	cfg.Handler = rec.handle
	if configure != nil {
		configure(cfg)
	}
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	return client, rec
}

func testLogger() *slog.Logger {
	if os.Getenv("WHARF_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testLogT is a logger whose records go to t.Log (shown when t fails, or
// with -v), and to stderr as testLogger's with WHARF_TEST_LOG set: a test
// that fails only on a loaded machine then says what its relay saw. Records
// after t ended are dropped.
func testLogT(t testing.TB) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	if os.Getenv("WHARF_TEST_LOG") != "" {
		_, _ = os.Stderr.Write(p)
	}
	return len(p), nil
}

// recorder is a handler that records every delivery, in order.
type recorder struct {
	mu   sync.Mutex
	got  []wharf.Message
	fail func(*wharf.Message) error
}

func (r *recorder) handle(_ context.Context, m *wharf.Message) error {
	if r.fail != nil {
		if err := r.fail(m); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.got = append(r.got, *m)
	r.mu.Unlock()
	return nil
}

func (r *recorder) snapshot() []wharf.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wharf.Message(nil), r.got...)
}

// deliveredIDs returns the distinct delivered ids.
func deliveredIDs(msgs []wharf.Message) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		out[m.ID]++
	}
	return out
}

// requireKeyOrder checks per-(topic, key) FIFO over a delivery log that may
// hold redeliveries: each message delivered for the first time must have a
// higher seq than every message of its topic and key delivered before it.
func requireKeyOrder(t *testing.T, msgs []wharf.Message) {
	t.Helper()
	seen := map[string]bool{}
	maxByKey := map[[2]string]int64{}
	for _, m := range msgs {
		if m.Key == "" {
			continue
		}
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		k := [2]string{m.Topic, m.Key}
		require.Greaterf(t, m.Seq, maxByKey[k], "topic %q key %q: message %d delivered after %d", m.Topic, m.Key, m.Seq, maxByKey[k])
		maxByKey[k] = m.Seq
	}
}

// outboxCount is for assertions only; the relay never counts.
func outboxCount(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	return n
}

// leaseLanes makes owner, a relay that is not running, the leaseholder of
// the lanes matching where (a condition on the lanes table), for lease
// (negative: expired that long ago), with a new fence, as a takeover by
// another relay would.
func leaseLanes(t *testing.T, b *testBundle, owner string, lease time.Duration, where string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.relays AS r (relay_id, heartbeat_at, lease_until)
VALUES ($1, now() + $2 * interval '1 millisecond', now() + $2 * interval '1 millisecond')
ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until`, owner, lease.Milliseconds())
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), "UPDATE "+b.schema+".lanes SET owner = $1, fence = fence + 1 WHERE "+where, owner)
	require.NoError(t, err)
}

// leasedLanes counts the lanes owner holds with a lease that has not run out.
func leasedLanes(t *testing.T, b *testBundle, owner string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".lanes l JOIN "+b.schema+
		".relays r ON r.relay_id = l.owner WHERE l.owner = $1 AND r.lease_until > now()", owner).Scan(&n))
	return n
}
