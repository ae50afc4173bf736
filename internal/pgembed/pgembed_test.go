package pgembed

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/testtool"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	if _, err := FindBinaries(); err != nil {
		testtool.Missing(t, "initdb", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func requireGone(t *testing.T, c *Cluster) {
	t.Helper()
	_, err := os.Stat(c.dir)
	require.ErrorIs(t, err, os.ErrNotExist, "temp dir should be removed")
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), time.Second)
	if err != nil {
		return // nothing listens there any more
	}
	conn.Close()
	// Something accepts on the port: with tests of other packages starting
	// clusters of their own, a freed port is soon taken again. It must not
	// be this cluster's server.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pc, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return // not a server this cluster's URL reaches
	}
	defer pc.Close(ctx)
	var dir string
	require.NoError(t, pc.QueryRow(ctx, "SHOW data_directory").Scan(&dir))
	require.NotEqual(t, c.dataDir, dir, "the server of %s still accepts connections on port %d", c.dataDir, c.port)
}

func TestStartConnectStop(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Options{Settings: map[string]string{"application_name": "wharf pgembed 'test'"}})
	require.True(t, strings.HasPrefix(c.URL(), "postgres://postgres@127.0.0.1:"), c.URL())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	_, err = conn.Exec(ctx, "CREATE TABLE t (id bigint PRIMARY KEY, v text)")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (1, 'x')")
	require.NoError(t, err)

	// Settings reach the server (and survive shell quoting); defaults apply.
	var maxConns, fsync, walLevel string
	require.NoError(t, conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns))
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.NoError(t, conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel))
	require.Equal(t, "200", maxConns)
	require.Equal(t, "off", fsync)
	require.Equal(t, "logical", walLevel, "an outbox in WAL mode streams from a logical slot")
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop())
	requireGone(t, c)
	require.NoError(t, c.Stop(), "second Stop")
}

func TestStopAfterServerDied(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Options{})
	pidFile, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, time.Minute, 20*time.Millisecond)

	require.NoError(t, c.Stop())
	requireGone(t, c)
}

func TestStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	if _, err := FindBinaries(); err != nil {
		testtool.Missing(t, "initdb", err.Error())
	}
	before, err := filepath.Glob(filepath.Join(os.TempDir(), "wharf-pg-*"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = Start(ctx, Options{Settings: map[string]string{"no_such_setting": "1"}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "server log:")
	require.Contains(t, err.Error(), "no_such_setting")
	require.NotContains(t, err.Error(), "\n")
	// Other tests run in parallel, so only require that our dir did not stay.
	after, err := filepath.Glob(filepath.Join(os.TempDir(), "wharf-pg-*"))
	require.NoError(t, err)
	for _, d := range after {
		if !contains(before, d) {
			_, statErr := os.Stat(filepath.Join(d, "data", "postgresql.conf"))
			// A parallel test's live cluster has one; a leftover failed one would too,
			// so tell them apart by the bad setting in its log.
			if statErr == nil {
				log, _ := os.ReadFile(filepath.Join(d, "server.log"))
				require.NotContains(t, string(log), "no_such_setting", "failed start left %s behind", d)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func fakeBin(t *testing.T, dir string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range []string{"initdb", "pg_ctl"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755))
	}
	return dir
}

func TestFindBinaries(t *testing.T) {
	t.Parallel()

	t.Run("on PATH", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		empty := filepath.Join(root, "empty")
		require.NoError(t, os.Mkdir(empty, 0o755))
		bin := fakeBin(t, filepath.Join(root, "pgbin"))
		fakeBin(t, filepath.Join(root, "lib", "16", "bin"))
		got, err := findBinaries(strings.Join([]string{empty, "", bin}, string(os.PathListSeparator)),
			filepath.Join(root, "lib", "*", "bin"), filepath.Join(root, "none"))
		require.NoError(t, err)
		require.Equal(t, bin, got)
	})

	t.Run("glob picks highest version", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		fakeBin(t, filepath.Join(root, "lib", "9", "bin"))
		want := fakeBin(t, filepath.Join(root, "lib", "16", "bin"))
		// Only one of the two tools: not an install.
		require.NoError(t, os.MkdirAll(filepath.Join(root, "lib", "17", "bin"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "lib", "17", "bin", "initdb"), nil, 0o755))
		got, err := findBinaries(filepath.Join(root, "empty"), filepath.Join(root, "lib", "*", "bin"), filepath.Join(root, "none"))
		require.NoError(t, err)
		require.Equal(t, want, got)
	})

	t.Run("fallback", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		want := fakeBin(t, filepath.Join(root, "local"))
		got, err := findBinaries("", filepath.Join(root, "lib", "*", "bin"), want)
		require.NoError(t, err)
		require.Equal(t, want, got)
	})

	t.Run("not found", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		// Present but not executable does not count.
		require.NoError(t, os.WriteFile(filepath.Join(root, "initdb"), nil, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(root, "pg_ctl"), nil, 0o644))
		_, err := findBinaries(root, filepath.Join(root, "lib", "*", "bin"), filepath.Join(root, "none"))
		require.Error(t, err)
		require.Contains(t, err.Error(), "apt-get install postgresql")
		require.NotContains(t, err.Error(), "\n")
	})
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	require.Positive(t, compareVersions("16", "9"))
	require.Negative(t, compareVersions("9.6", "10"))
	require.Positive(t, compareVersions("9.6", "9.5"))
	require.Zero(t, compareVersions("15", "15"))
	require.Negative(t, compareVersions("devel", "9"))
	require.Negative(t, compareVersions("9", "9.1"))
}

func TestHasLibrary(t *testing.T) {
	dir := t.TempDir()
	bin, lib := filepath.Join(dir, "bin"), filepath.Join(dir, "lib")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.MkdirAll(lib, 0o755))
	require.False(t, HasLibrary(bin, "pg_stat_statements"), "no library in ../lib yet")
	require.NoError(t, os.WriteFile(filepath.Join(lib, "pg_stat_statements.so"), nil, 0o644))
	require.True(t, HasLibrary(bin, "pg_stat_statements"), "../lib beside a bin without pg_config")
	require.False(t, HasLibrary(bin, "pgstattuple"))

	// A directory of links to the binaries, as /usr/local/bin may be.
	links := filepath.Join(dir, "links")
	require.NoError(t, os.MkdirAll(links, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "initdb"), nil, 0o755))
	require.NoError(t, os.Symlink(filepath.Join(bin, "initdb"), filepath.Join(links, "initdb")))
	require.True(t, HasLibrary(links, "pg_stat_statements"), "followed through initdb's link")
}
