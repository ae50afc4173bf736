package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
)

// startPgBouncer runs a private PgBouncer in transaction pooling mode in front
// of the test database and returns a URL through it. It refuses to run as
// root, so when root it runs as the postgres OS user.
func startPgBouncer(t *testing.T) string {
	t.Helper()
	bin := testtool.Path(t, "pgbouncer", "apt-get install pgbouncer (.ci/run does)", "/usr/sbin/pgbouncer")
	pc, err := pgconn.ParseConfig(databaseURL)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())

	dir, err := os.MkdirTemp("", "wharf-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := fmt.Sprintf(`[databases]
* = host=%s port=%d user=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = %s
`, pc.Host, pc.Port, pc.User, port, filepath.Join(dir, "pgbouncer.log"))
	cfgPath := filepath.Join(dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))

	cmd := exec.Command(bin, cfgPath)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root needs a postgres OS user for pgbouncer")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer did not start: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?default_query_exec_mode=simple_protocol", pc.User, port, pc.Database)
}

// Producers and a --poll-only relay both go through PgBouncer in transaction
// pooling mode: every message arrives, in key order, and the outbox empties.
func TestThroughPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := startPgBouncer(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, bouncer)
	require.NoError(t, err)
	defer pool.Close()
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	const n = 3000
	want := map[string]bool{}
	for i := 0; i < n; i += 100 {
		msgs := make([]wharf.Message, 100)
		for j := range msgs {
			msgs[j] = wharf.Message{Topic: "pgb", Key: fmt.Sprintf("k%d", (i+j)%37), Payload: fmt.Appendf(nil, `{"n":%d}`, i+j)}
		}
		ids, err := client.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for _, id := range ids {
			want[id] = true
		}
	}
	out := filepath.Join(t.TempDir(), "out.jsonl")
	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--poll-only", "--sink", "file://"+out,
		"--schema", b.schema, "--database-url", bouncer, "--log-level", "warn")
	require.Equalf(t, 0, res.code, "relay through pgbouncer failed: %s", res.stderr)
	ds := readJSONL(t, out, 0)
	require.Len(t, ds, n)
	for _, d := range ds {
		require.True(t, want[d.ID], "unexpected id %s", d.ID)
		delete(want, d.ID)
	}
	require.Empty(t, want)
	requireKeyOrder(t, "through pgbouncer", ds)
	require.Equal(t, 0, b.outboxCount(t))
}
