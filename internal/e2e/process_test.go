package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"

	"github.com/wharfhq/wharf/internal/testdb"
)

// payload100 is a 100-byte compact JSON object unique to i.
func payload100(i int) []byte {
	head := fmt.Sprintf(`{"n":%d,"pad":"`, i)
	return []byte(head + strings.Repeat("x", 100-len(head)-2) + `"}`)
}

func enqueueAll(t *testing.T, b *bundle, enq *enqueued, msgs []wharf.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := b.client.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	require.NoError(t, enq.add(ids, msgs))
}

// firstMissing lists up to n enqueued ids not in got, for failure messages.
func firstMissing(sent map[int64]wharf.Message, got func(int64) bool, n int) (missing []int64, count int) {
	for id := range sent {
		if !got(id) {
			count++
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	if len(missing) > n {
		missing = missing[:n]
	}
	return missing, count
}

// A relay SIGKILLed in the middle of a large backlog loses nothing, in
// either layout of the outbox: a new relay takes its lanes (and in WAL mode
// the slot) over after the lease TTL and delivers the rest. The only
// duplicates are messages the dead relay had delivered but not settled: in
// table mode no more than it held unremoved (buffered + one fetch in
// flight); in WAL mode whatever it delivered past the slot's last
// confirmation, sent every 100 ms. A dies here within about 100 ms of its
// first delivery, before its first confirmation, and B delivers all of A's
// 3,000 to 4,400 again (measured; killed 150 ms later, at 23,500 lines, A
// left no duplicate).
func TestKill9MidStreamThenNewRelayFinishes(t *testing.T) {
	t.Parallel()
	for _, wal := range []bool{false, true} {
		name := map[bool]string{false: "table", true: "wal"}[wal]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, url := setup(t), databaseURL
			if wal {
				b, url = setupWAL(t)
			}
			kill9MidStream(t, b, url, wal)
		})
	}
}

func kill9MidStream(t *testing.T, b *bundle, url string, wal bool) {
	dir := t.TempDir()
	const (
		total       = 30000
		batch       = 500
		nkeys       = 200
		fetchBatch  = 500
		maxBuffered = 2000
	)
	enq := newEnqueued()
	for start := 0; start < total; start += batch {
		msgs := make([]wharf.Message, batch)
		for j := range msgs {
			i := start + j
			msgs[j] = wharf.Message{Topic: "orders", Key: fmt.Sprintf("k%03d", i%nkeys), Payload: payload100(i)}
		}
		enqueueAll(t, b, enq, msgs)
	}
	sent := enq.snapshot()
	require.Len(t, sent, total)

	aPath := filepath.Join(dir, "a.jsonl")
	a := startRelayAt(t, b, url, "A", "", "--sink", "file://"+aPath,
		"--fetch-batch", fmt.Sprint(fetchBatch), "--max-buffered", fmt.Sprint(maxBuffered))
	deadline := time.Now().Add(30 * time.Second)
	for countLines(aPath) < 3000 {
		if a.exited() {
			t.Fatalf("relay A exited (%v) before delivering 3000 messages\nstderr:\n%s", a.waitErr, a.stderrTail(4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay A delivered only %d messages in 30s\nstderr:\n%s", countLines(aPath), a.stderrTail(4000))
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.kill9(t)
	atKill := countLines(aPath)

	bPath := filepath.Join(dir, "b.jsonl")
	rb := startRelayAt(t, b, url, "B", "", "--drain", "--sink", "file://"+bPath)
	rb.requireExitZero(t, 60*time.Second)
	drainTime := time.Since(rb.started)

	as := readJSONL(t, aPath, 1) // A was SIGKILLed: its last line may be torn
	bs := readJSONL(t, bPath, 0)

	countA := make(map[int64]int, len(as))
	for _, d := range as {
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "a.jsonl: id %d was never enqueued", d.Seq)
		requireMatches(t, m, d)
		countA[d.Seq]++
		require.Equalf(t, 1, countA[d.Seq], "relay A delivered message %d twice", d.Seq)
	}
	countB := make(map[int64]int, len(bs))
	dups := 0
	for _, d := range bs {
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "b.jsonl: id %d was never enqueued", d.Seq)
		requireMatches(t, m, d)
		countB[d.Seq]++
		require.Equalf(t, 1, countB[d.Seq], "relay B (a clean drain) delivered message %d twice", d.Seq)
		if countA[d.Seq] > 0 {
			dups++
		}
	}
	missing, nMissing := firstMissing(sent, func(id int64) bool { return countA[id]+countB[id] > 0 }, 20)
	require.Zerof(t, nMissing, "%d of %d enqueued messages were never delivered; first: %v", nMissing, total, missing)
	if !wal {
		require.Equal(t, 0, b.outboxCount(t), "outbox must be empty after the drain")
		require.LessOrEqualf(t, dups, maxBuffered+fetchBatch, "%d messages were delivered by both A and B", dups)
	}

	requireKeyOrder(t, "a.jsonl", as)
	requireKeyOrder(t, "b.jsonl", bs)
	// A was dead before B started, so a then b is the real delivery order.
	requireKeyOrder(t, "a.jsonl followed by b.jsonl", append(slices.Clip(as), bs...))
	t.Logf("A: %d lines at SIGKILL, %d parsed; B: %d lines in %s; %d delivered twice", atKill, len(as), len(bs), drainTime.Round(time.Millisecond), dups)
}

// Three relays share one file, so the file is the global delivery order. One
// stops gracefully, one is SIGKILLed, the third takes over; meanwhile a
// producer keeps enqueueing. Every message arrives, per-key order holds over
// the whole file, and the outbox ends empty.
func TestThreeRelaysGracefulStopAndKillKeepKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := filepath.Join(t.TempDir(), "shared.jsonl")
	sink := "file://" + path

	enq := newEnqueued()
	stop := make(chan struct{})
	prodDone := make(chan struct{})
	var prodErr error
	go func() {
		defer close(prodDone)
		const nkeys = 100
		seq := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			msgs := make([]wharf.Message, 50)
			for j := range msgs {
				msgs[j] = wharf.Message{Topic: "events", Key: fmt.Sprintf("key-%02d", seq%nkeys), Payload: fmt.Appendf(nil, `{"seq":%d}`, seq)}
				seq++
			}
			// Not cancelled by stop: an enqueue either commits and is
			// recorded, or fails the test; none is left in doubt.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			ids, err := b.client.Enqueue(ctx, msgs...)
			cancel()
			if err == nil {
				err = enq.add(ids, msgs)
			}
			if err != nil {
				prodErr = err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopProducer := sync.OnceFunc(func() { close(stop); <-prodDone })
	t.Cleanup(stopProducer)

	r1 := startRelay(t, b, "r1", "", "--sink", sink)
	r2 := startRelay(t, b, "r2", "", "--sink", sink)
	r3 := startRelay(t, b, "r3", "", "--sink", sink)
	requireRunning := func(rs ...*relayProc) {
		t.Helper()
		for _, r := range rs {
			if r.exited() {
				t.Fatalf("relay %s exited unexpectedly (%v)\nstderr:\n%s", r.name, r.waitErr, r.stderrTail(4000))
			}
		}
	}

	require.Eventually(t, func() bool {
		requireRunning(r1, r2, r3)
		return b.lanesOwnedBy(t, r1) > 0 && b.lanesOwnedBy(t, r2) > 0 && b.lanesOwnedBy(t, r3) > 0
	}, time.Minute, 50*time.Millisecond, "each of 3 relays should come to hold some of the 64 lanes")
	r1.terminate(t)
	r1.requireExitZero(t, 15*time.Second)
	require.Zero(t, b.lanesOwnedBy(t, r1), "r1 stopped gracefully: it must have handed its lanes back")

	time.Sleep(2 * time.Second)
	requireRunning(r2, r3)
	r2.kill9(t)

	time.Sleep(5 * time.Second) // r3 takes r2's lanes over once their 3s leases expire
	requireRunning(r3)
	stopProducer()
	require.NoError(t, prodErr, "producer")
	sent := enq.snapshot()
	require.NotEmpty(t, sent)

	remaining := make(map[int64]bool, len(sent))
	for id := range sent {
		remaining[id] = true
	}
	tl := &tailer{path: path}
	deadline := time.Now().Add(2 * time.Minute)
	for len(remaining) > 0 {
		ds, err := tl.poll()
		require.NoError(t, err)
		for _, d := range ds {
			delete(remaining, d.Seq)
		}
		if len(remaining) == 0 {
			break
		}
		requireRunning(r3)
		if time.Now().After(deadline) {
			missing, n := firstMissing(sent, func(id int64) bool { return !remaining[id] }, 20)
			t.Fatalf("after 2 minutes, %d of %d enqueued messages are still not in the file; first: %v", n, len(sent), missing)
		}
		time.Sleep(100 * time.Millisecond)
	}

	require.Eventually(t, func() bool { return b.lanesOwnedBy(t, r3) == 64 }, time.Minute, 50*time.Millisecond,
		"r3, the only live relay, must have taken over every lane")

	st := runCLI(t, nil, 30*time.Second, "status", "--schema", b.schema, "--database-url", databaseURL)
	require.Equalf(t, 0, st.code, "wharf status failed\nstdout: %s\nstderr: %s", st.stdout, st.stderr)
	require.Contains(t, st.stdout, "lanes", "wharf status output")

	r3.terminate(t)
	r3.requireExitZero(t, 15*time.Second)
	require.Zero(t, b.lanesOwnedBy(t, r3), "r3 stopped gracefully: it must have handed its lanes back")
	require.Equal(t, 0, b.outboxCount(t), "outbox must be empty once the last relay stopped gracefully after delivering everything")

	ds := readJSONL(t, path, 1) // r2 was SIGKILLed
	delivered := make(map[int64]int, len(sent))
	for _, d := range ds {
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "shared.jsonl: id %d was never enqueued", d.Seq)
		requireMatches(t, m, d)
		delivered[d.Seq]++
	}
	missing, nMissing := firstMissing(sent, func(id int64) bool { return delivered[id] > 0 }, 20)
	require.Zerof(t, nMissing, "%d of %d messages never delivered; first: %v", nMissing, len(sent), missing)
	requireKeyOrder(t, "shared.jsonl", ds)
	t.Logf("%d messages enqueued, %d lines (%d redeliveries); status output:\n%s", len(sent), len(ds), len(ds)-len(delivered), st.stdout)
}

// A clean drain to stdout writes exactly one faithful JSON line per message
// on stdout, and nothing else there.
func TestRelayDrainToStdout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 500
	msgs := make([]wharf.Message, n)
	for i := range msgs {
		m := wharf.Message{Topic: "orders"}
		if i%2 == 1 {
			m.Topic = "users"
		}
		if i%7 != 0 { // every 7th message has no key
			m.Key = fmt.Sprintf("user-%d", i%13)
		}
		switch i % 10 {
		case 0: // binary, invalid UTF-8
			m.Payload = []byte{0xff, 0x00, 0xfe, byte(i), byte(i >> 8), '\n', '"', 0x80}
		case 1:
			m.Payload = []byte{} // empty: not JSON
		case 2:
			m.Payload = []byte(`"a JSON string with \"quotes\", \\ and ünïcödé"`)
		case 3:
			m.Payload = fmt.Appendf(nil, "%d", i)
		case 4: // multi-line JSON must still be one line
			m.Payload = fmt.Appendf(nil, "{\n  \"pretty\": [1, 2, %d],\n  \"s\": \"x y\"\n}\n", i)
		case 5:
			m.Payload = fmt.Appendf(nil, "plain text %d, not JSON", i)
		case 6: // valid JSON syntax but invalid UTF-8 inside a string
			m.Payload = []byte("\"bad \xff utf8\"")
		default:
			m.Payload = fmt.Appendf(nil, `{"i":%d,"name":"n%d","nested":{"ok":true,"list":[null,1.5e3]}}`, i, i)
		}
		switch i % 3 {
		case 0:
			m.Headers = map[string]string{"trace-id": fmt.Sprintf("t-%d", i), "weird": "quote\" back\\slash\nnewline\ttab üñí \u2028"}
		case 1:
			m.Headers = map[string]string{"h": "v"}
		}
		msgs[i] = m
	}
	enq := newEnqueued()
	for start := 0; start < n; start += 100 {
		enqueueAll(t, b, enq, msgs[start:start+100])
	}
	sent := enq.snapshot()

	args := append([]string{"relay", "--drain", "--sink", "stdout:", "--schema", b.schema, "--database-url", databaseURL}, relayArgs...)
	res := runCLI(t, nil, 60*time.Second, args...)
	require.Falsef(t, res.timedOut, "relay --drain did not exit within 60s\nstderr:\n%s", res.stderr)
	require.Equalf(t, 0, res.code, "relay --drain exit status\nstderr:\n%s", res.stderr)

	require.Truef(t, strings.HasSuffix(res.stdout, "\n"), "stdout must end with a newline; tail: %q", tail(res.stdout, 200))
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	require.Lenf(t, lines, n, "stdout must hold exactly one line per message (no redelivery in a clean run)")
	ds := make([]delivery, 0, n)
	seen := map[int64]bool{}
	for i, line := range lines {
		d, err := parseLine([]byte(line))
		require.NoErrorf(t, err, "stdout line %d is not a message line: %q", i+1, line)
		m, ok := sent[d.Seq]
		require.Truef(t, ok, "stdout line %d: id %d was never enqueued", i+1, d.Seq)
		require.Falsef(t, seen[d.Seq], "message %d delivered twice", d.Seq)
		seen[d.Seq] = true
		requireMatches(t, m, d)
		ds = append(ds, d)
	}
	require.Len(t, seen, n)
	requireKeyOrder(t, "stdout", ds)
	require.NotContains(t, res.stderr, `"payload":`, "message lines must go to stdout only")
	require.Equal(t, 0, b.outboxCount(t))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Every kind of bad input ends with one line on stderr that starts with
// "wharf: " and says what is wrong, a non-zero exit status, and no message
// lost.
func TestBadInputFailsWithOneLineError(t *testing.T) {
	t.Parallel()
	withMsgs := setup(t) // holds 3 messages that a failed relay must not touch
	empty := setup(t)
	enqueueAll(t, withMsgs, newEnqueued(), []wharf.Message{
		{Topic: "orders", Key: "a", Payload: []byte(`{"n":1}`)},
		{Topic: "orders", Key: "a", Payload: []byte(`{"n":2}`)},
		{Topic: "orders", Payload: []byte(`{"n":3}`)},
	})
	require.Equal(t, 3, withMsgs.outboxCount(t))

	cfgPath := filepath.Join(t.TempDir(), "f.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte("sinkk: \"stdout:\"\n"), 0o644))

	db := []string{"--database-url", databaseURL}
	withEnv := func(kv ...string) []string { return append(testdb.CleanEnv(), kv...) }
	type tc struct {
		name        string
		env         []string // nil: testdb.CleanEnv()
		args        []string
		want        []string
		notWant     []string
		maxElapsed  time.Duration
		keepsOutbox bool // must leave withMsgs' 3 messages in place
	}
	cases := []tc{
		{name: "unknown sink", args: append([]string{"relay", "--sink", "kafak://x", "--schema", withMsgs.schema}, db...),
			want: []string{`unknown sink scheme "kafak"`}, keepsOutbox: true},
		{name: "malformed sink URL", args: append([]string{"relay", "--sink", "file://%zz", "--schema", withMsgs.schema}, db...),
			want: []string{"malformed"}, keepsOutbox: true},
		{name: "bad schema name", args: append([]string{"relay", "--schema", "Bad-Name", "--sink", "stdout:"}, db...),
			want: []string{`invalid schema name "Bad-Name"`}},
		{name: "missing schema", args: append([]string{"relay", "--schema", "we_missing_" + randHex(5), "--sink", "stdout:"}, db...),
			want: []string{"wharf migrate up"}},
		{name: "unreachable database", args: []string{"--database-url", "postgres://postgres@127.0.0.1:1/nope", "relay", "--sink", "stdout:", "--schema", empty.schema},
			want: []string{"127.0.0.1:1"}, maxElapsed: 15 * time.Second},
		{name: "unreachable database does not echo the password", args: []string{"--database-url", "postgres://postgres:s3cr3tpw@127.0.0.1:1/nope", "relay", "--sink", "stdout:", "--schema", empty.schema},
			want: []string{"127.0.0.1:1"}, notWant: []string{"s3cr3tpw"}, maxElapsed: 15 * time.Second},
		{name: "malformed database URL", args: []string{"--database-url", "postgres://%zz", "relay", "--sink", "stdout:"},
			want: []string{"--database-url is malformed"}},
		{name: "database URL scheme typo", args: []string{"--database-url", "postgress://postgres@127.0.0.1/x", "relay", "--sink", "stdout:"},
			want: []string{`unknown scheme "postgress"`, "postgres://"}, notWant: []string{"xxxxx", "keyword/value"}},
		{name: "no database URL", args: []string{"relay", "--sink", "stdout:"},
			want: []string{"database URL"}, maxElapsed: 15 * time.Second},
		{name: "WHARF_DATABASE_URL is used", env: withEnv("WHARF_DATABASE_URL=postgres://postgres@127.0.0.1:2/nope"),
			args: []string{"relay", "--sink", "stdout:", "--schema", empty.schema},
			want: []string{"127.0.0.1:2"}, maxElapsed: 15 * time.Second},
		{name: "DATABASE_URL is used", env: withEnv("DATABASE_URL=postgres://postgres@127.0.0.1:3/nope"),
			args: []string{"relay", "--sink", "stdout:", "--schema", empty.schema},
			want: []string{"127.0.0.1:3"}, maxElapsed: 15 * time.Second},
		{name: "WHARF_DATABASE_URL wins over DATABASE_URL", env: withEnv("WHARF_DATABASE_URL=postgres://postgres@127.0.0.1:4/nope", "DATABASE_URL=postgres://postgres@127.0.0.1:5/nope"),
			args: []string{"relay", "--sink", "stdout:", "--schema", empty.schema},
			want: []string{"127.0.0.1:4"}, notWant: []string{"127.0.0.1:5"}, maxElapsed: 15 * time.Second},
		{name: "config with unknown field", args: append([]string{"--config", cfgPath, "relay", "--schema", empty.schema}, db...),
			want: []string{"sinkk"}},
		{name: "bad duration", args: append([]string{"relay", "--sink", "stdout:", "--lease-ttl", "banana", "--schema", empty.schema}, db...),
			want: []string{"lease-ttl"}},
		{name: "dead retry without selector", args: append([]string{"dead", "retry", "--schema", empty.schema}, db...),
			want: []string{"--all"}},
		// Beyond the brief's list: a relay setting the library rejects is
		// still one "wharf: " line, not prefixed twice.
		{name: "fetch batch below the lane count", args: append([]string{"relay", "--sink", "stdout:", "--fetch-batch", "10", "--schema", empty.schema}, db...),
			want: []string{"64"}},
		{name: "unknown flag", args: append([]string{"relay", "--sink", "stdout:", "--bogus", "--schema", empty.schema}, db...),
			want: []string{"--bogus"}},
	}
	t.Run("cases", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				res := runCLI(t, c.env, 30*time.Second, c.args...)
				require.Falsef(t, res.timedOut, "wharf %q hung for 30s\nstderr: %s", c.args, res.stderr)
				require.NotEqualf(t, 0, res.code, "wharf %q must fail\nstdout: %s\nstderr: %s", c.args, res.stdout, res.stderr)
				msg := strings.TrimSpace(res.stderr)
				require.NotContainsf(t, msg, "\n", "wharf %q: stderr must be exactly one line, got:\n%s", c.args, res.stderr)
				require.Truef(t, strings.HasPrefix(msg, "wharf: "), "wharf %q: stderr must start with \"wharf: \", got: %q", c.args, msg)
				require.Falsef(t, strings.HasPrefix(msg, "wharf: wharf:"), "wharf %q: the \"wharf: \" prefix is doubled: %q", c.args, msg)
				for _, w := range c.want {
					require.Containsf(t, msg, w, "wharf %q: error line", c.args)
				}
				for _, w := range c.notWant {
					require.NotContainsf(t, msg, w, "wharf %q: error line", c.args)
				}
				if c.maxElapsed > 0 {
					require.LessOrEqualf(t, res.elapsed, c.maxElapsed, "wharf %q took %s to fail", c.args, res.elapsed)
				}
				if c.keepsOutbox {
					require.Equal(t, 3, withMsgs.outboxCount(t), "a relay that failed to start must leave committed messages in the outbox")
				}
			})
		}
	})
	require.Equal(t, 3, withMsgs.outboxCount(t))
}

// Smoke test of the other commands: version, and migrate status/print/up
// (again: idempotent) on a migrated schema; and SIGINT stops a relay with 0.
func TestCLISmoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := runCLI(t, nil, 30*time.Second, "version")
	require.Equalf(t, 0, res.code, "wharf version\nstderr: %s", res.stderr)
	require.NotEmpty(t, strings.TrimSpace(res.stdout), "wharf version prints the version")

	for _, args := range [][]string{{"migrate", "status"}, {"migrate", "print"}, {"migrate", "up"}} {
		res := runCLI(t, nil, 30*time.Second, append(args, "--schema", b.schema, "--database-url", databaseURL)...)
		require.Equalf(t, 0, res.code, "wharf %q\nstdout: %s\nstderr: %s", args, res.stdout, res.stderr)
		if args[1] == "print" {
			require.Contains(t, res.stdout, "outbox", "wharf migrate print prints the migration SQL")
		}
	}

	// SIGINT stops an idle relay gracefully, like SIGTERM.
	r := startRelay(t, b, "int", "", "--sink", "stdout:")
	deadline := time.Now().Add(15 * time.Second)
	for b.lanesOwnedBy(t, r) < 64 {
		require.False(t, r.exited(), "relay exited before SIGINT:\n%s", r.stderrTail(4000))
		require.True(t, time.Now().Before(deadline), "a lone relay did not take all 64 lanes within 15s")
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, r.cmd.Process.Signal(os.Interrupt))
	r.requireExitZero(t, 15*time.Second)
	require.Zero(t, b.lanesOwnedBy(t, r), "a relay stopped with SIGINT must hand its lanes back")
}

// The JSON-lines reader itself: torn lines are tolerated only from killed
// writers, and a torn line followed by another writer's line is salvaged.
func TestParseJSONLTornLines(t *testing.T) {
	t.Parallel()
	good := `{"id":"00000000-0000-8001-8000-000000000001","seq":1,"topic":"t","key":"a","headers":{},"payload":{}}` + "\n" +
		`{"id":"00000000-0000-8002-8000-000000000001","seq":2,"topic":"t","key":null,"headers":{"h":"v"},"payload":"AA==","payload_encoding":"base64"}` + "\n"
	ds, torn, err := parseJSONL([]byte(good), 0)
	require.NoError(t, err)
	require.Zero(t, torn)
	require.Len(t, ds, 2)
	require.Equal(t, "a", *ds[0].Key)
	require.Nil(t, ds[1].Key)

	tornEnd := good + `{"id":"00000000-0000-8003-8000-000000000001","seq":3,"topic":"t","ke`
	_, _, err = parseJSONL([]byte(tornEnd), 0)
	require.Error(t, err, "a torn last line without a killed writer is an error")
	ds, torn, err = parseJSONL([]byte(tornEnd), 1)
	require.NoError(t, err)
	require.Equal(t, 1, torn)
	require.Len(t, ds, 2)

	tornMiddle := `{"id":"00000000-0000-8003-8000-000000000001","seq":3,"topic":"t","ke` + `{"id":"00000000-0000-8004-8000-000000000001","seq":4,"topic":"t","key":"b","headers":{},"payload":1}` + "\n" + good
	_, _, err = parseJSONL([]byte(tornMiddle), 0)
	require.Error(t, err)
	ds, torn, err = parseJSONL([]byte(tornMiddle), 1)
	require.NoError(t, err)
	require.Equal(t, 1, torn)
	require.Equal(t, []int64{4, 1, 2}, []int64{ds[0].Seq, ds[1].Seq, ds[2].Seq})

	_, _, err = parseJSONL([]byte(tornMiddle+`{"id":"00000000-0000-8009-8000-000000000001","seq":9`), 1)
	require.Error(t, err, "two torn lines but only one killed writer")
}

// With default settings (10 s lease, 1 s rebalance interval) a relay takes
// over a kill -9ed relay's lanes within 15 s.
func TestDefaultTakeoverWithin15s(t *testing.T) {
	t.Parallel()
	b := setup(t)
	common := []string{"relay", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn"}
	start := func(id, out string) *exec.Cmd {
		cmd := exec.Command(wharfBin, append(common, "--relay-id", id, "--sink", "file://"+out)...)
		cmd.Env = testdb.CleanEnv()
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	owned := func(id string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".lanes WHERE owner = $1", id).Scan(&n))
		return n
	}
	dir := t.TempDir()
	a := start("takeover-a", filepath.Join(dir, "a.jsonl"))
	require.Eventually(t, func() bool { return owned("takeover-a") == 64 }, time.Minute, 50*time.Millisecond)
	require.NoError(t, a.Process.Kill())
	_ = a.Wait()
	killed := time.Now()
	ids, err := b.client.Enqueue(context.Background(), wharf.Message{Topic: "t", Key: "k", Payload: []byte(`2`)})
	require.NoError(t, err)

	bOut := filepath.Join(dir, "b.jsonl")
	start("takeover-b", bOut)
	require.Eventually(t, func() bool { return owned("takeover-b") == 64 }, 15*time.Second, 100*time.Millisecond,
		"the surviving relay must own every lane within 15 s of the kill")
	t.Logf("takeover after %s", time.Since(killed).Round(100*time.Millisecond))
	require.Eventually(t, func() bool { return b.outboxCount(t) == 0 }, time.Minute, 50*time.Millisecond)
	ds := readJSONL(t, bOut, 0)
	require.Len(t, ds, 1)
	require.Equal(t, ids[0], ds[0].ID, "the message enqueued after the kill is delivered by the survivor")
}
