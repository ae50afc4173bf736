package wharfmqtt

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

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/faultproxy"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// paho and autopaho stop every goroutine they start once the connection
// manager's context ends and Disconnect returned.
func TestMain(m *testing.M) {
	testtool.ExamplesNeed("mosquitto", "127.0.0.1:1883", startHint, "ExampleNew")
	leakcheck.Main(m)
}

const (
	defaultAddr    = "127.0.0.1:1883"
	startHint      = "start it with: mosquitto -d -c /etc/mosquitto/mosquitto.conf (apt-get install mosquitto), or point WHARF_TEST_MQTT_ADDR at one"
	testAckTimeout = 3 * time.Second
	adminTimeout   = 30 * time.Second
	serverStart    = 10 * time.Second
	testMaxPayload = 1 << 20
)

// sharedAddr is the MQTT server the tests use, host:port.
func sharedAddr() string {
	if a := os.Getenv("WHARF_TEST_MQTT_ADDR"); a != "" {
		return a
	}
	return defaultAddr
}

// requireServer fails the test under CI=true, and skips it otherwise, when
// nothing listens at addr.
func requireServer(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		testtool.Missing(t, "mosquitto", fmt.Sprintf("no MQTT server at %s (%v): %s", addr, err, startHint))
		return
	}
	_ = c.Close()
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// received is one PUBLISH as a subscriber got it.
type received struct {
	topic       string
	contentType string
	props       map[string]string
	payload     []byte
}

// subscriber reads "<prefix>/#" with QoS 1 from the server at addr, again
// after every reconnection, into got.
type subscriber struct {
	prefix     string
	cm         *autopaho.ConnectionManager
	subscribed chan struct{} // a value after each successful SUBSCRIBE

	mu  sync.Mutex
	got []received
}

func newSubscriber(t testing.TB, addr, prefix string) *subscriber {
	t.Helper()
	sub := &subscriber{prefix: prefix, subscribed: make(chan struct{}, 16)}
	u := &url.URL{Scheme: "mqtt", Host: addr}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		ConnectTimeout:                5 * time.Second,
		ReconnectBackoff:              func(int) time.Duration { return 100 * time.Millisecond },
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				sctx, scancel := context.WithTimeout(ctx, adminTimeout)
				defer scancel()
				if _, err := cm.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: prefix + "/#", QoS: 1}}}); err == nil {
					sub.subscribed <- struct{}{}
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "wharftest-sub-" + randomID(),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				r := received{topic: pr.Packet.Topic, payload: pr.Packet.Payload, props: map[string]string{}}
				if p := pr.Packet.Properties; p != nil {
					r.contentType = p.ContentType
					for _, up := range p.User {
						r.props[up.Key] = up.Value
					}
				}
				sub.mu.Lock()
				sub.got = append(sub.got, r)
				sub.mu.Unlock()
				return true, nil
			}},
		},
	}
	cm, err := autopaho.NewConnection(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	sub.cm = cm
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = cm.Disconnect(dctx)
		dcancel()
		cancel()
		<-cm.Done()
	})
	sub.awaitSubscribed(t)
	return sub
}

// awaitSubscribed waits for the next successful SUBSCRIBE.
func (sub *subscriber) awaitSubscribed(t testing.TB) {
	t.Helper()
	select {
	case <-sub.subscribed:
	case <-time.After(adminTimeout):
		t.Fatalf("the subscriber to %s/# did not subscribe within %s", sub.prefix, adminTimeout)
	}
}

// wait returns what the subscriber got so far once it holds at least want
// PUBLISHes, or when timeout passed.
func (sub *subscriber) wait(want int, timeout time.Duration) []received {
	deadline := time.Now().Add(timeout)
	for {
		sub.mu.Lock()
		got := append([]received(nil), sub.got...)
		sub.mu.Unlock()
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// world is one test's destination: a topic prefix of its own and a
// subscriber to it, on the shared server or a private one.
type world struct {
	addr   string
	prefix string
	sub    *subscriber
	server *privateServer // for the broker-outage case only
}

func newWorld(t testing.TB, addr string) *world {
	t.Helper()
	requireServer(t, addr)
	w := &world{addr: addr, prefix: "wharftest/" + randomID()}
	w.sub = newSubscriber(t, addr, w.prefix)
	return w
}

// openSink opens a sink publishing under w's prefix through Open, as the
// CLI does, with the extra URL options.
func (w *world) openSink(t testing.TB, extra ...string) *Sink {
	t.Helper()
	raw := "mqtt://" + w.addr + "?topic_template=" + url.QueryEscape(w.prefix+"/"+TopicPlaceholder) + "&ack_timeout=" + testAckTimeout.String()
	for _, e := range extra {
		raw += "&" + e
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
	return s.(*Sink)
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	w := newWorld(t, sharedAddr())
	h.worlds.Set(t, w)
	return w.openSink(t, fmt.Sprintf("max_payload=%d", testMaxPayload))
}

// newBreakableSink runs a private mosquitto for the test, so that breaking
// it leaves the shared one alone.
func (h *harness) newBreakableSink(t *testing.T) wharf.Sink {
	srv := startPrivateServer(t)
	w := newWorld(t, srv.addr())
	w.server = srv
	h.worlds.Set(t, w)
	return w.openSink(t, fmt.Sprintf("max_payload=%d", testMaxPayload))
}

// heal restarts the private server and waits until the subscriber is
// subscribed again: messages published before would reach no one.
func (h *harness) heal(t *testing.T) {
	w := h.worlds.Get(t)
	for len(w.sub.subscribed) > 0 {
		<-w.sub.subscribed
	}
	w.server.start(t)
	w.sub.awaitSubscribed(t)
}

func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	t.Helper()
	w := h.worlds.Get(t)
	wanted := map[string]bool{}
	for _, tp := range topics {
		wanted[tp] = true
	}
	var out []wharfsinktest.Received
	for _, r := range w.sub.wait(want, timeout) {
		tp := strings.TrimPrefix(r.topic, w.prefix+"/")
		if !wanted[tp] {
			continue
		}
		rc := wharfsinktest.Received{Topic: tp, Payload: r.payload}
		for k, v := range r.props {
			switch k {
			case PropertyMessageID:
				rc.ID = v
			case PropertyKey:
				rc.Key = v
			default:
				if rc.Headers == nil {
					rc.Headers = map[string]string{}
				}
				rc.Headers[k] = v
			}
		}
		out = append(out, rc)
	}
	return out
}

func TestConformance(t *testing.T) {
	requireServer(t, sharedAddr())
	h := &harness{}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          h.newSink,
		NewBreakableSink: h.newBreakableSink,
		Consume:          h.consume,
		BreakBroker:      func(t *testing.T) { h.worlds.Get(t).server.stop(t) },
		HealBroker:       h.heal,
		Features: wharfsinktest.Features{
			// Mosquitto takes packets up to 256 MiB by default; the sink's
			// own max_payload is the limit checked.
			MaxPayload:      testMaxPayload,
			SupportsHeaders: true,
		},
	})
}

// privateServer is a mosquitto of one test, restartable on the same port.
type privateServer struct {
	bin    string
	port   int
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func startPrivateServer(t *testing.T) *privateServer {
	t.Helper()
	bin := testtool.Path(t, "mosquitto", "the broker-outage case runs a private server: apt-get install mosquitto", "/usr/sbin/mosquitto")
	s := &privateServer{bin: bin}
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
		t.Logf("private mosquitto: %v; trying another port", err)
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
	// Without a configuration file mosquitto listens on the loopback only
	// and lets anonymous clients in.
	cmd := exec.Command(s.bin, "-p", strconv.Itoa(s.port))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mosquitto: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(serverStart)
	for {
		select {
		case <-exited:
			return fmt.Errorf("mosquitto on port %d exited at start (port taken?)", s.port)
		default:
		}
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err == nil {
			_ = c.Close()
			s.cmd, s.exited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("mosquitto on port %d did not get ready: %w", s.port, err)
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

func publish(t *testing.T, s wharf.Sink, msgs ...*wharf.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

func msg(seq int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(seq, 7), Seq: seq, Topic: topic, Key: key, Payload: []byte(payload)}
}

// What the server would refuse, or close the connection on, fails
// permanently before sending, and the later messages of its key are not
// attempted; the other keys go out.
func TestPreSendFailuresArePermanent(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sharedAddr())
	s := w.openSink(t, "max_payload=100")
	bad := []*wharf.Message{
		msg(1, "a+b", "k1", "x"),
		msg(2, "a#", "k2", "x"),
		msg(3, "t", "k3", strings.Repeat("x", 101)),
		msg(4, "t", "k4\x00", "x"),
		msg(5, "t\xff", "k5", "x"),
	}
	hdr := msg(6, "t", "k6", "x")
	hdr.Headers = map[string]string{"a\nb": "v"}
	bad = append(bad, hdr)
	var msgs []*wharf.Message
	for i, b := range bad {
		msgs = append(msgs, b, msg(int64(100+i), b.Topic, b.Key, "later"))
	}
	good := msg(200, "t", "other", "fine")
	msgs = append(msgs, good)
	errs := publish(t, s, msgs...)
	for i := range bad {
		if err := errs[2*i]; !wharf.IsPermanent(err) {
			t.Errorf("message %d: %v, want a permanent failure", 2*i, err)
		}
		if err := errs[2*i+1]; !errors.Is(err, wharf.ErrNotAttempted) {
			t.Errorf("message %d (later of the same key): %v, want not attempted", 2*i+1, err)
		}
	}
	if errs[len(msgs)-1] != nil {
		t.Errorf("the other key's message failed: %v", errs[len(msgs)-1])
	}
	got := w.sub.wait(1, adminTimeout)
	if len(got) != 1 || string(got[0].payload) != "fine" {
		t.Errorf("the subscriber got %d messages (%v), want only the good one", len(got), got)
	}
}

// A "$" topic is the server's own: refused at Open for a template that gives
// only such topics.
func TestSystemTopicTemplateIsRefused(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("mqtt://127.0.0.1:1?topic_template=$SYS/{{topic}}")
	if _, err := Open(context.Background(), u); err == nil || !strings.Contains(err.Error(), "server's own") {
		t.Fatalf("Open with a $SYS template: %v, want a refusal", err)
	}
}

// With require_subscribers=true a message no subscription matched fails for
// the relay to retry; without it, it is acknowledged (the server drops it).
func TestRequireSubscribers(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sharedAddr())
	strict := w.openSink(t, "topic_template=wharftest/"+randomID()+"/nobody/{{topic}}", "require_subscribers=true")
	errs := publish(t, strict, msg(1, "t", "k", "x"))
	if errs == nil || wharf.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "0x10") {
		t.Fatalf("require_subscribers=true with no subscriber: %v, want a retryable failure naming reason 0x10", errs)
	}
	lax := w.openSink(t, "topic_template=wharftest/"+randomID()+"/nobody/{{topic}}")
	if errs := publish(t, lax, msg(2, "t", "k", "x")); errs != nil {
		t.Fatalf("without require_subscribers: %v, want it acknowledged", errs)
	}
}

// Open fails at once, saying why, when nothing answers.
func TestOpenFailsWithoutServer(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("mqtt://127.0.0.1:" + strconv.Itoa(freePort(t)))
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	s, err := Open(ctx, u)
	if err == nil {
		_ = s.Close()
		t.Fatal("Open with no server succeeded")
	}
	if !strings.Contains(err.Error(), "cannot connect") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open with no server: %q, want one line saying it cannot connect", err)
	}
}

// Ping answers while connected and fails once the sink is closed.
func TestPing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sharedAddr())
	s := w.openSink(t)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	_ = s.Close()
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping after Close succeeded")
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("mqtts://u:p%40ss@mq?topic_template=wharf/%7B%7Btopic%7D%7D&client_id=relay-1&session_expiry=2h&ack_timeout=5s&max_in_flight=10&max_payload=1000&require_subscribers=true&ce=binary&ce_source=/svc")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{
		Servers:       []*url.URL{{Scheme: "mqtts", Host: "mq:8883"}},
		ClientID:      "relay-1",
		Username:      "u",
		Password:      "p@ss",
		TopicTemplate: "wharf/{{topic}}",
		SessionExpiry: 2 * time.Hour, AckTimeout: 5 * time.Second, MaxInFlight: 10, MaxPayload: 1000,
		RequireSubscribers: true, CloudEvents: "binary", CloudEventsSource: "/svc",
	}
	if fmt.Sprint(cfg.opts) != fmt.Sprint(want) {
		t.Errorf("got %+v\nwant %+v", cfg.opts, want)
	}
	bad := map[string]string{
		"mqtt://u:s3cret@mq?qos=2":                 `unknown option "qos"`,
		"mqtt://u:s3cret@":                         "names no host",
		"mqtt://mq/path":                           "write mqtt://",
		"mqtt://mq:99999":                          "not a port number",
		"mqtt://mq?session_expiry=1500ms":          "whole seconds",
		"mqtt://mq?ack_timeout=soon":               "ack_timeout=",
		"mqtt://mq?max_in_flight=0":                "max_in_flight=",
		"mqtt://mq?max_payload=300000000":          "max_payload=",
		"mqtt://mq?require_subscribers=maybe":      "require_subscribers=",
		"mqtt://mq?topic_template=a/%2B/{{topic}}": "wildcards",
		"mqtt://mq?topic_template=$SYS/{{topic}}":  "server's own",
		"mqtt://mq?tls_ca=/x.pem":                  "use mqtts://",
		"mqtt://mq?ce=yes":                         `ce="yes": want binary or structured`,
		"mqtt://mq?ce_source=/svc":                 "no content mode",
	}
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, bad)
}

// A message is acknowledged only on its PUBACK: with the link stalled (the
// PUBLISH and any answer held in the network) Publish fails, retryably,
// within ack_timeout; once the link is back the relay's retry is
// acknowledged and the subscriber has the message.
func TestNoAckWithoutPuback(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sharedAddr())
	p, err := faultproxy.New(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	via := &world{addr: p.Addr(), prefix: w.prefix}
	s := via.openSink(t)
	if errs := publish(t, s, msg(1, "t", "k", "before")); errs != nil {
		t.Fatalf("before the stall: %v", errs)
	}
	p.Stall()
	m := msg(2, "t", "k", "during")
	start := time.Now()
	errs := publish(t, s, m)
	if errs == nil || wharf.IsPermanent(errs[0]) {
		t.Fatalf("with no PUBACK coming: %v, want a retryable failure", errs)
	}
	if took := time.Since(start); took > testAckTimeout+10*time.Second {
		t.Fatalf("Publish took %s with no PUBACK and ack_timeout %s", took, testAckTimeout)
	}
	t.Logf("stalled: %v", errs[0])
	p.Resume()
	deadline := time.Now().Add(adminTimeout)
	for {
		if errs = publish(t, s, m); errs == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the stall the retry still fails: %v", errs[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	found := false
	for _, r := range w.sub.wait(2, adminTimeout) {
		found = found || r.props[PropertyMessageID] == m.ID
	}
	if !found {
		t.Fatal("the subscriber never got the acknowledged message")
	}
}

// The session is persistent: after the connection drops, the client
// reconnects by itself to the session the server kept (CONNACK Session
// Present), and publishes go through again.
func TestSessionSurvivesReconnection(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sharedAddr())
	p, err := faultproxy.New(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	via := &world{addr: p.Addr(), prefix: w.prefix}
	s := via.openSink(t)
	if s.sessionPresent.Load() {
		t.Fatal("the first connection found a session: the client identifier is not new")
	}
	if errs := publish(t, s, msg(1, "t", "k", "before")); errs != nil {
		t.Fatalf("before the drop: %v", errs)
	}
	p.Reset()
	deadline := time.Now().Add(adminTimeout)
	for s.connects.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the client did not reconnect after the connection dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !s.sessionPresent.Load() {
		t.Fatal("after the reconnection the server had no session: Clean Start or the Session Expiry Interval is wrong")
	}
	for {
		if errs := publish(t, s, msg(2, "t", "k", "after")); errs == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after the reconnection: %v", errs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := w.sub.wait(2, adminTimeout)
	if len(got) < 2 || string(got[len(got)-1].payload) != "after" {
		t.Fatalf("the subscriber got %v", got)
	}
}
