// Package observe checks Wharf's observability end to end against real
// components: a real Prometheus scraping a relay's wharfprom handler, the
// dashboard and alerting rules against the metrics a relay serves, promtool
// on the rules, the readiness probe across a database outage, and a trace
// from enqueue to the consumers of NATS JetStream, Kafka and a webhook.
package observe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// repoRoot is the module root, three directories up.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "module root not found at %s", root)
	return root
}

// requireTool returns the path of a program the test needs; without it the
// test fails under CI=true and is skipped otherwise.
func requireTool(t testing.TB, name, install string) string {
	t.Helper()
	return testtool.Path(t, name, install)
}

// migrated creates a fresh schema in the database at url, migrated, and
// drops it at cleanup.
func migrated(t testing.TB, url string, maxConns int32) (*pgxpool.Pool, string) {
	pool, schema, _ := migratedDrop(t, url, maxConns)
	return pool, schema
}

// migratedDrop is migrated, also returning the cleanup (drop the schema,
// close the pool) for a caller that wants it done sooner; it runs once.
func migratedDrop(t testing.TB, url string, maxConns int32) (*pgxpool.Pool, string, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := "wo_" + randHex(5)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	var once sync.Once
	drop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
				t.Logf("drop schema %s: %v", schema, err)
			}
			pool.Close()
		})
	}
	t.Cleanup(drop)
	return pool, schema, drop
}

// startRelay starts c's relay and stops it at cleanup.
func startRelay(t testing.TB, c *wharf.Client) {
	t.Helper()
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Logf("stop relay: %v", err)
		}
	})
}

// serve serves h on a free loopback port until cleanup and returns its
// address (host:port).
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Logf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return l.Addr().String()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// enqueue commits msgs in one transaction and returns their ids.
func enqueue(t testing.TB, ctx context.Context, pool *pgxpool.Pool, c *wharf.Client, msgs ...wharf.Message) []string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = c.EnqueueTx(ctx, tx, msgs...)
		return err
	})
	require.NoError(t, err)
	return ids
}

// httpGet returns the status and body of a GET of url.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// eventually polls cond every interval until it returns "" (done) or the
// timeout passes, then fails with cond's last word on what is missing.
func eventually(t testing.TB, timeout, interval time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, why)
		}
		time.Sleep(interval)
	}
}
