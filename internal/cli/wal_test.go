package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// The README's WAL mode, end to end through the CLI: migrate up --mode wal,
// enqueue with the SQL function, a relay with --drain delivers everything
// to a file and exits, status shows the slot; a bad --mode and switching
// back are refused.
func TestMigrateUpWALModeAndRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wcw_" + hex.EncodeToString(b[:])
	args := func(a ...string) []string { return append(a, "--schema", schema, "--database-url", url) }
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() {
		m, _ := wharfmigrate.New(schema)
		_, _ = m.Down(context.Background(), pool, 0)
		pool.Close()
	})

	code, _, errOut := run(args("migrate", "up", "--mode", "sideways")...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--mode must be table or wal")

	code, out, errOut := run(args("migrate", "up", "--mode", "wal")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "switched to WAL mode")
	code, out, errOut = run(args("migrate", "up", "--mode", "wal")...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "switched")
	require.Contains(t, out, "is in WAL mode, with its replication slot "+schema)
	// A dropped slot: enqueueing is refused, and migrate up --mode wal
	// creates it again and says so.
	_, err = pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT "+schema+".enqueue('orders', 'k', '{}'::jsonb)")
	require.ErrorContains(t, err, "run `wharf migrate up --mode wal --schema "+schema+"` to create the slot again")
	code, out, errOut = run(args("status")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "(missing)")
	require.Contains(t, out, "the slot is missing: enqueues are refused until `wharf migrate up --mode wal --schema "+schema+"` creates it again")
	code, out, errOut = run(args("migrate", "up", "--mode", "wal")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "the replication slot "+schema+" was missing: created it again")
	code, _, errOut = run(args("migrate", "up", "--mode", "table")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "switching back to table mode is not supported")

	for i := 0; i < 50; i++ {
		_, err := pool.Exec(ctx, "SELECT "+schema+".enqueue('orders', 'k'||($1::int % 5), jsonb_build_object('n', $1::int))", i)
		require.NoError(t, err)
	}
	outFile := filepath.Join(t.TempDir(), "out.jsonl")
	code, _, errOut = run(args("relay", "--sink", "file://"+outFile, "--drain")...)
	require.Equal(t, 0, code, errOut)
	data, err := os.ReadFile(outFile)
	require.NoError(t, err)
	require.Equal(t, 50, strings.Count(string(data), "\n"), "delivered lines")

	code, out, errOut = run(args("status")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `mode\s+WAL: slot `+schema+`, no relay streams it, \d+ bytes of WAL behind \(reserved\)`, out)
}

// migrate up --mode wal on a server with wal_level=replica refuses before
// applying any migration: one line, exit 1, no schema left behind.
func TestMigrateUpWALModeChecksBeforeMigrating(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer pool.Close()
	schema := "wcr"
	code, out, errOut := run("migrate", "up", "--mode", "wal", "--schema", schema, "--database-url", c.URL())
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "WAL mode needs wal_level=logical, and the server runs with wal_level=replica")
	require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %s", errOut)
	require.Empty(t, out, "nothing migrated")
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists))
	require.False(t, exists, "migrate up --mode wal left schema %s behind", schema)
}

// wharf demo --mode wal runs its three steps on a WAL outbox and leaves no
// schema, slot or publication behind.
func TestDemoInWALMode(t *testing.T) {
	t.Parallel()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	code, out, errOut := run("demo", "--mode", "wal", "--database-url", url, "--messages", "2000", "--keys", "10")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^mode +WAL: messages are written to the WAL only and streamed from the replication slot wharf_demo_[0-9a-f]+$`, out)
	require.Contains(t, out, "(a message's seq is its position in the WAL, so seqs start high and leave gaps)")
	require.Contains(t, out, "every key's messages arrived in enqueue order")
	require.Contains(t, out, "key order  intact across 10 keys")
	schema := regexp.MustCompile(`slot (wharf_demo_[0-9a-f]+)`).FindStringSubmatch(out)[1]
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	var left bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)
    OR EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1) OR EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&left))
	require.False(t, left, "the demo left its schema, slot or publication behind")

	code, _, errOut = run("demo", "--mode", "sideways", "--database-url", url)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--mode must be table or wal")
}
