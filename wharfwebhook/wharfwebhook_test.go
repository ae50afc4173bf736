package wharfwebhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the
// run, for the tests that run a relay.
var databaseURL string

// Every connection the sink or a test server opens is closed by Close:
// testdb checks for leaked goroutines.
func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

// testSecret is the secret of the Standard Webhooks test vector.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// verify is an independent implementation of Standard Webhooks verification,
// as a receiver would write it from the specification: the signed content is
// "<webhook-id>.<webhook-timestamp>.<body>", the key is the base64 after
// whsec_, webhook-signature is a space-separated list of "v1,<base64>", and
// the timestamp must be within five minutes of now.
func verify(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("missing webhook headers: id %q timestamp %q signature %q", id, ts, sigs)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook-timestamp %q is not unix seconds", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("webhook-timestamp %q is %s away from now", ts, d)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		version, sig, _ := strings.Cut(s, ",")
		if version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no valid v1 signature in %q", sigs)
}

// openURL opens a sink through Open, as the CLI does, closed at cleanup.
func openURL(t testing.TB, raw string) *Sink {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.(*Sink)
}

func secretFile(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ---- the conformance harness ----

// transportHeaders are the request headers that carry no message header.
var transportHeaders = map[string]bool{
	"Content-Length": true, "User-Agent": true, "Accept-Encoding": true,
	"Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Wharf-Topic": true, "Wharf-Key": true,
}

// dest is one test's destination: an HTTP server that records what it
// accepts, checking every signature.
type dest struct {
	srv    *httptest.Server
	batch  bool
	broken atomic.Bool

	mu       sync.Mutex
	got      []wharfsinktest.Received
	names    map[string]map[string]string // message id -> canonical -> header name as published
	problems []string
}

type wireElement struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
	CreatedAt       *time.Time        `json:"created_at"`
	Attempt         int               `json:"attempt"`
}

func (d *dest) problem(format string, args ...any) {
	d.mu.Lock()
	d.problems = append(d.problems, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

func (d *dest) serve(w http.ResponseWriter, r *http.Request) {
	if d.broken.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := verify(testSecret, r.Header, body); err != nil {
		d.problem("%s: %v", r.URL.Path, err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.URL.RawQuery != "x=1&y=%2F" {
		d.problem("query %q: want the destination's own x=1&y=%%2F without wharf_ options", r.URL.RawQuery)
	}
	topic, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/hook/"))
	if err != nil || topic != r.Header.Get("wharf-topic") {
		d.problem("path %q and wharf-topic %q disagree", r.URL.EscapedPath(), r.Header.Get("wharf-topic"))
	}
	var recs []wharfsinktest.Received
	if d.batch {
		var els []wireElement
		if err := json.Unmarshal(body, &els); err != nil {
			d.problem("batch body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, e := range els {
			rec := wharfsinktest.Received{ID: e.ID, Topic: e.Topic, Payload: e.Payload}
			if e.Topic != topic {
				d.problem("element %d has topic %q in a POST to topic %q", e.Seq, e.Topic, topic)
			}
			if e.Key != nil {
				rec.Key = *e.Key
			}
			if len(e.Headers) > 0 {
				rec.Headers = e.Headers
			}
			if e.PayloadEncoding == "base64" {
				var s string
				if err := json.Unmarshal(e.Payload, &s); err != nil {
					d.problem("element %d: base64 payload is not a string", e.Seq)
				}
				rec.Payload, _ = base64.StdEncoding.DecodeString(s)
			}
			recs = append(recs, rec)
		}
	} else {
		rec := wharfsinktest.Received{ID: r.Header.Get("webhook-id"), Topic: topic, Key: r.Header.Get("wharf-key"), Payload: body}
		d.mu.Lock()
		names := d.names[rec.ID]
		d.mu.Unlock()
		for k, vs := range r.Header {
			if transportHeaders[k] || (k == "Content-Type" && names[k] == "") {
				continue
			}
			name := names[k]
			if name == "" {
				name = k
			}
			if rec.Headers == nil {
				rec.Headers = map[string]string{}
			}
			rec.Headers[name] = vs[0]
		}
		recs = append(recs, rec)
	}
	d.mu.Lock()
	d.got = append(d.got, recs...)
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// recorder remembers the case of the header names a test publishes: HTTP
// header names are case-insensitive and arrive canonicalized, so the harness
// maps them back to the names the suite compares with.
type recorder struct {
	*Sink
	d *dest
}

func (r recorder) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	r.d.mu.Lock()
	for _, m := range msgs {
		names := map[string]string{}
		for k := range m.Headers {
			names[textproto.CanonicalMIMEHeaderKey(k)] = k
		}
		r.d.names[m.ID] = names
	}
	r.d.mu.Unlock()
	return r.Sink.Publish(ctx, msgs)
}

type harness struct {
	batch bool
	dests wharfsinktest.PerTest[*dest]
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	d := &dest{batch: h.batch, names: map[string]map[string]string{}}
	d.srv = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.srv.Close)
	raw := d.srv.URL + "/hook/{{topic}}?x=1&wharf_allow_private=true&y=%2F&wharf_secret_file=" + url.QueryEscape(secretFile(t))
	if h.batch {
		raw += "&wharf_mode=batch&wharf_batch_size=50"
	}
	s := openURL(t, raw)
	h.dests.Set(t, d)
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, p := range d.problems {
			t.Errorf("destination: %s", p)
		}
	})
	return recorder{Sink: s, d: d}
}

func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	d := h.dests.Get(t)
	wanted := map[string]bool{}
	for _, tp := range topics {
		wanted[tp] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		d.mu.Lock()
		var got []wharfsinktest.Received
		for _, r := range d.got {
			if wanted[r.Topic] {
				got = append(got, r)
			}
		}
		d.mu.Unlock()
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runConformance(t *testing.T, batch bool) {
	h := &harness{batch: batch}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:     h.newSink,
		Consume:     h.consume,
		BreakBroker: func(t *testing.T) { h.dests.Get(t).broken.Store(true) },
		HealBroker:  func(t *testing.T) { h.dests.Get(t).broken.Store(false) },
		Features:    wharfsinktest.Features{SupportsHeaders: true},
	})
}

func TestConformance(t *testing.T) { runConformance(t, false) }

func TestConformanceBatch(t *testing.T) { runConformance(t, true) }

// ---- a scriptable server ----

type request struct {
	path, rawPath, query string
	header               http.Header
	body                 []byte
}

// server records every request and answers with respond (204 when nil).
type server struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []request
	respond func(w http.ResponseWriter, r *http.Request, body []byte) bool // true when it answered
}

func newServer(t testing.TB, respond func(w http.ResponseWriter, r *http.Request, body []byte) bool) *server {
	t.Helper()
	s := &server{respond: respond}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, request{r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), body})
		s.mu.Unlock()
		if s.respond != nil && s.respond(w, r, body) {
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.reqs...)
}

// msg returns a message at position seq of an outbox, with the id the
// database would give it (nonce 1).
func msg(seq int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: idOf(seq), Seq: seq, Topic: topic, Key: key, Payload: []byte(payload), Attempt: 1}
}

// idOf is the id of the test message at position seq.
func idOf(seq int64) string { return wharf.FormatID(seq, 1) }

// seqOf is the position of a single-mode request's message, from its
// webhook-id; 0 when it is not a message id.
func seqOf(h http.Header) int64 {
	seq, _, err := wharf.ParseID(h.Get("webhook-id"))
	if err != nil {
		return 0
	}
	return seq
}

func publish(t *testing.T, s wharf.Sink, msgs ...*wharf.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

func errAt(errs []error, i int) error {
	if errs == nil {
		return nil
	}
	return errs[i]
}

// ---- signatures and headers ----

// The signature matches the Standard Webhooks test vector and verifies with
// the independent implementation, in both modes; without a secret there is
// no signature but the id and timestamp are there.
func TestSignature(t *testing.T) {
	t.Parallel()
	key, err := decodeSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	if got := sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`)); got != want {
		t.Fatalf("signature of the test vector: %s, want %s", got, want)
	}

	srv := newServer(t, nil)
	for _, mode := range []string{"single", "batch"} {
		s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_secret_file="+url.QueryEscape(secretFile(t))+"&wharf_mode="+mode)
		if errs := publish(t, s, msg(1, "t", "k", `{"a":1}`), msg(2, "t", "", "not json \x00\xff")); errs != nil {
			t.Fatalf("%s: %v", mode, errs)
		}
	}
	unsigned := openURL(t, srv.URL+"/?wharf_allow_private=true")
	if errs := publish(t, unsigned, msg(3, "t", "", "x")); errs != nil {
		t.Fatal(errs)
	}
	reqs := srv.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 2 single, 1 batch and 1 unsigned", len(reqs))
	}
	for _, r := range reqs[:3] {
		if err := verify(testSecret, r.header, r.body); err != nil {
			t.Errorf("request %s: %v", r.header.Get("webhook-id"), err)
		}
		if err := verify("whsec_"+base64.StdEncoding.EncodeToString([]byte("another key")), r.header, r.body); err == nil {
			t.Errorf("request %s verifies with another secret", r.header.Get("webhook-id"))
		}
		tampered := append([]byte(nil), r.body...)
		tampered[0] ^= 1
		if err := verify(testSecret, r.header, tampered); err == nil {
			t.Errorf("request %s verifies with a tampered body", r.header.Get("webhook-id"))
		}
	}
	last := reqs[3].header
	if last.Get("webhook-signature") != "" || last.Get("webhook-id") != idOf(3) || last.Get("webhook-timestamp") == "" {
		t.Fatalf("unsigned request headers: %v", last)
	}
}

// Single mode: the body is the payload, the headers are the documented ones,
// the topic is path-escaped and the destination's own query goes through.
func TestSingleRequest(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/in/{{topic}}/x?token=abc&wharf_allow_private=true&b=%2F&wharf_header_Authorization=Bearer%20s3cret&wharf_header_X-Static=1")
	m1 := msg(10, "a/b c", "k1", `{"n":1}`)
	m1.Headers = map[string]string{"trace-id": "t1", "X-Static": "from the message", "user-agent": "app/1"}
	m2 := msg(11, "orders", "", "\x00binary")
	m3 := msg(12, "orders", "k2", "<xml/>")
	m3.Headers = map[string]string{"Content-Type": "application/xml"}
	if errs := publish(t, s, m1, m2, m3); errs != nil {
		t.Fatal(errs)
	}
	byID := map[int64]request{}
	for _, r := range srv.requests() {
		byID[seqOf(r.header)] = r
	}
	r := byID[10]
	if r.rawPath != "/in/a%2Fb%20c/x" || r.query != "token=abc&b=%2F" {
		t.Errorf("message 10 went to %s?%s, want /in/a%%2Fb%%20c/x?token=abc&b=%%2F", r.rawPath, r.query)
	}
	want := map[string]string{
		"Content-Type": "application/json", "Wharf-Topic": "a/b c", "Wharf-Key": "k1",
		"Trace-Id": "t1", "X-Static": "1", "Authorization": "Bearer s3cret", "User-Agent": "app/1",
	}
	for k, v := range want {
		if got := r.header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("message 10 header %s: %q, want %q", k, got, v)
		}
	}
	if string(r.body) != `{"n":1}` {
		t.Errorf("message 10 body %q", r.body)
	}
	r = byID[11]
	if r.header.Get("Content-Type") != "application/octet-stream" || r.header.Get("Wharf-Key") != "" || string(r.body) != "\x00binary" {
		t.Errorf("message 11: content-type %q key %q body %q", r.header.Get("Content-Type"), r.header.Get("Wharf-Key"), r.body)
	}
	if r.rawPath != "/in/orders/x" {
		t.Errorf("message 11 path %s", r.rawPath)
	}
	if r = byID[12]; r.header.Get("Content-Type") != "application/xml" {
		t.Errorf("message 12 content-type %q, want the message's", r.header.Get("Content-Type"))
	}
}

// Headers HTTP cannot carry fail permanently in single mode, and the later
// messages of their key are not attempted; batch mode carries them in JSON.
func TestInvalidHeaders(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/hook/{{topic}}?wharf_allow_private=true")
	bad := []*wharf.Message{
		{ID: idOf(1), Seq: 1, Topic: "t", Key: "a", Headers: map[string]string{"bad name": "v"}},
		{ID: idOf(2), Seq: 2, Topic: "t", Key: "b", Headers: map[string]string{"n": "line\nbreak"}},
		{ID: idOf(3), Seq: 3, Topic: "t", Key: "c", Headers: map[string]string{"Connection": "close"}},
		{ID: idOf(4), Seq: 4, Topic: "t", Key: "d\r\nX-Injected: 1"},
		{ID: idOf(5), Seq: 5, Topic: "..", Key: "e"},
		{ID: idOf(6), Seq: 6, Topic: "ok\n", Key: "f"},
	}
	var msgs []*wharf.Message
	for _, m := range bad {
		// The same topic and key: the same ordering key.
		msgs = append(msgs, m, &wharf.Message{ID: idOf(m.Seq + 100), Seq: m.Seq + 100, Topic: m.Topic, Key: m.Key, Payload: []byte("after")})
	}
	msgs = append(msgs, msg(200, "t", "good", "{}"))
	errs := publish(t, s, msgs...)
	for i, m := range msgs {
		switch {
		case m.Seq == 200:
			if errAt(errs, i) != nil {
				t.Errorf("message 200: %v", errs[i])
			}
		case m.Seq > 100:
			if !errors.Is(errAt(errs, i), wharf.ErrNotAttempted) {
				t.Errorf("message %d: %v, want ErrNotAttempted", m.Seq, errAt(errs, i))
			}
		default:
			if !wharf.IsPermanent(errAt(errs, i)) {
				t.Errorf("message %d: %v, want a permanent error", m.Seq, errAt(errs, i))
			}
		}
	}
	if n := len(srv.requests()); n != 1 {
		t.Errorf("%d requests reached the server, want only message 200", n)
	}

	sb := openURL(t, srv.URL+"/batch?wharf_allow_private=true&wharf_mode=batch")
	if errs := publish(t, sb, bad[0], bad[1], bad[2]); errs != nil {
		t.Fatalf("batch mode carries any header in the body: %v", errs)
	}
}

// ---- batch mode ----

// The batch body is the documented JSON array; the webhook-id is stable for
// the same messages; a POST holds one topic and at most wharf_batch_size
// messages.
func TestBatchBody(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/hook/{{topic}}?wharf_allow_private=true&wharf_mode=batch&wharf_batch_size=3")
	created := time.Date(2025, 1, 2, 3, 4, 5, 123456000, time.FixedZone("x", 3600))
	m1 := msg(1, "orders", "k", `{"n": 1, "s": "<&>"}`)
	m1.Headers, m1.CreatedAt, m1.Attempt = map[string]string{"a": "b\nc"}, created, 3
	m2 := msg(2, "orders", "", "\xffbinary")
	m3 := msg(3, "events", "k", `[1,2]`)
	m4 := msg(4, "orders", "k2", `"x"`)
	m5 := msg(5, "orders", "k2", `7`)
	msgs := []*wharf.Message{m1, m2, m3, m4, m5}
	if errs := publish(t, s, msgs...); errs != nil {
		t.Fatal(errs)
	}
	reqs := srv.requests()
	seen := map[int64]wireElement{}
	for _, r := range reqs {
		if r.header.Get("Content-Type") != "application/json" {
			t.Errorf("content-type %q", r.header.Get("Content-Type"))
		}
		var els []wireElement
		if err := json.Unmarshal(r.body, &els); err != nil {
			t.Fatalf("body %s: %v", r.body, err)
		}
		if len(els) == 0 || len(els) > 3 {
			t.Fatalf("a POST of %d messages with wharf_batch_size=3", len(els))
		}
		topic := r.header.Get("wharf-topic")
		if r.path != "/hook/"+topic {
			t.Errorf("POST to %s with wharf-topic %q", r.path, topic)
		}
		for _, e := range els {
			if e.Topic != topic {
				t.Errorf("element %d of topic %q in a POST to %q", e.Seq, e.Topic, topic)
			}
			if e.ID != wharf.FormatID(e.Seq, 1) {
				t.Errorf("element %d has id %q, want %q", e.Seq, e.ID, wharf.FormatID(e.Seq, 1))
			}
			seen[e.Seq] = e
		}
		// batch_ and the first 16 bytes of the SHA-256 of the elements' ids,
		// each followed by a comma, in hex.
		h := sha256.New()
		for _, e := range els {
			h.Write([]byte(e.ID + ","))
		}
		if id, want := r.header.Get("webhook-id"), "batch_"+hex.EncodeToString(h.Sum(nil)[:16]); id != want {
			t.Errorf("batch webhook-id %q, want %q (batch_ and 32 hex digits from the element ids)", id, want)
		}
	}
	if len(seen) != 5 {
		t.Fatalf("%d distinct messages arrived, want 5", len(seen))
	}
	e := seen[1]
	if e.Key == nil || *e.Key != "k" || e.Headers["a"] != "b\nc" || e.Attempt != 3 || e.PayloadEncoding != "" ||
		e.CreatedAt == nil || !e.CreatedAt.Equal(created) || e.CreatedAt.Location() != time.UTC {
		t.Errorf("element 1: %+v", e)
	}
	var p map[string]any
	if err := json.Unmarshal(e.Payload, &p); err != nil || p["s"] != "<&>" {
		t.Errorf("element 1 payload %s is not the embedded JSON", e.Payload)
	}
	if !strings.Contains(string(e.Payload), "<&>") {
		t.Errorf("element 1 payload %s: HTML characters escaped", e.Payload)
	}
	e = seen[2]
	var b64 string
	if e.Key != nil || e.Headers == nil || len(e.Headers) != 0 || e.PayloadEncoding != "base64" || json.Unmarshal(e.Payload, &b64) != nil {
		t.Errorf("element 2: %+v", e)
	}
	if raw, _ := base64.StdEncoding.DecodeString(b64); string(raw) != "\xffbinary" {
		t.Errorf("element 2 payload decodes to %q", raw)
	}
	if seen[3].CreatedAt != nil {
		t.Errorf("element 3 without a creation time has created_at %v", seen[3].CreatedAt)
	}

	// The same messages again: the same webhook-ids.
	before := map[string]bool{}
	for _, r := range reqs {
		before[r.header.Get("webhook-id")] = true
	}
	if errs := publish(t, s, msgs...); errs != nil {
		t.Fatal(errs)
	}
	for _, r := range srv.requests()[len(reqs):] {
		if !before[r.header.Get("webhook-id")] {
			t.Errorf("republishing the same messages gave a new webhook-id %q", r.header.Get("webhook-id"))
		}
	}
	if batchID(msgs, []int{0, 1, 4}) == batchID(msgs, []int{0, 4}) {
		t.Error("different messages with the same first and last id share a webhook-id")
	}
}

// A key's messages keep their order across consecutive batch POSTs, and when
// one POST fails the key's later messages are not attempted while other keys
// are delivered.
func TestBatchOrderAcrossPosts(t *testing.T) {
	t.Parallel()
	const failID = 13 // in the second POST of key "long"
	srv := newServer(t, func(w http.ResponseWriter, _ *http.Request, body []byte) bool {
		var els []wireElement
		_ = json.Unmarshal(body, &els)
		for _, e := range els {
			if e.Seq == failID {
				w.WriteHeader(http.StatusBadRequest)
				return true
			}
		}
		return false
	})
	s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_mode=batch&wharf_batch_size=4&wharf_concurrency=8")
	var msgs []*wharf.Message
	for i := range 12 {
		msgs = append(msgs, msg(int64(10+i), "t", "long", "{}")) // ids 10..21: POSTs 10-13, 14-17, 18-21
	}
	for i := range 20 {
		msgs = append(msgs, msg(int64(100+i), "t", fmt.Sprintf("k%d", i%5), "{}"))
	}
	errs := publish(t, s, msgs...)
	for i, m := range msgs {
		err := errAt(errs, i)
		switch {
		case m.Key != "long":
			if err != nil {
				t.Errorf("message %d of key %s: %v", m.Seq, m.Key, err)
			}
		case m.Seq < 14:
			if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "400 Bad Request") {
				t.Errorf("message %d in the failed POST: %v, want permanent 400", m.Seq, err)
			}
		default:
			if !errors.Is(err, wharf.ErrNotAttempted) {
				t.Errorf("message %d after the failed POST: %v, want ErrNotAttempted", m.Seq, err)
			}
		}
	}
	last := map[string]int64{}
	for _, r := range srv.requests() {
		var els []wireElement
		if err := json.Unmarshal(r.body, &els); err != nil {
			t.Fatal(err)
		}
		for _, e := range els {
			if e.Seq >= 14 && e.Seq < 22 {
				t.Errorf("message %d was sent after an earlier POST of its key failed", e.Seq)
			}
			if k := *e.Key; e.Seq <= last[k] {
				t.Errorf("key %s: message %d after %d", k, e.Seq, last[k])
			} else {
				last[k] = e.Seq
			}
		}
	}
}

// pack keeps every chunk within size and one topic, puts every key's
// messages in chunks of increasing index with dependencies on earlier chunks
// only, and does not split a key's messages that fit in one chunk.
func TestPack(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		// Keys repeat across topics: the ordering key is (topic, key), so
		// the same key in two topics is two ordering keys.
		n := 1 + rng.IntN(200)
		size := 1 + rng.IntN(20)
		keys := 1 + rng.IntN(15)
		msgs := make([]*wharf.Message, n)
		skip := make([]bool, n)
		for i := range msgs {
			key := ""
			if rng.IntN(5) > 0 {
				key = fmt.Sprintf("k%d", rng.IntN(keys))
			}
			msgs[i] = msg(int64(i+1), []string{"a", "b"}[rng.IntN(1+round%2)], key, "{}")
			skip[i] = rng.IntN(20) == 0
		}
		chunks := pack(msgs, skip, size)
		placed := map[int]int{} // message -> chunk
		for c, ch := range chunks {
			if len(ch.idx) == 0 || len(ch.idx) > size {
				t.Fatalf("round %d: chunk %d holds %d messages, size %d", round, c, len(ch.idx), size)
			}
			for j, i := range ch.idx {
				if j > 0 && i <= ch.idx[j-1] {
					t.Fatalf("round %d: chunk %d is not in id order", round, c)
				}
				if msgs[i].Topic != ch.topic {
					t.Fatalf("round %d: chunk %d of topic %s holds topic %s", round, c, ch.topic, msgs[i].Topic)
				}
				if _, dup := placed[i]; dup || skip[i] {
					t.Fatalf("round %d: message %d placed twice or despite skip", round, i)
				}
				placed[i] = c
			}
			for _, d := range ch.deps {
				if d >= c {
					t.Fatalf("round %d: chunk %d depends on later chunk %d", round, c, d)
				}
			}
		}
		lastChunk := map[string]int{}
		for i, m := range msgs {
			if skip[i] {
				continue
			}
			c, ok := placed[i]
			if !ok {
				t.Fatalf("round %d: message %d not placed", round, i)
			}
			k := m.OrderingKey()
			if k == "" {
				continue
			}
			if p, ok := lastChunk[k]; ok && p != c {
				if p > c {
					t.Fatalf("round %d: key %q goes back from chunk %d to %d", round, k, p, c)
				}
				found := false
				for _, d := range chunks[c].deps {
					found = found || d == p
				}
				if !found {
					t.Fatalf("round %d: chunk %d holds key %q after chunk %d but does not depend on it", round, c, k, p)
				}
			}
			lastChunk[k] = c
		}
	}
	// 100 keys of 10 messages in chunks of 100: ten independent POSTs.
	var msgs []*wharf.Message
	for i := range 1000 {
		msgs = append(msgs, msg(int64(i+1), "t", fmt.Sprintf("k%d", i%100), "{}"))
	}
	chunks := pack(msgs, make([]bool, len(msgs)), 100)
	for c, ch := range chunks {
		if len(ch.deps) > 0 || len(ch.idx) != 100 {
			t.Fatalf("chunk %d: %d messages, deps %v: want 10 full, independent chunks", c, len(ch.idx), ch.deps)
		}
	}
}

// ---- results ----

// 429 with Retry-After: 7 asks for a retry in 7s; 408 and 5xx are retried;
// an HTTP date works as Retry-After too.
func TestRetryable(t *testing.T) {
	t.Parallel()
	status := map[int64]int{1: 429, 2: 500, 3: 408, 4: 503, 5: 502}
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		id := seqOf(r.Header)
		switch id {
		case 1:
			w.Header().Set("Retry-After", "7")
		case 4:
			w.Header().Set("Retry-After", time.Now().Add(time.Hour+time.Minute).UTC().Format(http.TimeFormat))
		}
		w.WriteHeader(status[id])
		_, _ = io.WriteString(w, "busy")
		return true
	})
	s := openURL(t, srv.URL+"/?wharf_allow_private=true")
	errs := publish(t, s, msg(1, "t", "a", "{}"), msg(2, "t", "b", "{}"), msg(3, "t", "c", "{}"), msg(4, "t", "d", "{}"), msg(5, "t", "e", "{}"))
	want := []string{"retry after 7s: ", "", "", "retry after 1h0m0s: ", ""}
	for i, err := range errs {
		if err == nil || wharf.IsPermanent(err) {
			t.Errorf("message %d: %v, want a retryable error", i+1, err)
			continue
		}
		if want[i] != "" && !strings.HasPrefix(err.Error(), want[i]) {
			t.Errorf("message %d: %q, want it to start with %q", i+1, err, want[i])
		}
		if want[i] == "" && strings.HasPrefix(err.Error(), "retry after") {
			t.Errorf("message %d: %q asks for a delay the server did not give", i+1, err)
		}
		if !strings.Contains(err.Error(), strconv.Itoa(status[int64(i+1)])) || !strings.Contains(err.Error(), `"busy"`) {
			t.Errorf("message %d: %q does not show the status and body", i+1, err)
		}
	}

	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"0":                             0,
		" 120 ":                         2 * time.Minute,
		"99999999":                      maxRetryAfter,
		"Wed, 01 Jan 2025 00:00:30 GMT": 30 * time.Second,
		"Tue, 31 Dec 2024 23:00:00 GMT": 0,
	} {
		if d, ok := parseRetryAfter(v, now); !ok || d != want {
			t.Errorf("Retry-After %q: %s %v, want %s", v, d, ok, want)
		}
	}
	for _, v := range []string{"", "-1", "soon", "1.5"} {
		if d, ok := parseRetryAfter(v, now); ok {
			t.Errorf("Retry-After %q gave %s", v, d)
		}
	}
}

// 400 fails permanently with the status and the start of the body; the
// later messages of the key are not sent; the other keys are delivered.
func TestClientErrorIsPermanent(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("e", errorBodyBytes) + "TAIL"
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if seqOf(r.Header) != 2 {
			return false
		}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, long)
		return true
	})
	s := openURL(t, srv.URL+"/?wharf_allow_private=true")
	msgs := []*wharf.Message{
		msg(1, "t", "k", "{}"), msg(2, "t", "k", "{}"), msg(3, "t", "k", "{}"), msg(4, "t", "k", "{}"),
		msg(5, "t", "other", "{}"), msg(6, "t", "other", "{}"), msg(7, "t", "", "{}"),
	}
	errs := publish(t, s, msgs...)
	if errAt(errs, 0) != nil || errAt(errs, 4) != nil || errAt(errs, 5) != nil || errAt(errs, 6) != nil {
		t.Fatalf("results %v: the other messages must be delivered", errs)
	}
	e := errAt(errs, 1)
	if !wharf.IsPermanent(e) || !strings.Contains(e.Error(), "400 Bad Request") || !strings.Contains(e.Error(), strings.Repeat("e", 50)) {
		t.Fatalf("message 2: %v, want permanent with the status and body", e)
	}
	if strings.Contains(e.Error(), "TAIL") {
		t.Errorf("the error shows more than %d bytes of the body", errorBodyBytes)
	}
	for _, i := range []int{2, 3} {
		if !errors.Is(errAt(errs, i), wharf.ErrNotAttempted) {
			t.Errorf("message %d: %v, want ErrNotAttempted", i+1, errAt(errs, i))
		}
	}
	for _, r := range srv.requests() {
		if seq := seqOf(r.header); seq == 3 || seq == 4 {
			t.Errorf("message %d was sent after message 2 of its key failed", seq)
		}
	}
}

// A server slower than wharf_timeout gives retryable errors, in bounded time.
func TestTimeout(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return false
	})
	s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_timeout=200ms")
	start := time.Now()
	errs := publish(t, s, msg(1, "t", "a", "{}"), msg(2, "t", "b", "{}"), msg(3, "t", "a", "{}"))
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Publish took %s with wharf_timeout=200ms", took)
	}
	for _, i := range []int{0, 1} {
		err := errAt(errs, i)
		if err == nil || wharf.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "wharf_timeout") {
			t.Errorf("message %d: %v, want a retryable timeout", i+1, err)
		}
	}
	if !errors.Is(errAt(errs, 2), wharf.ErrNotAttempted) {
		t.Errorf("message 3: %v, want ErrNotAttempted", errAt(errs, 2))
	}
}

// A destination that refuses connections gives retryable errors.
func TestConnectionRefusedIsRetryable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	raw := srv.URL
	srv.Close()
	s := openURL(t, raw+"/?wharf_allow_private=true&wharf_timeout=2s")
	errs := publish(t, s, msg(1, "t", "", "{}"))
	if err := errAt(errs, 0); err == nil || wharf.IsPermanent(err) {
		t.Fatalf("connection refused: %v, want a retryable error", err)
	}
}

// wharf_concurrency bounds the requests in flight over all Publish calls;
// different keys do go concurrently; a key's requests never overlap and
// arrive in id order.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	var inFlight, maxInFlight atomic.Int64
	var mu sync.Mutex
	busy := map[string]bool{}
	last := map[string]int64{}
	var problems []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		raise(&maxInFlight, inFlight.Add(1))
		defer inFlight.Add(-1)
		key := r.Header.Get("wharf-key")
		id := seqOf(r.Header)
		if key != "" {
			mu.Lock()
			if busy[key] {
				problems = append(problems, fmt.Sprintf("key %s: message %d overlaps another request of its key", key, id))
			}
			if id <= last[key] {
				problems = append(problems, fmt.Sprintf("key %s: message %d after %d", key, id, last[key]))
			}
			busy[key], last[key] = true, id
			mu.Unlock()
			defer func() {
				mu.Lock()
				busy[key] = false
				mu.Unlock()
			}()
		}
		time.Sleep(15 * time.Millisecond)
		return false
	})
	s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_concurrency=4")
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			var msgs []*wharf.Message
			for i := range 60 {
				key := fmt.Sprintf("p%d-k%d", p, i%6)
				if i%10 == 9 {
					key = ""
				}
				msgs = append(msgs, msg(int64(p*1000+i+1), "t", key, "{}"))
			}
			if errs := publish(t, s, msgs...); errs != nil {
				t.Errorf("publisher %d: %v", p, errs)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if m := maxInFlight.Load(); m > 4 || m < 2 {
		t.Errorf("at most %d requests were in flight with wharf_concurrency=4: want 2 to 4", m)
	}
	if n := len(srv.requests()); n != 120 {
		t.Errorf("%d requests, want 120", n)
	}
}

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		m := v.Load()
		if n <= m || v.CompareAndSwap(m, n) {
			return
		}
	}
}

// ---- destinations ----

func TestBlockedReason(t *testing.T) {
	t.Parallel()
	for _, a := range []string{
		"127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "100.64.0.1", "100.127.255.255", "0.0.0.0", "224.0.0.1", "255.255.255.255",
		"::1", "::", "fe80::1", "fe80::1%eth0", "fd00::1", "fc00::1", "ff02::1",
		"::ffff:127.0.0.1", "::ffff:10.1.2.3", "64:ff9b::a9fe:a9fe",
	} {
		if _, bad := blockedReason(netip.MustParseAddr(a)); !bad {
			t.Errorf("%s is allowed, want it refused", a)
		}
	}
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "64:ff9b::808:808"} {
		if why, bad := blockedReason(netip.MustParseAddr(a)); bad {
			t.Errorf("%s is refused as %s, want it allowed", a, why)
		}
	}
}

// Open refuses non-public destinations, by IP literal or by what the name
// resolves to, unless wharf_allow_private=true.
func TestPrivateDestinationsAtOpen(t *testing.T) {
	t.Parallel()
	for raw, addr := range map[string]string{
		"http://127.0.0.1/hook":                     "127.0.0.1",
		"http://10.0.0.1:8080/":                     "10.0.0.1",
		"http://169.254.169.254/latest/meta-data/":  "169.254.169.254",
		"https://[::1]:8443/x":                      "::1",
		"http://[::ffff:192.168.0.1]/":              "192.168.0.1",
		"http://100.64.0.1/":                        "100.64.0.1",
		"http://[fd12::1]/":                         "fd12::1",
		"http://0.0.0.0:80/":                        "0.0.0.0",
		"http://localhost:1/hook?wharf_timeout=10s": "localhost",
	} {
		u, _ := url.Parse(raw)
		s, err := Open(context.Background(), u)
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: Open succeeded, want it refused", raw)
			continue
		}
		if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "wharf_allow_private=true") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %q, want one line naming %s and wharf_allow_private=true", raw, err, addr)
		}
		sep := "?"
		if strings.Contains(raw, "?") {
			sep = "&"
		}
		u, _ = url.Parse(raw + sep + "wharf_allow_private=true")
		s, err = Open(context.Background(), u)
		if err != nil {
			t.Errorf("%s with wharf_allow_private=true: %v", raw, err)
			continue
		}
		_ = s.Close()
	}
	if _, err := New(Options{URL: "http://169.254.169.254/"}); err == nil || !strings.Contains(err.Error(), "Options.AllowPrivate") {
		t.Errorf("New to an IP literal: %v, want it refused", err)
	}
}

// The check is made on the address dialled: a name that resolves to
// loopback (as with DNS rebinding) is refused when connecting, permanently,
// and nothing reaches the server.
func TestPrivateDestinationsAtDial(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	s, err := New(Options{URL: fmt.Sprintf("http://localhost:%d/hook", port)}) // New does not resolve
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := publish(t, s, msg(1, "t", "k", "{}"), msg(2, "t", "k", "{}"))
	err = errAt(errs, 0)
	if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "wharf_allow_private=true") || !strings.Contains(err.Error(), ":"+strconv.Itoa(port)) {
		t.Fatalf("dial to localhost: %v, want a permanent error naming the address and the option", err)
	}
	if !errors.Is(errAt(errs, 1), wharf.ErrNotAttempted) {
		t.Errorf("message 2: %v, want ErrNotAttempted", errAt(errs, 1))
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}

	allowed, err := New(Options{URL: fmt.Sprintf("http://localhost:%d/hook", port), AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.Close()
	if errs := publish(t, allowed, msg(1, "t", "k", "{}")); errs != nil {
		t.Fatalf("with AllowPrivate: %v", errs)
	}
}

// Redirects are not followed: 3xx fails permanently and names where the
// destination points, without its query; the other host gets nothing.
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	other := newServer(t, nil)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		switch seqOf(r.Header) {
		case 1:
			w.Header().Set("Location", other.URL+"/elsewhere?token=s3cret")
			w.WriteHeader(http.StatusTemporaryRedirect)
		case 2:
			w.Header().Set("Location", "/moved")
			w.WriteHeader(http.StatusMovedPermanently)
		default:
			return false
		}
		return true
	})
	s := openURL(t, srv.URL+"/hook?wharf_allow_private=true")
	errs := publish(t, s, msg(1, "t", "a", "{}"), msg(2, "t", "b", "{}"), msg(3, "t", "a", "{}"))
	for i, want := range []string{"307 Temporary Redirect to \"" + other.URL + "/elsewhere?…\"", "301 Moved Permanently to \"" + srv.URL + "/moved\""} {
		err := errAt(errs, i)
		if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("message %d: %v, want a permanent error saying %s", i+1, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("message %d: %q shows the location's query", i+1, err)
		}
	}
	if !errors.Is(errAt(errs, 2), wharf.ErrNotAttempted) {
		t.Errorf("message 3: %v, want ErrNotAttempted", errAt(errs, 2))
	}
	if n := len(other.requests()); n != 0 {
		t.Errorf("the redirect target got %d requests", n)
	}
	if n := len(srv.requests()); n != 2 {
		t.Errorf("the destination got %d requests, want 2 (no redirect followed)", n)
	}
}

// ---- URLs ----

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("https://u:p%40ss@hooks.example.com/in/{{topic}}?a=1&wharf_mode=batch&wharf_batch_size=50&b=%2F&wharf_concurrency=4&wharf_timeout=3s&wharf_secret_env=HOOK_SECRET&wharf_allow_private=true&wharf_header_Authorization=Bearer%20x&WHARF_HEADER_X-Tenant=acme&c")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := urlConfig{
		opts: Options{
			URL:          "https://u:p%40ss@hooks.example.com/in/%7B%7Btopic%7D%7D?a=1&b=%2F&c",
			Mode:         ModeBatch,
			BatchSize:    50,
			Concurrency:  4,
			Timeout:      3 * time.Second,
			AllowPrivate: true,
			Headers:      map[string]string{"Authorization": "Bearer x", "X-Tenant": "acme"},
		},
		secretEnv: "HOOK_SECRET",
	}
	if fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	if cfg, err = parseURL(mustURL(t, "http://h/x?wharf_secret_file=/run/secret")); err != nil || cfg.secretFile != "/run/secret" || cfg.opts.URL != "http://h/x" {
		t.Fatalf("wharf_secret_file: %+v %v", cfg, err)
	}

	bad := map[string]string{
		"http://h/?wharf_ce=cloud":                                `wharf_ce="cloud": want binary or structured`,
		"http://h/?wharf_ce_source=/svc":                          "no content mode",
		"http://h/?wharf_ce=binary&wharf_mode=batch":              "wharf_ce=binary needs wharf_mode=single",
		"http://h/?wharf_secret=whsec_s3cret":                     "wharf_secret is not accepted, because URLs end up in logs",
		"http://h/?wharf_acks=1&t=s3cret":                         `unknown option "wharf_acks"`,
		"http://h/?wharf_mode=fast":                               "wharf_mode=\"fast\": want single or batch",
		"http://h/?wharf_batch_size=0&wharf_mode=batch":           "wharf_batch_size",
		"http://h/?wharf_batch_size=10":                           "applies to wharf_mode=batch only",
		"http://h/?wharf_concurrency=-1":                          "wharf_concurrency",
		"http://h/?wharf_timeout=soon":                            "wharf_timeout",
		"http://h/?wharf_allow_private=maybe":                     "wharf_allow_private",
		"http://h/?wharf_secret_env=A&wharf_secret_file=/b":       "keep one",
		"http://h/?wharf_secret_env=":                             "wharf_secret_env is empty",
		"http://h/?wharf_header_Bad%20Name=s3cret":                "not an HTTP token",
		"http://h/?wharf_header_X-A=s3cret%0A":                    "control character",
		"http://h/?wharf_header_Content-Length=s3cret":            "cannot be configured",
		"http://h/?wharf_header_webhook-signature=s3cret":         "cannot be configured",
		"http://h/?x={{topic}}":                                   "only replaced in the path",
		"http://u:s3cret@h/#frag":                                 "fragment",
		"ftp://h/":                                                "http:// or https://",
		"http:///path":                                            "names no host",
		"http://h/?wharf_header_Authorization=Bearer%20s3cret%zz": "the value of wharf_header_Authorization is malformed",
	}
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, bad)
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The secret comes from an environment variable or a file; errors name the
// variable or file, never the secret.
func TestOpenSecret(t *testing.T) {
	srv := newServer(t, nil)
	base := srv.URL + "/?wharf_allow_private=true&"
	t.Setenv("WHARF_TEST_HOOK_SECRET", testSecret)
	s := openURL(t, base+"wharf_secret_env=WHARF_TEST_HOOK_SECRET")
	if errs := publish(t, s, msg(1, "t", "", "{}")); errs != nil {
		t.Fatal(errs)
	}
	if err := verify(testSecret, srv.requests()[0].header, srv.requests()[0].body); err != nil {
		t.Fatal(err)
	}

	t.Setenv("WHARF_TEST_BAD_SECRET", "whsec_s3cret!!")
	bogus := filepath.Join(t.TempDir(), "bogus")
	if err := os.WriteFile(bogus, []byte("s3cret not base64"), 0o600); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{
		"wharf_secret_env=WHARF_TEST_UNSET_SECRET":           "environment variable WHARF_TEST_UNSET_SECRET (wharf_secret_env) is not set",
		"wharf_secret_env=WHARF_TEST_BAD_SECRET":             "is not a Standard Webhooks secret",
		"wharf_secret_file=" + url.QueryEscape(bogus):        "is not a Standard Webhooks secret",
		"wharf_secret_file=" + url.QueryEscape(bogus+".nah"): "no such file",
	} {
		u := mustURL(t, base+q)
		s, err := Open(context.Background(), u)
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: Open succeeded", q)
			continue
		}
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %q, want one saying %q without the secret", q, err, want)
		}
	}
}

// Close is idempotent and Publish fails after it.
func TestClose(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/?wharf_allow_private=true")
	if errs := publish(t, s, msg(1, "t", "", "{}")); errs != nil {
		t.Fatal(errs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := errAt(publish(t, s, msg(2, "t", "", "{}")), 0); err == nil {
		t.Fatal("Publish after Close succeeded")
	}
}

// ---- benchmarks ----

func benchServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkPublish is the sink's rate against a local server answering 204,
// in single and batch mode, with the default concurrency and batch size.
func BenchmarkPublish(b *testing.B) {
	for _, mode := range []Mode{ModeSingle, ModeBatch} {
		b.Run("mode="+string(mode), func(b *testing.B) {
			wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
				srv := benchServer(b)
				return openURL(b, srv.URL+"/hook/{{topic}}?wharf_allow_private=true&wharf_mode="+string(mode))
			})
		})
	}
}

// BenchmarkDirectPublish is the same workload POSTed with net/http alone, as
// an application would without the sink: up to 16 requests in flight, one
// per message in single mode and one per 100 messages (a JSON array) in
// batch mode, from 16 workers per batch, ignoring keys (the sink keeps each
// key's requests in order). It is the baseline for BenchmarkPublish.
func BenchmarkDirectPublish(b *testing.B) {
	for _, mode := range []Mode{ModeSingle, ModeBatch} {
		b.Run("mode="+string(mode), func(b *testing.B) {
			wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
				srv := benchServer(b)
				tr := &http.Transport{MaxIdleConnsPerHost: defaultConcurrency, ForceAttemptHTTP2: true}
				b.Cleanup(tr.CloseIdleConnections)
				client := &http.Client{Transport: tr}
				target := srv.URL + "/hook/" + wharfsinktest.TopicOrders
				sem := make(chan struct{}, defaultConcurrency)
				post := func(ctx context.Context, id string, body []byte) error {
					sem <- struct{}{}
					defer func() { <-sem }()
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
					if err != nil {
						return err
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("webhook-id", id)
					req.Header.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
					resp, err := client.Do(req)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					_, _ = io.Copy(io.Discard, resp.Body)
					if resp.StatusCode/100 != 2 {
						return errors.New(resp.Status)
					}
					return nil
				}
				return func(ctx context.Context, msgs []*wharf.Message) error {
					type job struct {
						id   string
						body []byte
					}
					var jobs []job
					if mode == ModeSingle {
						for _, m := range msgs {
							jobs = append(jobs, job{m.ID, m.Payload})
						}
					} else {
						for i := 0; i < len(msgs); i += defaultBatchSize {
							part := msgs[i:min(i+defaultBatchSize, len(msgs))]
							els := make([]wireElement, len(part))
							for j, m := range part {
								key := m.Key
								els[j] = wireElement{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Key: &key, Headers: map[string]string{}, Payload: json.RawMessage(strconv.Quote(string(m.Payload))), Attempt: m.Attempt}
							}
							body, err := json.Marshal(els)
							if err != nil {
								return err
							}
							jobs = append(jobs, job{part[0].ID, body})
						}
					}
					var next atomic.Int64
					var firstErr error
					var once sync.Once
					var wg sync.WaitGroup
					for range min(defaultConcurrency, len(jobs)) {
						wg.Go(func() {
							for i := next.Add(1) - 1; i < int64(len(jobs)); i = next.Add(1) - 1 {
								if err := post(ctx, jobs[i].id, jobs[i].body); err != nil {
									once.Do(func() { firstErr = err })
								}
							}
						})
					}
					wg.Wait()
					return firstErr
				}
			})
		})
	}
}
