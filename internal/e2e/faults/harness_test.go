//go:build faults

package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"

	"github.com/wharfhq/wharf/internal/testdb"
)

func randName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// outbox is one scenario's migrated schema, with the ledger the producers
// write in their transactions: the ledger says, after any fault, exactly
// which messages committed.
type outbox struct {
	url    string
	schema string
	pool   *pgxpool.Pool
	client *wharf.Client
}

// newOutbox migrates a fresh schema at url with `wharf migrate up` and adds
// the ledger table. The schema is dropped at cleanup (when the database is
// still there).
func newOutbox(t *testing.T, url string) *outbox {
	t.Helper()
	return migrateOutbox(t, url, "table")
}

// newWALOutbox is newOutbox in WAL mode (`wharf migrate up --mode wal`) on
// url, a cluster with wal_level=logical; the slot and the publication are
// dropped at cleanup, after the relays (started later) have stopped.
func newWALOutbox(t *testing.T, url string) *outbox {
	t.Helper()
	o := migrateOutbox(t, url, "wal")
	t.Cleanup(func() {
		for i := 0; i < 100; i++ { // a killed relay's walsender ends a moment later
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := o.pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", o.schema)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, _ = o.pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+o.schema)
	})
	return o
}

// migrateOutbox migrates a fresh schema at url in mode (table or wal).
func migrateOutbox(t *testing.T, url, mode string) *outbox {
	t.Helper()
	schema := randName("wf_")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, wharfBin, "migrate", "up", "--mode", mode, "--schema", schema, "--database-url", url)
	cmd.Env = testdb.CleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wharf migrate up: %v\n%s", err, out)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".fault_ledger (seq bigint PRIMARY KEY, topic text NOT NULL, key text, poison boolean NOT NULL, nonce bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return &outbox{url: url, schema: schema, pool: pool, client: client}
}

func (o *outbox) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	var err error
	if !within(30*time.Second, func() bool { // the database may just have restarted
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+"."+table).Scan(&n)
		return err == nil
	}) {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// lanesOf lists the lanes whose lease names owner.
func (o *outbox) lanesOf(ctx context.Context, owner string) (map[int]bool, error) {
	rows, err := o.pool.Query(ctx, "SELECT l.lane FROM "+o.schema+".lanes l JOIN "+o.schema+".relays r ON r.relay_id = l.owner WHERE l.owner = $1 AND r.lease_until > now()", owner)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var l int
		if err := rows.Scan(&l); err != nil {
			return nil, err
		}
		out[l] = true
	}
	return out, rows.Err()
}

// ownedLanes counts the lanes whose lease names one of owners, in one
// statement: two reads, one per owner, could miss a lane that moved from one
// owner to the other between them.
func (o *outbox) ownedLanes(ctx context.Context, owners ...string) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".lanes l JOIN "+o.schema+".relays r ON r.relay_id = l.owner WHERE l.owner = ANY($1) AND r.lease_until > now()", owners).Scan(&n)
	return n, err
}

// relay is one `wharf relay` child process.
type relay struct {
	o        *outbox
	dbURL    string
	extra    []string
	name, id string
	cmd      *exec.Cmd
	errPath  string
	done     chan struct{}
	waitErr  error
	started  time.Time
}

// fastArgs make leases and polling test-speed.
var fastArgs = []string{"--lease-ttl", "3s", "--rebalance-interval", "200ms", "--poll-interval", "50ms"}

// startRelay starts a relay on o's schema connecting to dbURL ("" = o.url),
// its stdout to stdoutPath ("" = discarded). It is SIGKILLed at cleanup if
// still running, and its stderr tail is logged when the test failed.
func startRelay(t *testing.T, o *outbox, dbURL, name, stdoutPath string, extra ...string) *relay {
	t.Helper()
	if dbURL == "" {
		dbURL = o.url
	}
	id := name + "-" + o.schema
	args := append([]string{"relay", "--schema", o.schema, "--database-url", dbURL, "--relay-id", id}, fastArgs...)
	args = append(args, extra...)
	cmd := exec.Command(wharfBin, args...)
	cmd.Env = testdb.CleanEnv()
	errPath := filepath.Join(t.TempDir(), name+".stderr")
	ef, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	cmd.Stderr = ef
	if stdoutPath == "" {
		stdoutPath = os.DevNull
	}
	of, err := os.OpenFile(stdoutPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	cmd.Stdout = of
	r := &relay{o: o, dbURL: dbURL, extra: extra, name: name, id: id, cmd: cmd, errPath: errPath, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start relay %s: %v", name, err)
	}
	r.started = time.Now()
	go func() { r.waitErr = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		if !r.exited() {
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("relay %s stderr tail:\n%s", name, r.tail(4000))
		}
	})
	return r
}

func (r *relay) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *relay) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v relay %s: %v", sig, r.name, err)
	}
}

func (r *relay) kill9(t *testing.T) {
	t.Helper()
	r.signal(t, syscall.SIGKILL)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("relay %s alive 10s after SIGKILL", r.name)
	}
}

// stop sends SIGTERM and requires exit status 0 within timeout.
func (r *relay) stop(t *testing.T, timeout time.Duration) {
	t.Helper()
	if r.exited() {
		t.Fatalf("relay %s had already exited (%v)\n%s", r.name, r.waitErr, r.tail(4000))
	}
	r.signal(t, syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("relay %s did not stop within %s of SIGTERM\n%s", r.name, timeout, r.tail(4000))
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("relay %s exit status %d (%v)\n%s", r.name, code, r.waitErr, r.tail(4000))
	}
}

// requireAlive fails the test when a relay that should run has exited.
func requireAlive(t *testing.T, rs ...*relay) {
	t.Helper()
	for _, r := range rs {
		if r.exited() {
			t.Fatalf("relay %s exited (%v)\n%s", r.name, r.waitErr, r.tail(4000))
		}
	}
}

// notes holds, per test, what went wrong without stopping the scenario;
// verify puts it in the scenario's row.
var notes sync.Map

func addNote(t *testing.T, format string, args ...any) {
	prev, _ := notes.Load(t.Name())
	s, _ := prev.(string)
	if s != "" {
		s += "; "
	}
	notes.Store(t.Name(), s+fmt.Sprintf(format, args...))
}

// revive fails the test for every relay that exited although it should
// run, notes why, and starts a replacement with the same flags so the
// scenario can still drain and report its row.
func revive(t *testing.T, rs []*relay) {
	t.Helper()
	for i, r := range rs {
		if !r.exited() {
			continue
		}
		last := strings.TrimSpace(r.tail(300))
		if j := strings.LastIndexByte(last, '\n'); j >= 0 {
			last = last[j+1:]
		}
		t.Errorf("relay %s exited during the fault (%v): %s", r.name, r.waitErr, last)
		addNote(t, "relay %s EXITED (%s), replaced", r.name, last)
		rs[i] = startRelay(t, r.o, r.dbURL, r.name+"-re", "", r.extra...)
	}
}

func (r *relay) tail(n int) string {
	b, err := os.ReadFile(r.errPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

func sinkFile(path string) string { return "file://" + path }

// within polls cond every 20 ms until it holds or timeout passes.
func within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
