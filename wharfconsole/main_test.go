package wharfconsole_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

// newSchema gives a test a freshly migrated schema of its own, dropped at
// cleanup.
func newSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wcon_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	})
	return pool, schema
}

func testLogger() *slog.Logger {
	if os.Getenv("WHARF_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
