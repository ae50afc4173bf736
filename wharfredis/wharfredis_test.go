package wharfredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// go-redis stops every goroutine it starts when its client closes; a pool
// whose dials kept failing probes the server in the background and notices
// the close only when its 1s sleep ends, which leakcheck waits for.
func TestMain(m *testing.M) {
	testtool.ExamplesNeed("redis-server", "127.0.0.1:6379", startHint, "ExampleNew")
	leakcheck.Main(m)
}

const (
	defaultURL      = "redis://127.0.0.1:6379"
	startHint       = "start it with: redis-server --daemonize yes (or set WHARF_TEST_REDIS_URL)"
	testTimeout     = 3 * time.Second
	adminTimeout    = 10 * time.Second
	serverStartWait = 10 * time.Second
	// benchMaxLen bounds the benchmark streams, so that a long benchmark
	// does not fill the shared server's memory.
	benchMaxLen = 100_000
)

// sharedURL is the Redis the tests use: WHARF_TEST_REDIS_URL or the local
// default.
func sharedURL() string {
	if u := os.Getenv("WHARF_TEST_REDIS_URL"); u != "" {
		return u
	}
	return defaultURL
}

// requireRedis connects to rawURL or, when nothing answers, fails the test
// under CI=true and skips it otherwise. The client is closed at cleanup.
func requireRedis(t testing.TB, rawURL string) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		t.Fatalf("test Redis URL: %v", err)
	}
	c := redis.NewClient(o)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = c.Ping(ctx).Err()
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	_ = c.Close()
	shown := rawURL
	if u, perr := url.Parse(rawURL); perr == nil {
		shown = u.Redacted()
	}
	testtool.Missing(t, "redis-server", fmt.Sprintf("no Redis at %s (%v): %s", shown, err, startHint))
	return nil
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// world is one test's destination: streams under a prefix of its own.
type world struct {
	admin  *redis.Client
	prefix string
	server *privateServer // for the broker-outage case only
}

func (w *world) stream(topic string) string { return w.prefix + "." + topic }

// newWorld picks a unique stream prefix on serverURL, deletes its streams at
// cleanup, and opens a sink on it through Open, as the CLI does, with query
// appended to the URL.
func newWorld(t testing.TB, serverURL, query string) (*world, *Sink) {
	t.Helper()
	admin := requireRedis(t, serverURL)
	w := &world{admin: admin, prefix: "wharftest:" + randomID()}
	t.Cleanup(func() { w.deleteStreams(t) })
	raw := serverURL + "?stream_template=" + url.QueryEscape(w.prefix+"."+TopicPlaceholder) + "&timeout=" + testTimeout.String()
	if query != "" {
		raw += "&" + query
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	s, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return w, s.(*Sink)
}

func (w *world) deleteStreams(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	keys, err := w.admin.Keys(ctx, w.prefix+".*").Result()
	if err == nil && len(keys) > 0 {
		err = w.admin.Del(ctx, keys...).Err()
	}
	if err != nil {
		t.Logf("delete streams %s.*: %v", w.prefix, err)
	}
}

// read returns every entry of the topic's stream, decoded, in stream order.
func (w *world) read(ctx context.Context, topic string) ([]wharfsinktest.Received, error) {
	entries, err := w.admin.XRange(ctx, w.stream(topic), "-", "+").Result()
	if err != nil {
		return nil, err
	}
	out := make([]wharfsinktest.Received, 0, len(entries))
	for _, e := range entries {
		r, err := decode(e)
		if err != nil {
			return nil, fmt.Errorf("stream %s entry %s: %w", w.stream(topic), e.ID, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// decode turns a stream entry back into the message it carries.
func decode(e redis.XMessage) (wharfsinktest.Received, error) {
	var r wharfsinktest.Received
	for f, v := range e.Values {
		s, ok := v.(string)
		if !ok {
			return r, fmt.Errorf("field %q holds a %T", f, v)
		}
		switch f {
		case FieldID:
			r.ID = s
		case FieldTopic:
			r.Topic = s
		case FieldKey:
			r.Key = s
		case FieldPayload:
			r.Payload = []byte(s)
		default:
			name, ok := strings.CutPrefix(f, HeaderPrefix)
			if !ok {
				return r, fmt.Errorf("unexpected field %q", f)
			}
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers[name] = s
		}
	}
	if r.ID == "" || r.Topic == "" {
		return r, errors.New("no id or topic field")
	}
	return r, nil
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	w, s := newWorld(t, sharedURL(), "")
	h.worlds.Set(t, w)
	return s
}

// newBreakableSink runs a private redis-server for the test, so that
// breaking it leaves the shared one alone. Its append-only file is fsynced on
// every write, so what was acknowledged before a break is still there after
// the restart.
func (h *harness) newBreakableSink(t *testing.T) wharf.Sink {
	srv := startPrivateServer(t)
	w, s := newWorld(t, srv.url(), "")
	w.server = srv
	h.worlds.Set(t, w)
	return s
}

// consume reads the test's streams with XRANGE: a stream's order is the
// order Redis applied the XADDs in.
func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	t.Helper()
	w := h.worlds.Get(t)
	deadline := time.Now().Add(timeout)
	for {
		var got []wharfsinktest.Received
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		for _, tp := range topics {
			rs, err := w.read(ctx, tp)
			if err != nil {
				cancel()
				t.Fatalf("consume: %v", err)
			}
			for _, r := range rs {
				if r.Topic != tp {
					cancel()
					t.Fatalf("consume: stream %s holds id %s with topic %q", w.stream(tp), r.ID, r.Topic)
				}
			}
			got = append(got, rs...)
		}
		cancel()
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	requireRedis(t, sharedURL())
	h := &harness{}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          h.newSink,
		NewBreakableSink: h.newBreakableSink,
		Consume:          h.consume,
		BreakBroker:      func(t *testing.T) { h.worlds.Get(t).server.stop(t) },
		HealBroker:       func(t *testing.T) { h.worlds.Get(t).server.start(t) },
		Features: wharfsinktest.Features{
			// Redis takes bulk strings up to proto-max-bulk-len (512 MB by
			// default): the suite's 1 MiB payload goes through and there
			// is no limit to check. TestPreSendFailuresArePermanent checks
			// the sink's own max_payload.
			MaxPayload:      0,
			SupportsHeaders: true,
		},
	})
}

// privateServer is a redis-server of one test, restartable on the same port
// and data directory.
type privateServer struct {
	bin    string
	port   int
	dir    string
	extra  []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func startPrivateServer(t *testing.T, extra ...string) *privateServer {
	t.Helper()
	bin := testtool.Path(t, "redis-server", "the Redis-outage cases run a private server: apt-get install redis-server")
	s := &privateServer{bin: bin, dir: t.TempDir(), extra: extra}
	t.Cleanup(func() { s.stop(t) })
	// Another test may take the free port between the probe and the
	// server's bind: then try another one.
	for try := 1; ; try++ {
		s.port = freePort(t)
		err := s.tryStart()
		if err == nil {
			return s
		}
		if try == 5 {
			t.Fatal(err)
		}
		t.Logf("private redis-server: %v; trying another port", err)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}

func (s *privateServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *privateServer) url() string { return "redis://" + s.addr() }

// start restarts the server on its port after stop.
func (s *privateServer) start(t *testing.T) {
	t.Helper()
	if err := s.tryStart(); err != nil {
		t.Fatal(err)
	}
}

func (s *privateServer) tryStart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--dir", s.dir, "--daemonize", "no", "--logfile", "",
	}
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	// Ready when this process answers PING, which is after it loaded its
	// append-only file (and not some other test's server on the port).
	o := &redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: time.Second, Protocol: 2, DisableIdentity: true}
	for i, a := range s.extra {
		if a == "--requirepass" && i+1 < len(s.extra) {
			o.Password = s.extra[i+1]
		}
	}
	c := redis.NewClient(o)
	defer c.Close()
	wantPID := "process_id:" + strconv.Itoa(cmd.Process.Pid) + "\r\n"
	deadline := time.Now().Add(serverStartWait)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited at start (port taken?)", s.port)
		default:
		}
		// INFO answers while the server still loads its data, PING after.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		if err == nil {
			err = c.Ping(ctx).Err()
		}
		cancel()
		if info != "" && !strings.Contains(info, wantPID) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("another redis-server answers on port %d", s.port)
		}
		if err == nil {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not get ready: %w", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server (SIGKILL, as a crash would).
func (s *privateServer) stop(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
}

func publish(t *testing.T, s wharf.Sink, msgs []*wharf.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

func requireAcked(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d failed: %v", i, err)
		}
	}
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func ids(rs []wharfsinktest.Received) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// The entry's fields are id, topic, key (absent without a key), payload and
// the headers with the h: prefix in name order, exactly.
func TestEntryLayout(t *testing.T) {
	t.Parallel()
	w, s := newWorld(t, sharedURL(), "")
	requireAcked(t, publish(t, s, []*wharf.Message{
		{ID: wharf.FormatID(int64(7), 1), Seq: int64(7), Topic: "t", Key: "k", Payload: []byte(`{"a":1}`), Headers: map[string]string{"b": "2", "a": "1"}},
		{ID: wharf.FormatID(int64(8), 1), Seq: int64(8), Topic: "t", Payload: []byte{0, 1, 2, 255}},
	}))
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	raw, err := w.admin.Do(ctx, "XRANGE", w.stream("t"), "-", "+").Slice()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"id", wharf.FormatID(7, 1), "topic", "t", "key", "k", "payload", `{"a":1}`, "h:a", "1", "h:b", "2"},
		{"id", wharf.FormatID(8, 1), "topic", "t", "payload", "\x00\x01\x02\xff"},
	}
	if len(raw) != len(want) {
		t.Fatalf("stream holds %d entries, want %d", len(raw), len(want))
	}
	for i, e := range raw {
		fields := fmt.Sprint(e.([]any)[1])
		if fields != fmt.Sprint(want[i]) {
			t.Errorf("entry %d: fields %s, want %s", i, fields, want[i])
		}
	}
}

// A stream key that holds a string fails with a retryable error naming the
// problem; the other streams of the batch are written; once the key is
// deleted the same messages go out in order.
func TestWrongTypeIsRetryable(t *testing.T) {
	t.Parallel()
	w, s := newWorld(t, sharedURL(), "")
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := w.admin.Set(ctx, w.stream("taken"), "not a stream", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "taken", Key: "a", Payload: []byte("1")},
		{ID: wharf.FormatID(int64(2), 1), Seq: int64(2), Topic: "free", Key: "b", Payload: []byte("2")},
		{ID: wharf.FormatID(int64(3), 1), Seq: int64(3), Topic: "taken", Key: "a", Payload: []byte("3")},
	}
	errs := publish(t, s, msgs)
	if len(errs) != 3 || errs[1] != nil {
		t.Fatalf("results %v: want errors for the messages to the string key only", errs)
	}
	for _, i := range []int{0, 2} {
		err := errs[i]
		if err == nil || wharf.IsPermanent(err) || errors.Is(err, wharf.ErrNotAttempted) {
			t.Fatalf("message %s: %v: want a retryable error", msgs[i].ID, err)
		}
		if !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), "not a stream") {
			t.Errorf("message %s: %v: want the error to say WRONGTYPE and what to do", msgs[i].ID, err)
		}
	}
	if err := w.admin.Del(ctx, w.stream("taken")).Err(); err != nil {
		t.Fatal(err)
	}
	requireAcked(t, publish(t, s, []*wharf.Message{msgs[0], msgs[2]}))
	got, err := w.read(ctx, "taken")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint([]string{msgs[0].ID, msgs[2].ID}); fmt.Sprint(ids(got)) != want {
		t.Fatalf("stream holds ids %v, want %s", ids(got), want)
	}
}

// maxlen trims every stream to about that many entries (MAXLEN ~): never
// fewer, at most a few listpack nodes more.
func TestMaxLenTrims(t *testing.T) {
	t.Parallel()
	const maxLen = 100
	w, s := newWorld(t, sharedURL(), "maxlen="+strconv.Itoa(maxLen))
	var last *wharf.Message
	for b := range 10 {
		msgs := make([]*wharf.Message, 500)
		for i := range msgs {
			last = &wharf.Message{ID: wharf.FormatID(int64(b*500+i+1), 1), Seq: int64(b*500 + i + 1), Topic: "t", Key: "k", Payload: []byte("0123456789")}
			msgs[i] = last
		}
		requireAcked(t, publish(t, s, msgs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	n, err := w.admin.XLen(ctx, w.stream("t")).Result()
	if err != nil {
		t.Fatal(err)
	}
	// stream-node-max-entries is 100 by default: ~ trims whole nodes only.
	if n < maxLen || n > maxLen+300 {
		t.Fatalf("the stream holds %d entries after 5000 XADDs with maxlen=%d: want about %d", n, maxLen, maxLen)
	}
	newest, err := w.admin.XRevRangeN(ctx, w.stream("t"), "+", "-", 1).Result()
	if err != nil || len(newest) != 1 || newest[0].Values[FieldID] != last.ID {
		t.Fatalf("newest entry %v (%v): want id %s", newest, err, last.ID)
	}
	t.Logf("maxlen=%d: %d entries after 5000 XADDs", maxLen, n)
}

// Messages that cannot be sent fail permanently before sending, the later
// messages of their ordering key (topic and key) are not attempted, and the
// rest of the batch goes out. New with a caller's client leaves it open on Close.
func TestPreSendFailuresArePermanent(t *testing.T) {
	t.Parallel()
	admin := requireRedis(t, sharedURL())
	prefix := "wharftest:" + randomID() + "."
	s, err := New(admin, Options{StreamTemplate: "{{topic}}", MaxPayload: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		_ = admin.Del(ctx, prefix+"ok").Err()
	})
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "", Key: "a", Payload: []byte("empty stream name")},
		{ID: wharf.FormatID(int64(2), 1), Seq: int64(2), Topic: "", Key: "a", Payload: []byte("behind it")},
		{ID: wharf.FormatID(int64(3), 1), Seq: int64(3), Topic: prefix + "ok", Key: "b", Payload: make([]byte, 1025)},
		{ID: wharf.FormatID(int64(4), 1), Seq: int64(4), Topic: prefix + "ok", Key: "b", Payload: []byte("behind the big one")},
		{ID: wharf.FormatID(int64(5), 1), Seq: int64(5), Topic: prefix + "ok", Key: "c", Headers: map[string]string{"h": strings.Repeat("x", 2000)}},
		{ID: wharf.FormatID(int64(6), 1), Seq: int64(6), Topic: prefix + "ok", Key: "d", Payload: []byte("fine")},
		{ID: wharf.FormatID(int64(7), 1), Seq: int64(7), Topic: prefix + "ok", Payload: make([]byte, 1024)},
	}
	errs := publish(t, s, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("results %v: want one per message", errs)
	}
	for i, want := range []string{"permanent", "not attempted", "permanent", "not attempted", "permanent", "ok", "ok"} {
		err := errs[i]
		var ok bool
		switch want {
		case "permanent":
			ok = wharf.IsPermanent(err)
		case "not attempted":
			ok = errors.Is(err, wharf.ErrNotAttempted)
		case "ok":
			ok = err == nil
		}
		if !ok {
			t.Errorf("message %s: %v, want %s", msgs[i].ID, err, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}
	n, err := admin.XLen(ctx, prefix+"ok").Result()
	if err != nil || n != 2 {
		t.Fatalf("the stream holds %d entries (%v), want the 2 sendable messages", n, err)
	}
}

// Concurrent Publish calls, as the relay makes them, keep every key's order.
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	w, s := newWorld(t, sharedURL(), "")
	const workers, batches, size = 4, 10, 100
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for b := range batches {
				msgs := make([]*wharf.Message, size)
				for i := range msgs {
					id := int64((b*size+i)*workers + g + 1)
					msgs[i] = &wharf.Message{ID: wharf.FormatID(id, 1), Seq: id, Topic: "t", Key: fmt.Sprintf("g%d-k%d", g, i%5), Payload: []byte("x")}
				}
				ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
				errs := s.Publish(ctx, msgs)
				cancel()
				for _, err := range errs {
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	got, err := w.read(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != workers*batches*size {
		t.Fatalf("the stream holds %d entries, want %d", len(got), workers*batches*size)
	}
	last := map[string]int64{}
	for _, r := range got {
		seq, _, err := wharf.ParseID(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if seq <= last[r.Key] {
			t.Fatalf("key %s: seq %d after seq %d", r.Key, seq, last[r.Key])
		}
		last[r.Key] = seq
	}
}

// Redis restarted between two batches: while it is down Publish fails
// promptly with retryable errors; once it is back the next Publish succeeds,
// go-redis replacing its dead connections.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t)
	w, s := newWorld(t, srv.url(), "")
	batch := func(from int64) []*wharf.Message {
		msgs := make([]*wharf.Message, 50)
		for i := range msgs {
			msgs[i] = &wharf.Message{ID: wharf.FormatID(from+int64(i), 1), Seq: from + int64(i), Topic: "t", Key: fmt.Sprintf("k%d", i%3), Payload: []byte("x")}
		}
		return msgs
	}
	requireAcked(t, publish(t, s, batch(1)))

	srv.stop(t)
	start := time.Now()
	errs := publish(t, s, batch(100))
	took := time.Since(start)
	if len(errs) != 50 {
		t.Fatalf("with Redis down Publish returned %v: want an error per message", errs)
	}
	for _, err := range errs {
		if err == nil || wharf.IsPermanent(err) {
			t.Fatalf("with Redis down: %v: want a retryable error", err)
		}
	}
	if took > testTimeout+time.Second {
		t.Fatalf("with Redis down Publish took %s: want at most the %s timeout", took, testTimeout)
	}
	t.Logf("with Redis down Publish failed in %s: %v", took.Round(time.Millisecond), errs[0])

	srv.start(t)
	requireAcked(t, publish(t, s, batch(100)))

	// A longer outage, with the relay retrying meanwhile: go-redis stops
	// dialling on every call after a while and probes once a second, so
	// the first Publish after the restart may still fail; one within a few
	// seconds must not.
	srv.stop(t)
	for range 30 {
		if errs := publish(t, s, batch(200)); firstErr(errs) == nil {
			t.Fatal("with Redis down Publish succeeded")
		}
	}
	srv.start(t)
	healed := time.Now()
	for tries := 1; ; tries++ {
		errs := publish(t, s, batch(200))
		if firstErr(errs) == nil {
			t.Logf("after a long outage the Publish #%d after the restart succeeded, %s after it", tries, time.Since(healed).Round(time.Millisecond))
			break
		}
		if time.Since(healed) > 5*time.Second {
			t.Fatalf("5s after Redis came back Publish still fails: %v", firstErr(errs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	got, err := w.read(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 150 {
		t.Fatalf("the stream holds %d entries, want 150", len(got))
	}
}

// A Redis that accepts connections and never answers: Publish returns when
// ctx is cancelled, or when Options.Timeout passes, even with a client that
// would wait forever.
func TestSilentRedis(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	client := redis.NewClient(&redis.Options{Addr: l.Addr().String(), ReadTimeout: -1, WriteTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() {
		_ = client.Close()
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	msgs := []*wharf.Message{{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Key: "k"}, {ID: wharf.FormatID(int64(2), 1), Seq: int64(2), Topic: "t", Key: "k"}}
	for _, c := range []struct {
		name    string
		timeout time.Duration
		cancel  bool
		want    string
	}{
		{"cancel", time.Hour, true, "context canceled"},
		{"timeout", 300 * time.Millisecond, false, "within the 300ms timeout"},
	} {
		s, err := New(client, Options{Timeout: c.timeout})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if c.cancel {
			time.AfterFunc(200*time.Millisecond, cancel)
		}
		start := time.Now()
		errs := s.Publish(ctx, msgs)
		took := time.Since(start)
		cancel()
		if took > 5*time.Second {
			t.Errorf("%s: Publish took %s", c.name, took)
		}
		if len(errs) != len(msgs) {
			t.Fatalf("%s: results %v: want one error per message", c.name, errs)
		}
		for _, err := range errs {
			if err == nil || wharf.IsPermanent(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v: want a retryable error saying %q", c.name, err, c.want)
			}
		}
	}
}

// Open pings at once: a closed port, a wrong password and a missing database
// fail with one line that says what is wrong and never shows the password.
func TestOpenFailsClearly(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t, "--requirepass", "right-pw")
	cases := map[string]string{
		// Port 1 (tcpmux) is closed on any test machine; a free port
		// could be taken by another test's private server.
		"redis://:s3cret@127.0.0.1:1":                    "cannot reach Redis at 127.0.0.1:1",
		"redis://:s3cret@" + srv.addr():                  "refused the credentials",
		"redis://default:s3cret@" + srv.addr():           "refused the credentials",
		"redis://" + srv.addr():                          "refused the credentials",
		"redis://:right-pw@" + srv.addr() + "/99999":     "has no database 99999",
		"rediss://:s3cret@" + srv.addr() + "?timeout=1s": "is it a TLS port?",
	}
	for raw, want := range cases {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		s, err := Open(ctx, u)
		took := time.Since(start)
		cancel()
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: Open succeeded", u.Redacted())
			continue
		}
		msg := err.Error()
		t.Logf("%s: %s", u.Redacted(), msg)
		if !strings.Contains(msg, want) || strings.Contains(msg, "\n") || strings.Contains(msg, "s3cret") || strings.Contains(msg, "right-pw") {
			t.Errorf("%s: error %q: want one line saying %q, without the password", u.Redacted(), msg, want)
		}
		if took > 12*time.Second {
			t.Errorf("%s: Open took %s to fail", u.Redacted(), took)
		}
	}
	u, _ := url.Parse("redis://:right-pw@" + srv.addr() + "/2?name=wharf-test")
	s, err := Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open with the right password: %v", err)
	}
	defer s.Close()
	requireAcked(t, publish(t, s, []*wharf.Message{{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Payload: []byte("x")}}))
	// The client name and database are the URL's.
	list, err := s.(*Sink).Client().ClientList(context.Background()).Result()
	if err != nil || !strings.Contains(list, "name=wharf-test") || !strings.Contains(list, "db=2") {
		t.Fatalf("CLIENT LIST %q (%v): want name=wharf-test and db=2", list, err)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("rediss://u:p%40ss@h1:6380/2?stream_template=wharf%3A%7B%7Btopic%7D%7D&maxlen=1000&timeout=5s&name=relay-1&max_payload=1048576")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.redis
	got := fmt.Sprintf("%s %s %s %d %s %v %s %s %s", o.Addr, o.Username, o.Password, o.DB, o.ClientName, o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, o.DialTimeout)
	if want := "h1:6380 u p@ss 2 relay-1 true 5s 5s 5s"; got != want {
		t.Errorf("redis options %q, want %q", got, want)
	}
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "h1" || o.TLSConfig.InsecureSkipVerify {
		t.Errorf("rediss:// TLS config %+v: want verification of h1", o.TLSConfig)
	}
	if want := (Options{StreamTemplate: "wharf:{{topic}}", MaxLen: 1000, Timeout: 5 * time.Second, MaxPayload: 1 << 20}); cfg.opts != want {
		t.Errorf("sink options %+v, want %+v", cfg.opts, want)
	}

	u, _ = url.Parse("redis://h2")
	cfg, err = parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	o = cfg.redis
	if o.Addr != "h2:6379" || o.DB != 0 || o.TLSConfig != nil || o.ClientName != "wharf" || o.ReadTimeout != defaultTimeout {
		t.Errorf("defaults: %+v", o)
	}
	if want := (Options{Timeout: defaultTimeout}); cfg.opts != want {
		t.Errorf("default sink options %+v, want %+v", cfg.opts, want)
	}

	u, _ = url.Parse("redis://h?acks=1")
	if _, err := parseURL(u); err == nil || !strings.Contains(err.Error(), "takes "+validOptions) {
		t.Errorf("unknown option: error %v, want it to list the valid ones", err)
	}

	bad := map[string]string{
		"redis://h?ce=avro":                                      `ce="avro": want binary or structured`,
		"redis://h?ce_source=/svc":                               "no content mode",
		"http://u:s3cret@h":                                      "redis:// and rediss://",
		"redis://u:s3cret@h?acks=1":                              `unknown option "acks"`,
		"redis://u:s3cret@h?db=1":                                `unknown option "db"`,
		"redis://u:s3cret@h?maxlen=-1":                           "maxlen=",
		"redis://u:s3cret@h?maxlen=lots":                         "maxlen=",
		"redis://u:s3cret@h?timeout=soon":                        "timeout=",
		"redis://u:s3cret@h?timeout=0s":                          "timeout=",
		"redis://u:s3cret@h?pool_size=8":                         `unknown option "pool_size"`,
		"redis://u:s3cret@h?max_payload=big":                     "max_payload=",
		"redis://u:s3cret@h?name=two%20words":                    "name=",
		"redis://u:s3cret@h/db1":                                 "not a database number",
		"redis://u:s3cret@h/1/2":                                 "not a database number",
		"redis://u:s3cret@h?stream_template={{topic}}.{{topic}}": "more than once",
		"redis://u:s3cret@h1,h2":                                 "write redis://",
		"redis://u:s3cret@h#frag":                                "write redis://",
	}
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, bad)
}

// BenchmarkPublish is the sink's publish rate into the real Redis: one
// pipeline of 1,000 XADDs per Publish (MAXLEN ~ 100,000 to bound memory).
func BenchmarkPublish(b *testing.B) {
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		_, s := newWorld(b, sharedURL(), "maxlen="+strconv.Itoa(benchMaxLen))
		return s
	})
}

// BenchmarkDirectPublish is the same workload written with go-redis alone:
// one pipeline of XADDs (id, topic, key, payload; MAXLEN ~ 100,000) per
// batch, checking every reply: the baseline BenchmarkPublish is compared
// with.
func BenchmarkDirectPublish(b *testing.B) {
	wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		w, _ := newWorld(b, sharedURL(), "")
		stream := w.stream(wharfsinktest.TopicOrders)
		client := w.admin
		return func(ctx context.Context, msgs []*wharf.Message) error {
			cmds := make([]*redis.StringCmd, len(msgs))
			pipe := client.Pipeline()
			for i, m := range msgs {
				cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
					Stream: stream, MaxLen: benchMaxLen, Approx: true, ID: "*",
					Values: []any{"id", m.ID, "topic", m.Topic, "key", m.Key, "payload", m.Payload},
				})
			}
			_, _ = pipe.Exec(ctx)
			for _, c := range cmds {
				if err := c.Err(); err != nil {
					return err
				}
			}
			return nil
		}
	})
}
