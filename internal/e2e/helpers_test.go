// Package e2e runs the wharf binary as a separate process against a real
// PostgreSQL and checks what it delivers, message by message.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
)

var (
	// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
	databaseURL string
	// wharfBin is the wharf binary built once for the run.
	wharfBin string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	binDir, err := os.MkdirTemp("", "wharf-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if err := buildBinary(binDir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}

	return testdb.Run(m, &databaseURL)
}

// buildBinary builds ./cmd/wharf from the module root (two directories up)
// into dir. WHARF_E2E_RACE=1 builds it with the race detector.
func buildBinary(dir string) error {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("module root not found at %s: %w", root, err)
	}
	wharfBin = filepath.Join(dir, "wharf")
	args := []string{"build"}
	if os.Getenv("WHARF_E2E_RACE") != "" {
		args = append(args, "-race")
	}
	args = append(args, "-o", wharfBin, "./cmd/wharf")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build ./cmd/wharf: %w\n%s", err, out)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bundle is one test's own migrated schema.
type bundle struct {
	pool   *pgxpool.Pool
	schema string
	client *wharf.Client
}

// setup creates a random schema with `wharf migrate up` (so every test also
// exercises the CLI's migrate), and drops it at cleanup.
func setup(t *testing.T) *bundle {
	t.Helper()
	schema := "we_" + randHex(5)
	res := runCLI(t, nil, time.Minute, "migrate", "up", "--schema", schema, "--database-url", databaseURL)
	require.Equalf(t, 0, res.code, "wharf migrate up failed:\nstdout: %s\nstderr: %s", res.stdout, res.stderr)

	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, client: client}
}

func (b *bundle) outboxCount(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox").Scan(&n))
	return n
}

// lanesOwnedBy counts the lanes whose lease names relay p (a relay that
// stopped gracefully must have handed all of them back).
func (b *bundle) lanesOwnedBy(t *testing.T, p *relayProc) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".lanes WHERE owner = $1", p.relayID).Scan(&n))
	return n
}

// cliResult is the outcome of one short-lived wharf command.
type cliResult struct {
	stdout, stderr string
	code           int // -1 when killed by a signal (e.g. the timeout)
	elapsed        time.Duration
	timedOut       bool
}

// runCLI runs the binary with args and waits at most timeout. env nil means
// testdb.CleanEnv().
func runCLI(t *testing.T, env []string, timeout time.Duration, args ...string) cliResult {
	t.Helper()
	if env == nil {
		env = testdb.CleanEnv()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, wharfBin, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start), timedOut: ctx.Err() != nil}
	var ee *exec.ExitError
	switch {
	case err == nil:
		res.code = 0
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	default:
		t.Fatalf("running wharf %q: %v", args, err)
	}
	return res
}

// relayProc is a wharf relay running as a child process.
type relayProc struct {
	name       string
	relayID    string
	cmd        *exec.Cmd
	stderrPath string
	started    time.Time
	done       chan struct{}
	waitErr    error
}

// relayArgs are the flags every relay gets so that tests run at test speed.
var relayArgs = []string{"--lease-ttl", "3s", "--rebalance-interval", "200ms", "--poll-interval", "50ms"}

// startRelay starts `wharf relay` in b's schema with extra flags. Its stderr
// goes to a file that is printed when the test fails; stdout goes to
// stdoutPath ("" discards it). The process is killed at cleanup if it is
// still running.
func startRelay(t *testing.T, b *bundle, name, stdoutPath string, extra ...string) *relayProc {
	t.Helper()
	return startRelayAt(t, b, databaseURL, name, stdoutPath, extra...)
}

// startRelayAt is startRelay with the relay connecting to dbURL (a fault
// proxy in front of the database, say).
func startRelayAt(t *testing.T, b *bundle, dbURL, name, stdoutPath string, extra ...string) *relayProc {
	t.Helper()
	dir := t.TempDir()
	relayID := name + "-" + b.schema
	args := []string{"relay", "--schema", b.schema, "--database-url", dbURL, "--relay-id", relayID}
	args = append(args, relayArgs...)
	args = append(args, extra...)
	cmd := exec.Command(wharfBin, args...)
	cmd.Env = testdb.CleanEnv()
	stderrPath := filepath.Join(dir, name+".stderr")
	errf, err := os.Create(stderrPath)
	require.NoError(t, err)
	defer errf.Close()
	cmd.Stderr = errf
	if stdoutPath == "" {
		stdoutPath = os.DevNull
	}
	outf, err := os.OpenFile(stdoutPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer outf.Close()
	cmd.Stdout = outf
	p := &relayProc{name: name, relayID: relayID, cmd: cmd, stderrPath: stderrPath, done: make(chan struct{})}
	require.NoError(t, cmd.Start(), "start relay %s", name)
	p.started = time.Now()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("relay %s (%q) stderr tail:\n%s", name, args, p.stderrTail(6000))
		}
	})
	return p
}

func (p *relayProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitCode returns the exit status once the process has exited; -1 means it
// was killed by a signal.
func (p *relayProc) exitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// waitExit waits up to timeout for the process and reports its exit status.
func (p *relayProc) waitExit(t *testing.T, timeout time.Duration) (code int, ok bool) {
	t.Helper()
	select {
	case <-p.done:
		return p.exitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

// requireExitZero waits up to timeout and requires exit status 0.
func (p *relayProc) requireExitZero(t *testing.T, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	code, ok := p.waitExit(t, timeout)
	require.Truef(t, ok, "relay %s did not exit within %s\nstderr tail:\n%s", p.name, timeout, p.stderrTail(4000))
	require.Equalf(t, 0, code, "relay %s exit status (%v) after %s\nstderr tail:\n%s", p.name, p.waitErr, time.Since(start), p.stderrTail(4000))
}

func (p *relayProc) terminate(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM), "SIGTERM relay %s", p.name)
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (p *relayProc) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill(), "SIGKILL relay %s", p.name)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("relay %s still running 10s after SIGKILL", p.name)
	}
}

func (p *relayProc) stderrTail(n int) string {
	b, err := os.ReadFile(p.stderrPath)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// delivery is one line a JSON-lines sink wrote.
type delivery struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
}

func parseLine(line []byte) (delivery, error) {
	var d delivery
	if err := json.Unmarshal(line, &d); err != nil {
		return d, err
	}
	seq, _, err := wharf.ParseID(d.ID)
	if err != nil || seq != d.Seq || d.Seq <= 0 {
		return d, fmt.Errorf("line has no valid id and seq: %s", line)
	}
	return d, nil
}

// parseJSONL parses a JSON-lines sink's output in file order. Every line
// must parse and end with a newline, except that when killed > 0 writers of
// the file were SIGKILLed: then a last line without a newline is dropped, and
// a line that starts with the torn remains of a killed writer's batch and
// continues with another writer's complete line is salvaged. At most killed
// torn lines are tolerated.
func parseJSONL(data []byte, killed int) ([]delivery, int, error) {
	var out []delivery
	torn := 0
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if killed == 0 {
				return out, torn, fmt.Errorf("last line has no newline: %.200q", data)
			}
			torn++
			break
		}
		line := data[:i]
		data = data[i+1:]
		d, err := parseLine(line)
		if err != nil {
			if killed == 0 {
				return out, torn, fmt.Errorf("line %d: %w: %.300q", len(out)+torn+1, err, line)
			}
			torn++
			j := bytes.LastIndex(line, []byte(`{"id":`))
			if j <= 0 {
				return out, torn, fmt.Errorf("line %d cannot be salvaged: %w: %.300q", len(out)+torn, err, line)
			}
			if d, err = parseLine(line[j:]); err != nil {
				return out, torn, fmt.Errorf("line %d cannot be salvaged: %w: %.300q", len(out)+torn, err, line)
			}
		}
		out = append(out, d)
	}
	if torn > killed {
		return out, torn, fmt.Errorf("%d torn lines, but only %d writers were killed", torn, killed)
	}
	return out, torn, nil
}

// readJSONL reads and parses a whole file (see parseJSONL).
func readJSONL(t *testing.T, path string, killed int) []delivery {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	out, torn, err := parseJSONL(data, killed)
	require.NoErrorf(t, err, "parsing %s", path)
	if torn > 0 {
		t.Logf("%s: %d torn line(s) from a killed writer tolerated", filepath.Base(path), torn)
	}
	return out
}

// tailer reads the complete lines appended to a file since the last poll,
// while writers may still be appending. Lines that do not parse are counted,
// not fatal: the final check re-reads the whole file strictly.
type tailer struct {
	path    string
	off     int64
	partial []byte
	bad     int
}

func (tl *tailer) poll() ([]delivery, error) {
	f, err := os.Open(tl.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(tl.off, 0); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	n, err := buf.ReadFrom(f)
	if err != nil {
		return nil, err
	}
	tl.off += n
	data := append(tl.partial, buf.Bytes()...)
	var out []delivery
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		if d, err := parseLine(data[:i]); err == nil {
			out = append(out, d)
		} else {
			tl.bad++
		}
		data = data[i+1:]
	}
	tl.partial = append([]byte(nil), data...)
	return out, nil
}

// countLines counts the newline-terminated lines in path.
func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte{'\n'})
}

// requireKeyOrder checks per-(topic, key) FIFO over a delivery log that may
// hold redeliveries: each message delivered for the first time must have a
// higher seq than every message of its topic and key delivered before it.
func requireKeyOrder(t *testing.T, what string, ds []delivery) {
	t.Helper()
	seen := make(map[int64]bool, len(ds))
	maxByKey := map[[2]string]int64{}
	for i, d := range ds {
		if d.Key == nil || seen[d.Seq] {
			continue
		}
		seen[d.Seq] = true
		k := [2]string{d.Topic, *d.Key}
		prev := maxByKey[k]
		if d.Seq <= prev {
			require.Failf(t, "per-key order violated", "%s: line %d: topic %q key %q: message %d delivered for the first time after message %d of the same topic and key", what, i+1, d.Topic, *d.Key, d.Seq, prev)
		}
		maxByKey[k] = d.Seq
	}
}

// enqueued records what a test enqueued, by id.
type enqueued struct {
	mu   sync.Mutex
	msgs map[int64]wharf.Message
}

func newEnqueued() *enqueued { return &enqueued{msgs: map[int64]wharf.Message{}} }

func (e *enqueued) add(ids []string, msgs []wharf.Message) error {
	if len(ids) != len(msgs) {
		return fmt.Errorf("Enqueue returned %d ids for %d messages", len(ids), len(msgs))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, id := range ids {
		seq, _, err := wharf.ParseID(id)
		if err != nil {
			return err
		}
		if _, dup := e.msgs[seq]; dup {
			return fmt.Errorf("id %s returned twice by Enqueue", id)
		}
		m := msgs[i]
		m.ID, m.Seq = id, seq
		e.msgs[seq] = m
	}
	return nil
}

func (e *enqueued) snapshot() map[int64]wharf.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[int64]wharf.Message, len(e.msgs))
	for k, v := range e.msgs {
		out[k] = v
	}
	return out
}

// requireMatches checks that d is a faithful rendering of the enqueued m.
func requireMatches(t *testing.T, m wharf.Message, d delivery) {
	t.Helper()
	require.Equalf(t, m.Topic, d.Topic, "message %d topic", d.Seq)
	if m.Key == "" {
		require.Nilf(t, d.Key, "message %d has no key but the line says %v", d.Seq, d.Key)
	} else {
		require.NotNilf(t, d.Key, "message %d key missing", d.Seq)
		require.Equalf(t, m.Key, *d.Key, "message %d key", d.Seq)
	}
	if len(m.Headers) == 0 {
		require.Emptyf(t, d.Headers, "message %d headers", d.Seq)
	} else {
		require.Equalf(t, m.Headers, d.Headers, "message %d headers", d.Seq)
	}
	if json.Valid(m.Payload) && isUTF8JSON(m.Payload) {
		require.Emptyf(t, d.PayloadEncoding, "message %d: JSON payload must be embedded", d.Seq)
		require.JSONEqf(t, string(m.Payload), string(d.Payload), "message %d payload", d.Seq)
		return
	}
	require.Equalf(t, "base64", d.PayloadEncoding, "message %d: non-JSON payload %q must be base64", d.Seq, m.Payload)
	var s string
	require.NoErrorf(t, json.Unmarshal(d.Payload, &s), "message %d: base64 payload is not a JSON string: %s", d.Seq, d.Payload)
	got, err := decodeBase64(s)
	require.NoErrorf(t, err, "message %d: payload is not base64: %q", d.Seq, s)
	require.Equalf(t, m.Payload, got, "message %d payload bytes", d.Seq)
}

func isUTF8JSON(p []byte) bool { return utf8.Valid(p) && json.Valid(p) }

func decodeBase64(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }
