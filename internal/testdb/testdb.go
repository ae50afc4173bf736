// Package testdb gives a test binary its PostgreSQL: TEST_DATABASE_URL when it
// is set, otherwise a throwaway cluster started from the local server binaries.
// It never skips: without a database the test binary fails.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/pgembed"
)

// Main is Run followed by os.Exit. Call it from TestMain.
func Main(m *testing.M, url *string) { os.Exit(Run(m, url)) }

// MainOwnDatabase is Main with the tests in a database of their own, name,
// created empty on the same server and dropped afterwards. Tests that read
// database-wide statistics (commits in pg_stat_database) use it so that
// other test binaries running at the same time are not counted.
func MainOwnDatabase(m *testing.M, url *string, name string) {
	os.Exit(run(m, url, name))
}

// Run resolves the database URL into *url, runs the tests, stops the cluster
// it started, checks for leaked goroutines and returns the exit status.
func Run(m *testing.M, url *string) int { return run(m, url, "") }

func run(m *testing.M, url *string, own string) int {
	*url = os.Getenv("TEST_DATABASE_URL")
	var cluster *pgembed.Cluster
	if *url == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var err error
		cluster, err = pgembed.Start(ctx, pgembed.Options{})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "TEST_DATABASE_URL is not set and no local PostgreSQL could be started:", err)
			return 1
		}
		*url = cluster.URL()
		// Tests in the package itself (not _test) read it from here.
		_ = os.Setenv("TEST_DATABASE_URL", *url)
	}
	drop := func() {}
	if own != "" {
		u, dropOwn, err := ownDatabase(*url, own)
		if err != nil {
			fmt.Fprintln(os.Stderr, "creating the test database:", err)
			if cluster != nil {
				_ = cluster.Stop()
			}
			return 1
		}
		drop = dropOwn
		*url = u
		_ = os.Setenv("TEST_DATABASE_URL", *url)
	}
	code := m.Run()
	drop() // while the server still runs
	if cluster != nil {
		_ = cluster.Stop()
	}
	if logical.c != nil {
		_ = logical.c.Stop()
	}
	if code == 0 {
		opts := append(leakcheck.Permanent(), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

var logical struct {
	once sync.Once
	c    *pgembed.Cluster
	err  error
}

// LogicalURL returns the URL of a throwaway cluster with wal_level=logical,
// for the tests of the WAL mode (the shared test server may run with
// replica): started on first use, stopped after the tests by Run.
func LogicalURL() (string, error) {
	logical.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		logical.c, logical.err = pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"wal_level": "logical"}})
	})
	if logical.err != nil {
		return "", fmt.Errorf("a local PostgreSQL with wal_level=logical could not be started: %w", logical.err)
	}
	return logical.c.URL(), nil
}

// CleanEnv is the test's environment without anything that could point a
// wharf binary at a database or schema other than the one a test passes on
// its command line (DATABASE_URL, WHARF_*).
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "WHARF_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// ownDatabase creates database name afresh on the server of base and returns
// its URL and a function that drops it.
func ownDatabase(base, name string) (string, func(), error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", nil, fmt.Errorf("TEST_DATABASE_URL must be a postgres:// URL to create database %s on its server", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if conn, err := pgx.Connect(ctx, base); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

// LogicalDatabase creates a database of its own, named prefix_ and random
// hex, on the logical test server (LogicalURL), and returns a superuser's
// pool on it, its URL and its name; it is dropped at cleanup. A fresh
// database comes from template1, where PUBLIC may still execute
// pg_logical_emit_message: for tests of what WAL mode changes there.
func LogicalDatabase(t testing.TB, prefix string) (*pgxpool.Pool, string, string) {
	t.Helper()
	ctx := context.Background()
	base, err := LogicalURL()
	if err != nil {
		t.Fatal(err)
	}
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	name := prefix + "_" + hex.EncodeToString(rb[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	return pool, u.String(), name
}
