package wharfflow_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

type testBundle struct {
	pool   *pgxpool.Pool
	schema string
	client *wharfflow.Client
}

// setup gives a test its own freshly migrated schema, dropped at cleanup.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wf_" + hex.EncodeToString(b[:])
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
	client, err := wharfflow.NewClient(pool, schema)
	require.NoError(t, err)
	return &testBundle{pool: pool, schema: schema, client: client}
}

// listen holds a connection listening on the flows' notification channel
// until the test ends.
func (b *testBundle) listen(t *testing.T) *pgxpool.Conn {
	t.Helper()
	conn, err := b.pool.Acquire(context.Background())
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), "LISTEN "+b.schema+"_flows")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "UNLISTEN *")
		conn.Release()
	})
	return conn
}

func testLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startRunner starts a runner on the bundle's schema and stops it at cleanup.
func (b *testBundle) startRunner(t *testing.T, cfg wharfflow.Config) *wharfflow.Runner {
	t.Helper()
	return b.startRunnerOn(t, b.pool, cfg)
}

// startRunnerOn is startRunner with a pool of the test's own (a tracer, an
// application_name).
func (b *testBundle) startRunnerOn(t *testing.T, pool *pgxpool.Pool, cfg wharfflow.Config) *wharfflow.Runner {
	t.Helper()
	cfg.Schema = b.schema
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	r, err := wharfflow.NewRunner(pool, &cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// status is an instance's status.
func (b *testBundle) status(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT status FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&s))
	return s
}

// waitStatus waits for instance id to reach status (a minute as hang guard).
func (b *testBundle) waitStatus(t *testing.T, id int64, status string) {
	t.Helper()
	require.Eventually(t, func() bool { return b.status(t, id) == status }, time.Minute, 10*time.Millisecond,
		"instance %d never reached %s", id, status)
}

// history is an instance's step history as "step/attempt/outcome" in order.
func (b *testBundle) history(t *testing.T, id int64) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT step || '/' || attempt || '/' || outcome FROM "+b.schema+
		".flow_steps WHERE instance_id = $1 ORDER BY finished_at, step", id)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// openSQL opens a database/sql handle (the pgx driver) on the test database.
func openSQL(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
