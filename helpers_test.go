package wharf_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

type testBundle struct {
	pool   *pgxpool.Pool
	schema string
}

// setupDB gives a test its own freshly migrated schema, dropped at cleanup, so
// tests that need committed rows can run in parallel.
func setupDB(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wt_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	})
	return &testBundle{pool: pool, schema: schema}
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

func testLogger() *slog.Logger {
	if os.Getenv("WHARF_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
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
func deliveredIDs(msgs []wharf.Message) map[int64]int {
	out := map[int64]int{}
	for _, m := range msgs {
		out[m.ID]++
	}
	return out
}

// requireKeyOrder checks per-key FIFO over a delivery log that may hold
// redeliveries: each message delivered for the first time must have a higher
// id than every message of its key delivered before it.
func requireKeyOrder(t *testing.T, msgs []wharf.Message) {
	t.Helper()
	seen := map[int64]bool{}
	maxByKey := map[string]int64{}
	for _, m := range msgs {
		if m.Key == "" {
			continue
		}
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		require.Greaterf(t, m.ID, maxByKey[m.Key], "key %q: message %d delivered after %d", m.Key, m.ID, maxByKey[m.Key])
		maxByKey[m.Key] = m.ID
	}
}

// outboxCount is for assertions only; the relay never counts.
func outboxCount(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	return n
}
