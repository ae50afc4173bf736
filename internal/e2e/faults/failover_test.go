//go:build faults

package faults

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/pgembed"
)

// pgTool runs a PostgreSQL program as the OS user postgres when the test
// runs as root (the server refuses root), from a directory that user can
// read.
func pgTool(t *testing.T, dir, tool string, args ...string) {
	t.Helper()
	bin, err := pgembed.FindBinaries()
	must(t, err, "PostgreSQL binaries")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(bin, tool)
	if _, err := os.Stat(path); err != nil {
		path = needBinary(t, tool)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		must(t, err, "OS user postgres")
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out.String())
	}
}

// A streaming standby, built with pg_basebackup from a pgembed primary with
// synchronous replication, is promoted after the primary crashes under
// load. The relays and the producers use one URL naming both hosts with
// target_session_attrs=read-write, so they find the new primary by
// themselves.
func TestStandbyFailover(t *testing.T) {
	needBinary(t, "pg_basebackup")
	ctx := context.Background()
	primary, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{
		"synchronous_commit": "on", "synchronous_standby_names": "*", "wal_level": "replica", "max_wal_senders": "5",
	}})
	must(t, err, "start the primary")
	t.Cleanup(func() { _ = primary.Stop() })
	pu, err := url.Parse(primary.URL())
	must(t, err, "primary URL")

	base, err := os.MkdirTemp("", "wharf-standby-")
	must(t, err, "standby dir")
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o777), "chmod standby dir")
	data := filepath.Join(base, "data")
	port := freePort(t)
	pgTool(t, base, "pg_basebackup", "-d", primary.URL(), "-D", data, "-R", "-X", "stream", "-c", "fast")
	opts := fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c synchronous_commit=on -c fsync=off -c max_connections=200", port, base)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(base, "log"))
			t.Logf("standby log:\n%s", b)
		}
	})
	pgTool(t, base, "pg_ctl", "-D", data, "-l", filepath.Join(base, "log"), "-w", "-t", "60", "start", "-o", opts)
	t.Cleanup(func() {
		bin, _ := pgembed.FindBinaries()
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop")
		if os.Geteuid() == 0 {
			if u, err := user.Lookup("postgres"); err == nil {
				uid, _ := strconv.ParseUint(u.Uid, 10, 32)
				gid, _ := strconv.ParseUint(u.Gid, 10, 32)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
			}
		}
		cmd.Dir = base
		_ = cmd.Run()
	})
	// Wait until the standby streams synchronously.
	if !within(30*time.Second, func() bool {
		pool, err := pgxpool.New(ctx, primary.URL())
		if err != nil {
			return false
		}
		defer pool.Close()
		var n int
		err = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'").Scan(&n)
		return err == nil && n == 1
	}) {
		t.Fatal("the standby is not streaming synchronously after 30s")
	}

	both := fmt.Sprintf("postgres://postgres@%s,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=3", pu.Host, port)
	o := newOutbox(t, both)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	r1 := startRelay(t, o, "", "a", "", "--sink", sinkFile(path))
	r2 := startRelay(t, o, "", "b", "", "--sink", sinkFile(path))
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)

	must(t, primary.StopServer("immediate"), "crash the primary")
	crashed := time.Now()
	time.Sleep(pick(time.Second, 5*time.Second)) // detection time of a failover manager
	pgTool(t, base, "pg_ctl", "-D", data, "-w", "promote")
	promoted := time.Now()
	time.Sleep(pick(3*time.Second, 20*time.Second)) // producers commit on the new primary
	rs := []*relay{r1, r2}
	revive(t, rs)
	addNote(t, "promoted %s after the crash", promoted.Sub(crashed).Round(10*time.Millisecond))
	verify(t, "primary crash, synchronous standby promoted (two-host URL)", o, l, col, promoted, 90*time.Second)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}
