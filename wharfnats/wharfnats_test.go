package wharfnats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// nats.go stops every goroutine it starts when its connection closes.
func TestMain(m *testing.M) {
	testtool.ExamplesNeed("nats-server", "127.0.0.1:4222", startHint, "ExampleNew")
	leakcheck.Main(m)
}

const (
	sharedURL       = "nats://127.0.0.1:4222"
	startHint       = "start it with: nats-server -js -a 127.0.0.1 -p 4222 -sd /var/lib/nats-server &"
	testAckTimeout  = 3 * time.Second
	adminTimeout    = 10 * time.Second
	serverStartWait = 10 * time.Second

	// streamStoreFailed is JetStream's err_code for "error creating store
	// for stream"; nats.go names no constant for it.
	streamStoreFailed jetstream.ErrorCode = 10049
)

// requireServer connects to url or, when nothing answers, fails the test
// under CI=true and skips it otherwise.
func requireServer(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err == nil {
		t.Cleanup(nc.Close)
		return nc
	}
	testtool.Missing(t, "nats-server", fmt.Sprintf("no NATS server with JetStream at %s (%v): %s", url, err, startHint))
	return nil
}

// world is one test's destination: a stream of its own on a server.
type world struct {
	url    string
	stream string
	prefix string
	server *privateServer // for the broker-outage case only
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
	extra  string // URL options of every sink, e.g. "strict_order=true"
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newStream creates a uniquely named stream on serverURL capturing
// "<prefix>.>", changed by adjust when it is not nil, and deletes it at
// cleanup.
func newStream(t testing.TB, serverURL string, adjust func(*jetstream.StreamConfig)) (*world, jetstream.JetStream) {
	t.Helper()
	nc := requireServer(t, serverURL)
	id := randomID()
	w := &world{url: serverURL, stream: "WHARFTEST_" + id, prefix: "wharftest." + id}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.StreamConfig{
		Name:     w.stream,
		Subjects: []string{w.prefix + ".>"},
		Storage:  jetstream.FileStorage,
		MaxAge:   time.Hour, // in case cleanup never runs
	}
	if adjust != nil {
		adjust(&cfg)
	}
	if err := createStream(t, js, cfg); err != nil {
		t.Fatalf("create stream %s: %v (is JetStream enabled? %s)", w.stream, err, startHint)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := js.DeleteStream(ctx, w.stream); err != nil {
			t.Logf("delete stream %s: %v", w.stream, err)
		}
	})
	return w, js
}

// createStream creates the stream, trying again when the server answers
// err_code 10049. That answer is the server's fixed sentence for any failure
// to set up a stream's file store; the cause goes only to the server's log,
// and under a loaded machine it has been transient (one CI run in many). The
// stream names are unique, so a retry cannot meet a stream of another test.
func createStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if _, err = js.CreateStream(ctx, cfg); err == nil {
			return nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != streamStoreFailed {
			return err
		}
		t.Logf("create stream %s, attempt %d: %v; trying again", cfg.Name, attempt, err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%w (the server's log, e.g. /var/log/nats-server.log, says why)", err)
}

// newWorld creates a uniquely named stream on serverURL, deleted at cleanup,
// and opens a sink on it through Open, as the CLI does.
func newWorld(t testing.TB, serverURL string) (*world, wharf.Sink) {
	t.Helper()
	return newWorldWith(t, serverURL, "")
}

// newWorldWith is newWorld with extra URL options ("strict_order=true").
func newWorldWith(t testing.TB, serverURL, extra string) (*world, wharf.Sink) {
	t.Helper()
	w, _ := newStream(t, serverURL, nil)
	raw := fmt.Sprintf("%s?stream=%s&subject_template=%s.%s&ack_timeout=%s", serverURL, w.stream, w.prefix, url.QueryEscape(TopicPlaceholder), testAckTimeout)
	if extra != "" {
		raw += "&" + extra
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
	return w, s
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	w, s := newWorldWith(t, sharedURL, h.extra)
	h.worlds.Set(t, w)
	return s
}

// newBreakableSink runs a private nats-server for the test, so that breaking
// it leaves the shared one alone.
func (h *harness) newBreakableSink(t *testing.T) wharf.Sink {
	srv := startPrivateServer(t, "", "")
	w, s := newWorldWith(t, srv.url(), h.extra)
	w.server = srv
	h.worlds.Set(t, w)
	return s
}

// consume reads the test's stream from its first message with direct gets,
// which keep the stream's order: the order JetStream stored the messages in.
func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	t.Helper()
	w := h.worlds.Get(t)
	nc, err := nats.Connect(w.url, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	wanted := map[string]string{} // subject -> wharf topic
	for _, tp := range topics {
		wanted[w.prefix+"."+tp] = tp
	}
	deadline := time.Now().Add(timeout)
	var got []wharfsinktest.Received
	next := uint64(1)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		st, err := js.Stream(ctx, w.stream)
		if err != nil {
			cancel()
			t.Fatalf("consume: stream %s: %v", w.stream, err)
		}
		last := st.CachedInfo().State.LastSeq
		for ; next <= last; next++ {
			m, err := st.GetMsg(ctx, next)
			if err != nil {
				cancel()
				t.Fatalf("consume: get %s #%d: %v", w.stream, next, err)
			}
			tp, ok := wanted[m.Subject]
			if !ok {
				continue
			}
			r := wharfsinktest.Received{Topic: tp, Payload: m.Data}
			for k, vs := range m.Header {
				switch k {
				case jetstream.MsgIDHeader:
					r.ID = vs[0]
				case HeaderKey:
					r.Key = vs[0]
				case jetstream.ExpectedStreamHeader:
					// Set by the sink for JetStream, which stores it too.
				default:
					if r.Headers == nil {
						r.Headers = map[string]string{}
					}
					r.Headers[k] = vs[0]
				}
			}
			got = append(got, r)
		}
		cancel()
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	t.Run("pipelined", func(t *testing.T) { runConformance(t, "") })
	t.Run("strict_order", func(t *testing.T) { runConformance(t, "strict_order=true") })
}

func runConformance(t *testing.T, extra string) {
	nc := requireServer(t, sharedURL)
	h := &harness{extra: extra}
	maxPayload := 1 << 20
	if nc.MaxPayload() > 0 {
		// NATS counts headers in max_payload; leave room for the suite's.
		maxPayload = min(maxPayload, int(nc.MaxPayload())-1024)
	}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          h.newSink,
		NewBreakableSink: h.newBreakableSink,
		Consume:          h.consume,
		BreakBroker:      func(t *testing.T) { h.worlds.Get(t).server.stop(t) },
		HealBroker:       func(t *testing.T) { h.worlds.Get(t).server.start(t) },
		Features: wharfsinktest.Features{
			MaxPayload:      maxPayload,
			SupportsHeaders: true,
		},
	})
}

// privateServer is a nats-server of one test, restartable on the same port
// and store directory.
type privateServer struct {
	bin  string
	port int
	dir  string
	conf string   // configuration file, if any
	user string   // "user:password@" to check readiness with, if conf has users
	env  []string // added to the server's environment
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// startPrivateServer starts a nats-server with JetStream for t, with the
// configuration file conf and the environment variables env ("K=V") when
// given; it checks readiness as user ("name:pass") when that is not "".
func startPrivateServer(t *testing.T, conf, user string, env ...string) *privateServer {
	t.Helper()
	bin := testtool.Path(t, "nats-server", "the broker-outage case runs a private server: apt-get install nats-server", "/usr/sbin/nats-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &privateServer{bin: bin, port: port, dir: t.TempDir(), conf: conf, env: env}
	if user != "" {
		s.user = user + "@"
	}
	s.start(t)
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *privateServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

func (s *privateServer) start(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{"-js", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-sd", s.dir}
	if s.conf != "" {
		args = append(args, "-c", s.conf)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), s.env...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	s.cmd = cmd
	// Ready when JetStream answers, which is after it recovered its store.
	deadline := time.Now().Add(serverStartWait)
	for {
		nc, err := nats.Connect("nats://"+s.user+"127.0.0.1:"+strconv.Itoa(s.port), nats.Timeout(time.Second), nats.NoReconnect())
		if err == nil {
			js, jerr := jetstream.New(nc)
			if jerr == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, jerr = js.AccountInfo(ctx)
				cancel()
			}
			nc.Close()
			if jerr == nil {
				return
			}
			err = jerr
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server on port %d did not get ready: %v", s.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *privateServer) stop(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// A payload over the server's max_payload fails permanently before sending,
// and the next message of its key is not attempted.
func TestMaxPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	_, s := newWorld(t, sharedURL)
	big := make([]byte, 64<<20)
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Key: "k", Payload: big},
		{ID: wharf.FormatID(int64(2), 1), Seq: int64(2), Topic: "t", Key: "k", Payload: []byte("x")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if len(errs) != 2 || !wharf.IsPermanent(errs[0]) || !errors.Is(errs[1], wharf.ErrNotAttempted) {
		t.Fatalf("results %v: want permanent, then not attempted", errs)
	}
}

// A subject no stream captures is retried, not dead-lettered (an operator
// can create the stream), with an error that names the subject and the fixes.
func TestNoStreamIsRetryableAndSaysWhy(t *testing.T) {
	t.Parallel()
	nc := requireServer(t, sharedURL)
	prefix := "wharftest.nostream." + randomID()
	s, err := New(nc, Options{SubjectTemplate: prefix + ".{{topic}}", AckTimeout: testAckTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, []*wharf.Message{{ID: wharf.FormatID(1, 1), Seq: 1, Topic: "t", Payload: []byte("x")}})
	if len(errs) != 1 || errs[0] == nil || wharf.IsPermanent(errs[0]) {
		t.Fatalf("results %v: want one retryable error", errs)
	}
	if !errors.Is(errs[0], jetstream.ErrNoStreamResponse) {
		t.Fatalf("error %v: want it to wrap jetstream.ErrNoStreamResponse", errs[0])
	}
	for _, want := range []string{`"` + prefix + `.t"`, "create a stream", "create_stream=true", "subject_template"} {
		if !strings.Contains(errs[0].Error(), want) {
			t.Errorf("error %q does not say %q", errs[0], want)
		}
	}
	// JetStream answers "no responders" at once; nats.go's own delayed
	// retries are off, so the relay learns it without waiting.
	if took := time.Since(start); took > time.Second {
		t.Errorf("the missing stream was reported after %s", took)
	}
}

// A subject captured by another stream than Options.Stream is retried with
// an error naming both.
func TestOtherStreamIsRetryableAndSaysWhy(t *testing.T) {
	t.Parallel()
	w, _ := newStream(t, sharedURL, nil)
	other, _ := newStream(t, sharedURL, nil)
	nc := requireServer(t, sharedURL)
	s, err := New(nc, Options{SubjectTemplate: w.prefix + ".{{topic}}", Stream: other.stream, AckTimeout: testAckTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(ctx, []*wharf.Message{{ID: wharf.FormatID(1, 1), Seq: 1, Topic: "t", Payload: []byte("x")}})
	if len(errs) != 1 || errs[0] == nil || wharf.IsPermanent(errs[0]) {
		t.Fatalf("results %v: want one retryable error", errs)
	}
	for _, want := range []string{w.prefix + ".t", "stream=" + other.stream, "subject_template"} {
		if !strings.Contains(errs[0].Error(), want) {
			t.Errorf("error %q does not say %q", errs[0], want)
		}
	}
}

// Subjects and headers NATS cannot carry fail permanently before sending,
// and hold back the later messages of their ordering key (topic and key).
func TestInvalidSubjectAndHeader(t *testing.T) {
	t.Parallel()
	nc := requireServer(t, sharedURL)
	s, err := New(nc, Options{SubjectTemplate: "wharftest.invalid.{{topic}}", AckTimeout: testAckTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(1, 1), Seq: 1, Topic: "has space", Key: "a"},
		{ID: wharf.FormatID(2, 1), Seq: 2, Topic: "*", Key: "b"},
		{ID: wharf.FormatID(3, 1), Seq: 3, Topic: "ok", Key: "c", Headers: map[string]string{"bad:name": "v"}},
		{ID: wharf.FormatID(4, 1), Seq: 4, Topic: "ok", Key: "c"},
		{ID: wharf.FormatID(5, 1), Seq: 5, Topic: "ok", Key: "d", Headers: map[string]string{"n": "line\nbreak"}},
		{ID: wharf.FormatID(6, 1), Seq: 6, Topic: "", Key: "e"},
	}
	errs := s.Publish(context.Background(), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if i == 3 {
			if !errors.Is(err, wharf.ErrNotAttempted) {
				t.Errorf("message 4: %v, want ErrNotAttempted", err)
			}
			continue
		}
		if !wharf.IsPermanent(err) {
			t.Errorf("message %d: %v, want a permanent error", i+1, err)
		}
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("nats://u:p%40ss@n1:4222,n2:4223/?subject_template=wharf.%7B%7Btopic%7D%7D&stream=WHARF&create_stream=true&ack_timeout=5s&strict_order=true&allow_system_subjects=false&name=relay-1&tls=true")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := urlConfig{
		servers:      []string{"nats://u:p%40ss@n1:4222", "nats://u:p%40ss@n2:4223"},
		opts:         Options{SubjectTemplate: "wharf.{{topic}}", Stream: "WHARF", AckTimeout: 5 * time.Second, StrictOrder: true},
		createStream: true,
		name:         "relay-1",
		tls:          true,
	}
	if fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	bad := map[string]string{
		"nats://":                                        "names no server",
		"nats://u:s3cret@n1?acks=1":                      `unknown option "acks"`,
		"nats://n1?create_stream=true":                   "needs stream=NAME",
		"nats://n1?create_stream=true&stream=S":          "prefix.{{topic}}",
		"nats://n1?ack_timeout=soon":                     "ack_timeout",
		"nats://n1?create_stream=maybe":                  "create_stream=",
		"nats://n1/path":                                 "write nats://",
		"nats://n1?subject_template={{topic}}.{{topic}}": "more than once",
		"nats://n1?strict_order=yes%20please":            "strict_order=",
		"nats://n1?allow_system_subjects=1x":             "allow_system_subjects=",
		"nats://n1?subject_template=$JS.API.{{topic}}":   "allow_system_subjects=true",
		"nats://n1?subject_template=_INBOX.{{topic}}":    "allow_system_subjects=true",
		"nats://n1?subject_template=${{topic}}":          `subjects start with "$"`,
		"nats://n1?ce=xml":                               `ce="xml": want binary or structured`,
		"nats://n1?ce_source=/svc":                       "no content mode",
	}
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, bad)
}

// Open with create_stream=true creates the stream once and reuses it after.
func TestOpenCreatesStream(t *testing.T) {
	t.Parallel()
	nc := requireServer(t, sharedURL)
	id := randomID()
	stream := "WHARFTEST_CREATE_" + id
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	raw := fmt.Sprintf("%s?stream=%s&subject_template=wharftest.%s.%s", sharedURL, stream, id, url.QueryEscape(TopicPlaceholder))
	u, _ := url.Parse(raw)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if s, err := Open(ctx, u); err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded on a missing stream without create_stream=true")
	} else if !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Open on a missing stream: %v", err)
	}
	u, _ = url.Parse(raw + "&create_stream=true")
	m := &wharf.Message{ID: wharf.FormatID(1, 1), Seq: 1, Topic: "t", Payload: []byte("x")}
	for i := range 2 {
		s, err := Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		errs := s.Publish(ctx, []*wharf.Message{m})
		_ = s.Close()
		// The second open found the stream; JetStream knew the id already.
		if (i == 0 && errs != nil) || (i == 1 && (len(errs) != 1 || !errors.Is(errs[0], wharf.ErrDuplicate))) {
			t.Fatalf("publish %d: %v", i+1, errs)
		}
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("stream holds %d messages, want 1 (deduplicated by Nats-Msg-Id)", n)
	}
}

// BenchmarkDirectPublish is the same workload published with nats.go alone
// (async JetStream publishes with Nats-Msg-Id, waiting for every PubAck of a
// batch): the baseline BenchmarkPublish is compared with.
func BenchmarkDirectPublish(b *testing.B) {
	wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		w, _ := newWorld(b, sharedURL)
		nc := requireServer(b, sharedURL)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
		if err != nil {
			b.Fatal(err)
		}
		subject := w.prefix + "." + wharfsinktest.TopicOrders
		return func(ctx context.Context, msgs []*wharf.Message) error {
			futures := make([]jetstream.PubAckFuture, len(msgs))
			for i, m := range msgs {
				msg := &nats.Msg{Subject: subject, Data: m.Payload, Header: nats.Header{HeaderKey: []string{m.Key}}}
				f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(m.ID), jetstream.WithExpectStream(w.stream))
				if err != nil {
					return err
				}
				futures[i] = f
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
	})
}
