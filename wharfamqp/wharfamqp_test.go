package wharfamqp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// amqp091-go stops every goroutine it starts when its connection closes, and
// the sink waits for its own in Close.
func TestMain(m *testing.M) {
	testtool.ExamplesNeed("rabbitmq-server", "127.0.0.1:5672", startHint, "ExampleNew")
	leakcheck.Main(m)
}

const (
	startHint         = "start it with: rabbitmq-server -detached (guest/guest on 127.0.0.1:5672), or point WHARF_TEST_AMQP_URL at one"
	testConfirm       = 5 * time.Second
	testMaxMessage    = 2 << 20 // the sink's max_message_size in the tests
	adminTimeout      = 10 * time.Second
	queueExpiresMilli = 3600000 // queues outlive a crashed test by an hour at most
)

// brokerURL is WHARF_TEST_AMQP_URL, or the local RabbitMQ.
func brokerURL() string {
	if u := os.Getenv("WHARF_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// requireBroker connects to the broker or, when it does not answer, fails
// the test under CI=true and skips it otherwise.
func requireBroker(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err == nil {
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	testtool.Missing(t, "rabbitmq-server", fmt.Sprintf("no RabbitMQ at %s (%v): %s", redacted(brokerURL()), err, startHint))
	return nil
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// withHost returns the broker URL with another host:port.
func withHost(t testing.TB, hostport string) string {
	t.Helper()
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

// sinkURL is the broker URL (or base) with the options.
func sinkURL(base string, options ...string) string {
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + strings.Join(options, "&")
}

func openSink(t testing.TB, raw string) *Sink {
	t.Helper()
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

// world is one test's destination: a direct exchange of its own, with a
// queue per wharf topic bound to routing key "<id>.<topic>", read by a
// consumer from the start.
type world struct {
	id       string
	exchange string
	queues   map[string]string // wharf topic -> queue
	proxy    *proxy            // for the broker-outage cases only

	mu  sync.Mutex
	got map[string][]wharfsinktest.Received // by wharf topic, in queue order
}

// newWorld declares the exchange and queues on the broker, removed at
// cleanup, and starts consuming them.
func newWorld(t testing.TB) *world {
	t.Helper()
	admin := requireBroker(t)
	w := &world{id: randomID(), queues: map[string]string{}, got: map[string][]wharfsinktest.Received{}}
	w.exchange = "wharftest." + w.id
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(w.exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", w.exchange, err)
	}
	for _, topic := range wharfsinktest.Topics() {
		q := w.exchange + "." + topic
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int64(queueExpiresMilli)}); err != nil {
			t.Fatalf("declare queue %s: %v", q, err)
		}
		if err := ch.QueueBind(q, w.id+"."+topic, w.exchange, false, nil); err != nil {
			t.Fatalf("bind queue %s: %v", q, err)
		}
		w.queues[topic] = q
	}
	t.Cleanup(func() {
		ch, err := admin.Channel()
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer ch.Close()
		for _, q := range w.queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Logf("delete queue %s: %v", q, err)
			}
		}
		if err := ch.ExchangeDelete(w.exchange, false, false); err != nil {
			t.Logf("delete exchange %s: %v", w.exchange, err)
		}
	})
	_ = ch.Close()
	w.consume(t)
	return w
}

// options are the sink URL options that publish into w.
func (w *world) options() []string {
	return []string{
		"exchange=" + w.exchange,
		"routing_key_template=" + w.id + "." + url.QueryEscape(TopicPlaceholder),
		"confirm_timeout=" + testConfirm.String(),
		fmt.Sprintf("max_message_size=%d", testMaxMessage),
	}
}

// consume reads every queue of w into w.got on a connection of its own,
// closed at cleanup.
func (w *world) consume(t testing.TB) {
	t.Helper()
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = conn.Close()
		wg.Wait()
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for topic, q := range w.queues {
		deliveries, err := ch.Consume(q, "", true, true, false, false, nil)
		if err != nil {
			t.Fatalf("consume %s: %v", q, err)
		}
		wg.Go(func() {
			for d := range deliveries {
				r := decode(topic, d)
				w.mu.Lock()
				w.got[topic] = append(w.got[topic], r)
				w.mu.Unlock()
			}
		})
	}
}

// decode turns a delivery back into what the sink was given.
func decode(topic string, d amqp.Delivery) wharfsinktest.Received {
	r := wharfsinktest.Received{ID: d.MessageId, Topic: topic, Payload: d.Body}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		if k == HeaderKey {
			r.Key = s
			continue
		}
		if r.Headers == nil {
			r.Headers = map[string]string{}
		}
		r.Headers[k] = s
	}
	return r
}

// received returns what w's queues of topics delivered so far, waiting up
// to timeout for at least want messages.
func (w *world) received(topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		var got []wharfsinktest.Received
		for _, tp := range topics {
			got = append(got, w.got[tp]...)
		}
		w.mu.Unlock()
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
	extra  []string // URL options of every sink, e.g. "strict_order=true"
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	w := newWorld(t)
	h.worlds.Set(t, w)
	return openSink(t, sinkURL(brokerURL(), append(w.options(), h.extra...)...))
}

// newBreakableSink publishes through a proxy of the test's own, so that
// breaking it leaves the shared broker alone.
func (h *harness) newBreakableSink(t *testing.T) wharf.Sink {
	w := newWorld(t)
	w.proxy = startProxy(t)
	h.worlds.Set(t, w)
	return openSink(t, sinkURL(withHost(t, w.proxy.addr), append(w.options(), h.extra...)...))
}

// TestConformance runs the sink suite in both ordering modes.
func TestConformance(t *testing.T) {
	requireBroker(t)
	t.Run("pipelined", func(t *testing.T) { runConformance(t) })
	t.Run("strict_order", func(t *testing.T) { runConformance(t, "strict_order=true") })
}

func runConformance(t *testing.T, extra ...string) {
	h := &harness{extra: extra}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          h.newSink,
		NewBreakableSink: h.newBreakableSink,
		Consume: func(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
			return h.worlds.Get(t).received(topics, want, timeout)
		},
		BreakBroker: func(t *testing.T) { h.worlds.Get(t).proxy.breakAll(t) },
		HealBroker:  func(t *testing.T) { h.worlds.Get(t).proxy.heal(t) },
		Features: wharfsinktest.Features{
			MaxPayload:      testMaxMessage,
			SupportsHeaders: true,
		},
	})
}

// ---- proxy ----

// proxy is a TCP proxy to the broker that a test can break (close every
// connection and refuse new ones), heal on the same port, and pause: stop
// reading what clients send, as RabbitMQ does when it blocks publishers,
// optionally telling them with connection.blocked.
type proxy struct {
	target string
	addr   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[*proxyConn]struct{}
	resume chan struct{} // nil while running; closed on resume
	wg     sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	wmu            sync.Mutex // whole frames to the client
}

func startProxy(t testing.TB) *proxy {
	t.Helper()
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{target: target, addr: ln.Addr().String(), conns: map[*proxyConn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			pc := &proxyConn{client: c, server: s}
			p.mu.Lock()
			p.conns[pc] = struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() { p.upstream(pc) })
			p.wg.Go(func() { p.downstream(pc) })
		}
	})
}

func (p *proxy) drop(pc *proxyConn) {
	_ = pc.client.Close()
	_ = pc.server.Close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// upstream copies client to broker, except while paused.
func (p *proxy) upstream(pc *proxyConn) {
	defer p.drop(pc)
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		// A paused proxy holds what it read, like a broker that stopped
		// reading its socket.
		p.mu.Lock()
		resume := p.resume
		p.mu.Unlock()
		if resume != nil {
			<-resume
		}
		if n > 0 {
			if _, werr := pc.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// downstream copies broker to client frame by frame, so that frames can be
// injected between them.
func (p *proxy) downstream(pc *proxyConn) {
	defer p.drop(pc)
	for {
		var hdr [7]byte
		if _, err := io.ReadFull(pc.server, hdr[:]); err != nil {
			return
		}
		frame := make([]byte, 7+int(binary.BigEndian.Uint32(hdr[3:]))+1)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(pc.server, frame[7:]); err != nil {
			return
		}
		pc.wmu.Lock()
		_, err := pc.client.Write(frame)
		pc.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// methodFrame is an AMQP method frame on channel 0.
func methodFrame(class, method uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, class)
	payload = binary.BigEndian.AppendUint16(payload, method)
	payload = append(payload, args...)
	f := []byte{1, 0, 0}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	f = append(f, payload...)
	return append(f, 0xCE)
}

func (p *proxy) inject(frame []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.wmu.Lock()
		_, _ = pc.client.Write(frame)
		pc.wmu.Unlock()
	}
}

// pause stops forwarding what clients send; with reason, it also tells them
// with connection.blocked, as a RabbitMQ resource alarm does.
func (p *proxy) pause(reason string) {
	p.mu.Lock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
	p.mu.Unlock()
	if reason != "" {
		p.inject(methodFrame(10, 60, append([]byte{byte(len(reason))}, reason...)))
	}
}

// unpause resumes forwarding, telling clients with connection.unblocked.
func (p *proxy) unpause(unblock bool) {
	if unblock {
		p.inject(methodFrame(10, 61, nil))
	}
	p.mu.Lock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
	p.mu.Unlock()
}

// killConns closes every live connection; new ones are accepted.
func (p *proxy) killConns() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		p.drop(pc)
	}
}

// breakAll closes every connection and refuses new ones.
func (p *proxy) breakAll(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.killConns()
}

// heal listens again on the same port.
func (p *proxy) heal(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

func (p *proxy) close() {
	p.unpause(false)
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.killConns()
	p.wg.Wait()
}

// ---- specific cases ----

var nextID = time.Now().UnixNano()

var idMu sync.Mutex

func msg(topic, key string, payload []byte) *wharf.Message {
	idMu.Lock()
	defer idMu.Unlock()
	nextID++
	return &wharf.Message{ID: wharf.FormatID(nextID, 1), Seq: nextID, Topic: topic, Key: key, Payload: payload, Attempt: 1}
}

func publish(t *testing.T, s wharf.Sink, msgs []*wharf.Message) ([]error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(errs), len(msgs))
	}
	if errs == nil {
		errs = make([]error, len(msgs))
	}
	return errs, time.Since(start)
}

func requireAcked(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

func requireRetryable(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || wharf.IsPermanent(err) || errors.Is(err, wharf.ErrNotAttempted) {
		t.Fatalf("%s: %v, want a retryable error", what, err)
	}
}

// requireNotAcked accepts a retryable error or ErrNotAttempted.
func requireNotAcked(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || wharf.IsPermanent(err) {
		t.Fatalf("%s: %v, want a retryable error or ErrNotAttempted", what, err)
	}
}

// An unroutable message (no queue bound for its routing key) comes back with
// basic.return and fails, retryably, while the others of the batch are
// acknowledged; with mandatory=false the broker drops it and it is
// acknowledged.
func TestUnroutableIsRetryable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := openSink(t, sinkURL(brokerURL(), w.options()...))
	msgs := []*wharf.Message{
		msg(wharfsinktest.TopicOrders, "a", []byte("1")),
		msg("nowhere", "b", []byte("2")),
		msg(wharfsinktest.TopicOrders, "a", []byte("3")),
		msg("nowhere", "", []byte("4")),
		msg(wharfsinktest.TopicOrders, "", []byte("5")),
	}
	errs, _ := publish(t, s, msgs)
	for _, i := range []int{0, 2, 4} {
		if errs[i] != nil {
			t.Fatalf("routable message %d: %v", i, errs[i])
		}
	}
	for _, i := range []int{1, 3} {
		requireRetryable(t, fmt.Sprintf("unroutable message %d", i), errs[i])
		if !strings.Contains(errs[i].Error(), "NO_ROUTE") || !strings.Contains(errs[i].Error(), w.id+".nowhere") {
			t.Fatalf("unroutable message %d: %v: want the reply text and routing key", i, errs[i])
		}
	}
	got := w.received([]string{wharfsinktest.TopicOrders}, 3, 5*time.Second)
	if len(got) != 3 {
		t.Fatalf("the orders queue holds %d messages, want 3", len(got))
	}

	drop := openSink(t, sinkURL(brokerURL(), append(w.options(), "mandatory=false")...))
	errs, _ = publish(t, drop, []*wharf.Message{msg("nowhere", "b", []byte("x"))})
	requireAcked(t, errs)
}

// What AMQP cannot carry fails permanently before sending, and the later
// messages of its ordering key (topic and key) are not attempted, while the
// earlier ones and other keys go out.
func TestInvalidIsPermanent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := openSink(t, sinkURL(brokerURL(), w.options()...))
	long := strings.Repeat("t", 300)
	msgs := []*wharf.Message{
		msg(long, "a", []byte("routing key too long")),
		msg(long, "a", []byte("behind it")),
		msg(wharfsinktest.TopicOrders, "b", []byte("other key")),
		msg(wharfsinktest.TopicOrders, "c", []byte("header name too long")),
		msg(wharfsinktest.TopicOrders, "d", []byte("headers over a frame")),
		msg(wharfsinktest.TopicOrders, "e", []byte("content-type too long")),
		msg(wharfsinktest.TopicOrders, "c", []byte("behind the header")),
		msg(wharfsinktest.TopicOrders, "", make([]byte, testMaxMessage+1)),
		msg(wharfsinktest.TopicOrders, "g", []byte("ahead of an invalid one")),
		msg(wharfsinktest.TopicOrders, "g", []byte("header name too long")),
		msg(wharfsinktest.TopicOrders, "g", []byte("behind it")),
	}
	msgs[3].Headers = map[string]string{long: "v"}
	msgs[9].Headers = map[string]string{long: "v"}
	msgs[4].Headers = map[string]string{"big": strings.Repeat("x", 200<<10)}
	msgs[5].Headers = map[string]string{"content-type": long}
	errs, _ := publish(t, s, msgs)
	for _, i := range []int{0, 3, 4, 5, 7, 9} {
		if !wharf.IsPermanent(errs[i]) {
			t.Fatalf("message %d: %v, want a permanent error", i, errs[i])
		}
	}
	if !strings.Contains(errs[0].Error(), "routing key") {
		t.Fatalf("message 0: %v: want it to name the routing key", errs[0])
	}
	for _, i := range []int{1, 6, 10} {
		if !errors.Is(errs[i], wharf.ErrNotAttempted) {
			t.Fatalf("message %d: %v, want ErrNotAttempted", i, errs[i])
		}
	}
	if errs[2] != nil || errs[8] != nil {
		t.Fatalf("messages 2 and 8: %v, %v", errs[2], errs[8])
	}
	got := w.received([]string{wharfsinktest.TopicOrders}, 3, time.Second)
	if len(got) != 2 || got[0].ID != msgs[2].ID || got[1].ID != msgs[8].ID {
		t.Fatalf("the queue holds %v, want only messages 2 and 8", got)
	}
}

// A missing exchange closes the channel (404 NOT_FOUND): the messages fail
// retryably, and once it exists they go out.
func TestMissingExchangeIsRetryable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := openSink(t, sinkURL(brokerURL(),
		"exchange="+w.exchange+".missing."+url.QueryEscape(TopicPlaceholder),
		"routing_key_template="+w.id+"."+url.QueryEscape(TopicPlaceholder),
		"confirm_timeout="+testConfirm.String()))
	msgs := []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("1")), msg(wharfsinktest.TopicOrders, "k", []byte("2"))}
	errs, _ := publish(t, s, msgs)
	for i, err := range errs {
		requireRetryable(t, fmt.Sprintf("message %d", i), err)
	}
	if !strings.Contains(errs[0].Error(), "NOT_FOUND") {
		t.Fatalf("message 0: %v: want the broker's NOT_FOUND", errs[0])
	}
	admin := requireBroker(t)
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	missing := w.exchange + ".missing." + wharfsinktest.TopicOrders
	if err := ch.ExchangeDeclare(missing, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.ExchangeDelete(missing, false, false) }()
	if err := ch.ExchangeBind(w.exchange, "", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	// The fanout exchange forwards every message to w's direct exchange,
	// which routes it by key.
	errs, _ = publish(t, s, msgs)
	requireAcked(t, errs)
	if got := w.received([]string{wharfsinktest.TopicOrders}, 2, 5*time.Second); len(got) != 2 {
		t.Fatalf("the queue holds %d messages, want 2", len(got))
	}
}

// A connection that drops in the middle of a batch fails what was not
// confirmed, retryably, without a hang; a later Publish redials; every
// acknowledged message is in the queue.
func TestConnectionLostMidBatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := startProxy(t)
	s := openSink(t, sinkURL(withHost(t, p.addr), w.options()...))
	var msgs []*wharf.Message
	for i := range 3000 {
		msgs = append(msgs, msg(wharfsinktest.TopicOrders, fmt.Sprintf("k%d", i%10), bytes.Repeat([]byte("x"), 1000)))
	}
	done := make(chan []error)
	go func() {
		errs := s.Publish(context.Background(), msgs)
		if errs == nil {
			errs = make([]error, len(msgs))
		}
		done <- errs
	}()
	time.Sleep(20 * time.Millisecond)
	p.killConns()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(testConfirm + 5*time.Second):
		t.Fatal("Publish hangs after the connection dropped")
	}
	acked := map[string]bool{}
	var retry []*wharf.Message
	for i, err := range errs {
		if err == nil {
			acked[msgs[i].ID] = true
			continue
		}
		if wharf.IsPermanent(err) {
			t.Fatalf("message %d failed permanently: %v", i, err)
		}
		retry = append(retry, msgs[i])
	}
	t.Logf("%d acknowledged before the drop, %d failed: %v", len(acked), len(retry), firstErr(errs))
	deadline := time.Now().Add(15 * time.Second)
	for len(retry) > 0 {
		errs, _ := publish(t, s, retry)
		var again []*wharf.Message
		for i, err := range errs {
			if err == nil {
				acked[retry[i].ID] = true
			} else {
				again = append(again, retry[i])
			}
		}
		retry = again
		if len(retry) > 0 && time.Now().After(deadline) {
			t.Fatalf("the retried batch still fails: %v", firstErr(errs))
		}
	}
	// The queue may hold duplicates: wait for every acknowledged id.
	deadline = time.Now().Add(10 * time.Second)
	for {
		seen := map[string]bool{}
		for _, r := range w.received([]string{wharfsinktest.TopicOrders}, 0, 0) {
			seen[r.ID] = true
		}
		missing := ""
		for id := range acked {
			if !seen[id] {
				missing = id
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s was acknowledged but is not in the queue", missing)
		}
		time.Sleep(50 * time.Millisecond)
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

// A connection the broker closes (rabbitmqctl close_connection) fails the
// next Publish at most, and a later one redials.
func TestBrokerClosesConnection(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	name := "wharftest-close-" + w.id
	s := openSink(t, sinkURL(brokerURL(), append(w.options(), "name="+name)...))
	errs, _ := publish(t, s, []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("before"))})
	requireAcked(t, errs)
	ctl := testtool.Path(t, "rabbitmqctl", "cannot make the broker close the connection: apt-get install rabbitmq-server")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, ctl, "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Skipf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	pid := ""
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, name) {
			pid, _, _ = strings.Cut(line, "\t")
		}
	}
	if pid == "" {
		t.Skipf("rabbitmqctl does not list connection %s (a broker on another host?)", name)
	}
	if out, err := exec.CommandContext(ctx, ctl, "-q", "close_connection", pid, "wharf test").CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl close_connection: %v: %s", err, out)
	}
	var failures int
	deadline := time.Now().Add(15 * time.Second)
	for {
		errs, took := publish(t, s, []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("after"))})
		if took > testConfirm+2*time.Second {
			t.Fatalf("Publish took %s after the broker closed the connection", took)
		}
		if errs[0] == nil {
			break
		}
		requireRetryable(t, "after close_connection", errs[0])
		t.Logf("after close_connection: %v", errs[0])
		if failures++; time.Now().After(deadline) {
			t.Fatalf("Publish still fails %d times after the broker closed the connection: %v", failures, errs[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if failures > 1 {
		t.Fatalf("%d Publish calls failed after the broker closed the connection: want one at most", failures)
	}
}

// waitBlocked waits until the sink saw connection.blocked.
func waitBlocked(t *testing.T, s *Sink, want bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		cn := s.conn
		s.mu.Unlock()
		if cn != nil {
			if reason, _ := cn.blockedState(); (reason != "") == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sink did not see the connection blocked=%v", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// While the broker blocks the connection (a resource alarm), Publish sends
// nothing and fails retryably after confirm_timeout, or at once when ctx
// ends; once unblocked, publishing resumes.
func TestBlockedConnection(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := startProxy(t)
	s := openSink(t, sinkURL(withHost(t, p.addr), append(w.options()[:2], "confirm_timeout=1s")...))
	errs, _ := publish(t, s, []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("warm-up"))})
	requireAcked(t, errs)

	p.pause("low on memory")
	waitBlocked(t, s, true)
	msgs := []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("1")), msg(wharfsinktest.TopicOrders, "j", []byte("2"))}
	errs, took := publish(t, s, msgs)
	if took > 30*time.Second { // a hang guard: the errors name the alarm
		t.Fatalf("Publish took %s on a blocked connection with confirm_timeout=1s", took)
	}
	for i, err := range errs {
		requireRetryable(t, fmt.Sprintf("blocked, message %d", i), err)
		if !strings.Contains(err.Error(), "low on memory") {
			t.Fatalf("blocked, message %d: %v: want the alarm named", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	errs = s.Publish(ctx, msgs)
	cancel()
	// A hang guard: the error below says the context, not the confirm
	// timeout, ended the wait.
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Publish took %s on a blocked connection with a 100ms context", took)
	}
	if len(errs) != 2 || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("blocked, ctx ended: %v, want the context's error", errs)
	}

	p.unpause(true)
	waitBlocked(t, s, false)
	errs, _ = publish(t, s, msgs)
	requireAcked(t, errs)
}

// A broker that stops reading without saying why: the confirms do not come
// and Publish fails retryably after confirm_timeout; a write that cannot go
// out closes the connection after confirm_timeout, or when ctx ends; once the
// broker reads again, publishing resumes.
func TestStalledBroker(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := startProxy(t)
	// One sink per case, each warmed up (connected, a channel open) while
	// the broker still reads.
	newSink := func(confirmTimeout string) *Sink {
		s := openSink(t, sinkURL(withHost(t, p.addr), append(w.options()[:2], "confirm_timeout="+confirmTimeout, fmt.Sprintf("max_message_size=%d", testMaxMessage))...))
		errs, _ := publish(t, s, []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("warm-up"))})
		requireAcked(t, errs)
		return s
	}
	confirmWait, writeWait, ctxWait := newSink("1s"), newSink("1s"), newSink("60s")
	small := []*wharf.Message{msg(wharfsinktest.TopicOrders, "k", []byte("1")), msg(wharfsinktest.TopicOrders, "k", []byte("2"))}
	big := make([]byte, 1<<20)
	var large []*wharf.Message
	for range 64 {
		large = append(large, msg(wharfsinktest.TopicOrders, "big", big))
	}
	p.pause("")
	defer p.unpause(false)

	// Small: the writes fit in the socket buffers, the confirms never come.
	errs, took := publish(t, confirmWait, small)
	if took > 30*time.Second { // a hang guard: the error names the confirm timeout
		t.Fatalf("Publish took %s with confirm_timeout=1s", took)
	}
	for i, err := range errs {
		requireRetryable(t, fmt.Sprintf("stalled, message %d", i), err)
	}
	if !strings.Contains(errs[0].Error(), "confirm_timeout") {
		t.Fatalf("stalled: %v: want the confirm timeout named", errs[0])
	}

	// Large: the writes block; the write deadline closes the connection.
	errs, took = publish(t, writeWait, large)
	// A hang guard: without the write deadline Publish would wait for the
	// stalled broker for good.
	if took > 30*time.Second {
		t.Fatalf("Publish of blocked writes took %s with confirm_timeout=1s", took)
	}
	for i, err := range errs {
		requireNotAcked(t, fmt.Sprintf("stalled write, message %d", i), err)
	}
	t.Logf("blocked writes: %v", errs[0])

	// The same with a long confirm_timeout: ctx cuts the write short.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	start := time.Now()
	errs = ctxWait.Publish(ctx, large)
	cancel()
	// A hang guard: the errors below say the context ended the write.
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Publish of blocked writes took %s with a 300ms context", took)
	}
	ctxErrs := 0
	for i, err := range errs {
		requireNotAcked(t, fmt.Sprintf("stalled write, ctx ended, message %d", i), err)
		if errors.Is(err, context.DeadlineExceeded) {
			ctxErrs++
		}
	}
	if ctxErrs == 0 {
		t.Fatalf("no error names the context's end: %v", errs[0])
	}
	t.Logf("blocked writes, ctx ended: %v", errs[0])

	p.unpause(false)
	for _, s := range []*Sink{confirmWait, writeWait, ctxWait} {
		errs, _ = publish(t, s, small)
		requireAcked(t, errs)
	}
}

func TestOpenFails(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().String()
	_ = ln.Close()
	wrongPass, _ := url.Parse(brokerURL())
	wrongPass.User = url.UserPassword(wrongPass.User.Username(), "s3cret-wrong")
	cases := map[string]struct{ raw, want string }{
		"closed port":      {withHost(t, closedPort) + "?dial_timeout=2s", "connection refused"},
		"wrong password":   {wrongPass.String(), "403"},
		"missing vhost":    {strings.TrimSuffix(withHost(t, "127.0.0.1:5672"), "/") + "/no-such-vhost-" + w.id, "vhost"},
		"missing exchange": {sinkURL(brokerURL(), "exchange="+w.exchange+".missing"), "does not exist"},
	}
	if os.Getenv("WHARF_TEST_AMQP_URL") != "" {
		delete(cases, "missing vhost")
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			u, err := url.Parse(c.raw)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
			defer cancel()
			start := time.Now()
			s, err := Open(ctx, u)
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			t.Logf("%s (%s)", err, time.Since(start).Round(time.Millisecond))
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "sink URL ") {
				t.Fatalf("error %q: want a sink URL error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q shows the password or spans lines", err)
			}
		})
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("amqps://u:p%40ss@mq:5671/prod?exchange=wharf.%7B%7Btopic%7D%7D&routing_key_template=%7B%7Bkey%7D%7D&mandatory=false&strict_order=true&confirm_timeout=5s&max_in_flight=50&max_message_size=0&dial_timeout=2s&name=relay-1&heartbeat=30&cacertfile=%2Fca.pem&certfile=c.pem&keyfile=k.pem&server_name_indication=mq.example")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := urlConfig{
		uri: "amqps://u:p%40ss@mq:5671/prod?cacertfile=%2Fca.pem&certfile=c.pem&heartbeat=30&keyfile=k.pem&server_name_indication=mq.example",
		opts: Options{
			Exchange:           "wharf.{{topic}}",
			RoutingKeyTemplate: "{{key}}",
			DropUnroutable:     true,
			StrictOrder:        true,
			ConfirmTimeout:     5 * time.Second,
			MaxInFlight:        50,
			MaxMessageSize:     -1,
			DialTimeout:        2 * time.Second,
		},
		name: "relay-1",
	}
	if fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	u, _ = url.Parse("amqp://mq")
	cfg, err = parseURL(u)
	if err != nil || cfg.uri != "amqp://mq" || cfg.name != "wharf" || fmt.Sprint(cfg.opts) != fmt.Sprint(Options{}) {
		t.Fatalf("amqp://mq: %+v, %v", cfg, err)
	}
	bad := map[string]string{
		"amqp://mq?ce=yes":                                            `ce="yes": want binary or structured`,
		"amqp://mq?ce_source=/svc":                                    "no content mode",
		"amqp://u:s3cret@mq?confirm=1":                                `unknown option "confirm"`,
		"amqp://u:s3cret@":                                            "names no host",
		"amqp://u:s3cret@a,b":                                         "names no host, or several",
		"amqp://u:s3cret@mq?mandatory=maybe":                          "mandatory=",
		"amqp://u:s3cret@mq?strict_order=yes%20please":                "strict_order=",
		"amqp://u:s3cret@mq?routing_key_template=amq.gen-x":           "the broker's own queues",
		"amqp://u:s3cret@mq?routing_key_template=amq.%7B%7Bkey%7D%7D": "the broker's own queues",
		"amqp://u:s3cret@mq?confirm_timeout=soon":                     "confirm_timeout",
		"amqp://u:s3cret@mq?dial_timeout=-1s":                         "dial_timeout",
		"amqp://u:s3cret@mq?max_in_flight=0":                          "max_in_flight",
		"amqp://u:s3cret@mq?max_message_size=big":                     "max_message_size",
		"amqp://u:s3cret@mq?heartbeat=0":                              "heartbeat=0",
		"amqp://u:s3cret@mq?heartbeat=x":                              "heartbeat",
		"amqp://u:s3cret@mq?cacertfile=ca.pem":                        "use amqps://",
		"amqps://u:s3cret@mq?certfile=c.pem":                          "go together",
		"amqp://u:s3cret@mq?exchange=x.%7B%7Bkey%7D%7D":               "only {{topic}}",
		"amqp://u:s3cret@mq?exchange=" + strings.Repeat("e", 300):     "over AMQP's 255",
		"amqp://u:s3cret@mq:99999":                                    "not a port number",
		"amqp://u:s3cret@mq#frag":                                     "write amqp://",
		"http://u:s3cret@mq":                                          "amqp:// and amqps://",
	}
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, bad)
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("channel closed: %w", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000", Server: true})
	if n, ok := tooLarge(err); !ok || n != 2000 {
		t.Fatalf("tooLarge: %d, %v", n, ok)
	}
	if _, ok := tooLarge(&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange"}); ok {
		t.Fatal("tooLarge matched NOT_FOUND")
	}
}

// ---- benchmarks ----

// benchQueue declares a durable queue of its own, bounded (the oldest
// messages are dropped past 100,000), deleted at cleanup.
func benchQueue(b *testing.B) string {
	b.Helper()
	admin := requireBroker(b)
	ch, err := admin.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := "wharfbench." + randomID()
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(100000), "x-expires": int64(queueExpiresMilli)}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Logf("delete queue %s: %v", q, err)
		}
		_ = ch.Close()
	})
	return q
}

// BenchmarkDirectPublish is the same workload published with amqp091-go
// alone: a channel in confirm mode per concurrent batch, every message of
// the batch published, then every confirm awaited. It is the baseline
// BenchmarkPublish is compared with.
func BenchmarkDirectPublish(b *testing.B) {
	wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		q := benchQueue(b)
		conn := requireBroker(b)
		channels := make(chan *amqp.Channel, 8)
		get := func() (*amqp.Channel, error) {
			select {
			case ch := <-channels:
				return ch, nil
			default:
			}
			ch, err := conn.Channel()
			if err != nil {
				return nil, err
			}
			return ch, ch.Confirm(false)
		}
		return func(ctx context.Context, msgs []*wharf.Message) error {
			ch, err := get()
			if err != nil {
				return err
			}
			defer func() { channels <- ch }()
			dcs := make([]*amqp.DeferredConfirmation, len(msgs))
			for i, m := range msgs {
				dc, err := ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{
					Headers:      amqp.Table{HeaderKey: m.Key},
					DeliveryMode: amqp.Persistent,
					MessageId:    m.ID,
					Body:         m.Payload,
				})
				if err != nil {
					return err
				}
				dcs[i] = dc
			}
			for _, dc := range dcs {
				ok, err := dc.WaitContext(ctx)
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("nacked")
				}
			}
			return nil
		}
	})
}
