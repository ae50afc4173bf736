// Package wharfsinktest is the conformance suite every [wharf.Sink] must pass.
//
// A sink's test builds a [Harness] — how to open the sink against an isolated
// destination, how to read back what the destination received, and how to
// make the destination unavailable — and calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		wharfsinktest.Run(t, wharfsinktest.Harness{
//			NewSink: ..., Consume: ..., BreakBroker: ..., HealBroker: ...,
//			Features: wharfsinktest.Features{MaxPayload: 1 << 20, SupportsHeaders: true},
//		})
//	}
//
// The suite checks the parts of the [wharf.Sink] contract that a broker can
// get wrong: per-key order, the stable message id on every delivered message,
// acknowledging only what the destination accepted, large batches and
// payloads, headers, the shape of the result slice, a broker outage (errors,
// not a hang, and a clean retry once it is back) and a cancelled context.
//
// Every case runs in parallel with the others, so a harness must give each
// test its own destination (a unique topic or stream prefix, or its own
// broker) and must be safe for concurrent use.
package wharfsinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// Features describes what the sink under test can do, so the suite tests what
// the destination promises and no more.
type Features struct {
	// MaxPayload is the largest payload the sink delivers (with the suite's
	// few short headers). When it is 0 or at least 1 MiB the suite delivers a
	// payload of exactly 1 MiB; otherwise one of exactly MaxPayload. When it
	// is non-zero the suite also checks that a payload of twice MaxPayload
	// fails with a [wharf.Permanent] error and that the later messages of its
	// key in the batch are reported with [wharf.ErrNotAttempted]. Defaults
	// to 0: no limit is checked.
	MaxPayload int
	// SupportsHeaders reports whether the destination carries message
	// headers; the header round trip is skipped (and says so) when false.
	// Defaults to false.
	SupportsHeaders bool
}

// Received is one message as the destination holds it, decoded back by the
// harness.
type Received struct {
	// ID is the message id the sink put in the broker's dedup field or
	// header; it must equal [wharf.Message.ID].
	ID string
	// Topic is the wharf topic, mapped back from the destination's name.
	Topic string
	// Key is the message key ("" for a message without one).
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are the message headers without the one that carries ID.
	Headers map[string]string
}

// Harness is what a sink's test provides to [Run].
type Harness struct {
	// NewSink opens a fresh sink whose destination for every topic is
	// isolated to t (for example a unique topic or stream prefix), and
	// arranges for it to be closed and the destination removed at t's
	// cleanup. Required.
	NewSink func(t *testing.T) wharf.Sink
	// NewBreakableSink, when set, replaces NewSink in the broker-unavailable
	// case: for harnesses whose shared broker must not be broken, it opens a
	// sink against a broker that BreakBroker(t) and HealBroker(t) control.
	// Optional.
	NewBreakableSink func(t *testing.T) wharf.Sink
	// Consume returns everything the destination received so far for the
	// given wharf topics of t's sink, in per-key destination order, waiting
	// until it holds at least want messages or timeout passed. It returns
	// what it has on timeout rather than failing. Required.
	Consume func(t *testing.T, topics []string, want int, timeout time.Duration) []Received
	// BreakBroker makes the destination of t's sink unavailable; HealBroker
	// makes it available again. When either is nil the broker-unavailable
	// case is skipped, and the skip says so.
	BreakBroker, HealBroker func(t *testing.T)
	// Features describes what the sink can do.
	Features Features
	// TimeScale multiplies the suite's waits for a publish and for the
	// consumer (0 or 1: as they are), for a destination that is slow by
	// nature, such as a cloud service's emulator answering a request in a
	// tenth of a second. The waits are hang guards, so a larger one only
	// makes a broken sink fail later. The bound on a Publish while the
	// broker is down is not scaled: it checks the context is honoured.
	TimeScale int
}

// wait is d scaled by h.TimeScale.
func (h *Harness) wait(d time.Duration) time.Duration {
	if h.TimeScale > 1 {
		return d * time.Duration(h.TimeScale)
	}
	return d
}

// PerTest keeps one value per test, such as the destination a harness's
// NewSink made for it, for the callbacks that get only t (Consume,
// BreakBroker, HealBroker). The value is forgotten at t's cleanup. The zero
// value is ready to use and safe for concurrent use.
type PerTest[V any] struct {
	mu sync.Mutex
	m  map[*testing.T]V
}

// Set stores v for t until t's cleanup.
func (p *PerTest[V]) Set(t *testing.T, v V) {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[*testing.T]V{}
	}
	p.m[t] = v
	p.mu.Unlock()
	t.Cleanup(func() {
		p.mu.Lock()
		delete(p.m, t)
		p.mu.Unlock()
	})
}

// Get returns t's value, and fails t when NewSink did not Set one.
func (p *PerTest[V]) Get(t *testing.T) V {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[t]
	if !ok {
		t.Fatal("wharfsinktest: the harness has no sink for this test: NewSink was not called")
	}
	return v
}

// Secret is the password (or secret) the URLs given to [CheckURLErrors] use:
// no error may show it.
const Secret = "s3cret"

// CheckURLErrors checks a sink's URL parser on bad URLs: parse must fail on
// each key of bad with a one-line error containing its value, and the error
// must not show [Secret]. It is the common half of every sink's URL test.
func CheckURLErrors(t *testing.T, parse func(*url.URL) error, bad map[string]string) {
	t.Helper()
	for raw, want := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		shown := u.Redacted()
		err = parse(u)
		switch {
		case err == nil || !strings.Contains(err.Error(), want):
			t.Errorf("%s: error %v, want one saying %q", shown, err, want)
		case strings.Contains(err.Error(), Secret):
			t.Errorf("%s: error %q shows the secret", shown, err)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: error %q has several lines", shown, err)
		}
	}
}

// Topic names the suite publishes to, so that a harness whose destinations
// must exist beforehand (Kafka topics, NATS stream subjects) can create them
// in NewSink.
const (
	TopicOrders = "orders"
	TopicEvents = "events"
)

// Topics returns every topic the suite publishes to.
func Topics() []string { return []string{TopicOrders, TopicEvents} }

const (
	publishTimeout = 30 * time.Second
	consumeTimeout = 15 * time.Second
	// confirmTimeout is the short wait of the ack-after-confirm case: an
	// acknowledged message must already be at the destination, so finding it
	// should take only the consumer's start-up.
	confirmTimeout = 5 * time.Second
	// outageTimeout bounds Publish while the broker is down.
	outageTimeout = 10 * time.Second
	mib           = 1 << 20
)

// Run runs the conformance suite as parallel subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewSink == nil || h.Consume == nil {
		t.Fatal("wharfsinktest: Harness.NewSink and Harness.Consume are required")
	}
	cases := []struct {
		name string
		fn   func(*testing.T, *Harness)
	}{
		{"OrderPerKey", testOrderPerKey},
		{"MessageID", testMessageID},
		{"AckAfterConfirm", testAckAfterConfirm},
		{"LargeBatch", testLargeBatch},
		{"LargePayload", testLargePayload},
		{"OversizePayload", testOversizePayload},
		{"Headers", testHeaders},
		{"ResultShape", testResultShape},
		{"BrokerUnavailable", testBrokerUnavailable},
		{"CancelledContext", testCancelledContext},
		{"ConcurrentPublish", testConcurrentPublish},
		{"PublishAfterClose", testPublishAfterClose},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, &h)
		})
	}
}

// ids hands out message ids, increasing across the whole test binary so that
// no two messages of one destination share an id (brokers dedup on it).
var ids atomic.Int64

func init() { ids.Store(time.Now().UnixMilli() * 1000) }

func newMessage(topic, key string, payload []byte) *wharf.Message {
	seq := ids.Add(1)
	return &wharf.Message{ID: wharf.FormatID(seq, rand.Int64()), Seq: seq, Topic: topic, Key: key, Payload: payload, Attempt: 1}
}

func payloadFor(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }

// publishOK publishes msgs and fails t unless every message was acknowledged.
func publishOK(t *testing.T, h *Harness, s wharf.Sink, msgs []*wharf.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
	defer cancel()
	errs := s.Publish(ctx, msgs)
	checkShape(t, errs, len(msgs))
	for i, err := range errs {
		if err != nil && !errors.Is(err, wharf.ErrDuplicate) {
			t.Fatalf("Publish: message %d (id %s, key %q) failed: %v", i, msgs[i].ID, msgs[i].Key, err)
		}
	}
}

func checkShape(t *testing.T, errs []error, n int) {
	t.Helper()
	if errs != nil && len(errs) != n {
		t.Fatalf("Publish returned %d results for %d messages: want nil or one per message", len(errs), n)
	}
}

// consumeAll reads until every id of msgs was seen at least once (duplicates
// are allowed: delivery is at least once) or the timeout passed, and fails t
// if any is missing.
func consumeAll(t *testing.T, h *Harness, topics []string, msgs []*wharf.Message, timeout time.Duration) []Received {
	t.Helper()
	timeout = h.wait(timeout)
	want := len(msgs)
	deadline := time.Now().Add(timeout)
	var got []Received
	for {
		got = h.Consume(t, topics, want, max(time.Until(deadline), 0))
		missing := missingIDs(msgs, got)
		if len(missing) == 0 {
			return got
		}
		if time.Now().After(deadline) || len(got) < want {
			t.Fatalf("the destination holds %d messages; %d acknowledged ones are missing, e.g. id %s", len(got), len(missing), missing[0])
		}
		// Duplicates filled the count; ask for more.
		want = len(got) + len(missing)
	}
}

func missingIDs(msgs []*wharf.Message, got []Received) []string {
	seen := make(map[string]bool, len(got))
	for _, r := range got {
		seen[r.ID] = true
	}
	var missing []string
	for _, m := range msgs {
		if !seen[m.ID] {
			missing = append(missing, m.ID)
		}
	}
	return missing
}

// checkOrder fails t unless, for every key of every topic, the first delivery
// of each message comes in id order; with exact, it also fails on duplicates.
// Order is checked per topic because destinations keep no order across their
// topics (Kafka topics, NATS subjects read by different consumers); a
// consumer can only observe a key's order within one topic.
func checkOrder(t *testing.T, msgs []*wharf.Message, got []Received, exact bool) {
	t.Helper()
	idOf := make(map[string]*wharf.Message, len(msgs))
	for _, m := range msgs {
		idOf[m.ID] = m
	}
	type scope struct{ topic, key string }
	last := map[scope]int64{}
	seen := map[string]bool{}
	for _, r := range got {
		m, ok := idOf[r.ID]
		if !ok {
			t.Fatalf("the destination holds id %q, which the test never published", r.ID)
		}
		if r.Key != m.Key || r.Topic != m.Topic {
			t.Fatalf("id %s arrived with topic %q key %q, want topic %q key %q", r.ID, r.Topic, r.Key, m.Topic, m.Key)
		}
		if seen[r.ID] {
			if exact {
				t.Fatalf("id %s was delivered twice without any failure", r.ID)
			}
			continue
		}
		seen[r.ID] = true
		if m.Key == "" {
			continue
		}
		sc := scope{m.Topic, m.Key}
		if prev, ok := last[sc]; ok && m.Seq < prev {
			t.Fatalf("topic %q key %q: seq %d arrived after seq %d", m.Topic, m.Key, m.Seq, prev)
		}
		last[sc] = m.Seq
	}
}

// testOrderPerKey publishes 3 keys × 200 messages in batches of 50, each batch
// holding several runs of the same key, and checks the destination holds every
// key's messages in id order.
func testOrderPerKey(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	keys := []string{"k0", "k1", "k2"}
	left := map[string]int{"k0": 200, "k1": 200, "k2": 200}
	rng := rand.New(rand.NewPCG(1, 2))
	var msgs []*wharf.Message
	for len(msgs) < 600 {
		k := keys[rng.IntN(len(keys))]
		run := min(1+rng.IntN(6), left[k])
		for range run {
			msgs = append(msgs, newMessage(TopicOrders, k, payloadFor(len(msgs))))
		}
		left[k] -= run
	}
	for i := 0; i < len(msgs); i += 50 {
		publishOK(t, h, s, msgs[i:i+50])
	}
	got := consumeAll(t, h, []string{TopicOrders}, msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
	if len(got) != len(msgs) {
		t.Fatalf("the destination holds %d messages, want %d", len(got), len(msgs))
	}
}

// testConcurrentPublish publishes from several goroutines at once, as the
// relay does (SinkConcurrency), never two batches of one key at the same
// time: every message arrives, each key in order.
func testConcurrentPublish(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	const workers, batches, size = 4, 5, 40
	all := make([][]*wharf.Message, workers)
	for w := range workers {
		for b := range batches {
			for i := range size {
				key := fmt.Sprintf("w%d-k%d", w, i%4)
				all[w] = append(all[w], newMessage(TopicOrders, key, payloadFor(b*size+i)))
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
				res := s.Publish(ctx, all[w][b*size:(b+1)*size])
				cancel()
				if err := firstErr(res); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Publish from one of %d goroutines failed: %v", workers, err)
	}
	var msgs []*wharf.Message
	for _, m := range all {
		msgs = append(msgs, m...)
	}
	got := consumeAll(t, h, []string{TopicOrders}, msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
	if len(got) != len(msgs) {
		t.Fatalf("the destination holds %d messages, want %d", len(got), len(msgs))
	}
}

// testPublishAfterClose checks that a closed sink fails every message (never
// acknowledges one, never panics) and that closing twice is harmless.
func testPublishAfterClose(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	publishOK(t, h, s, []*wharf.Message{newMessage(TopicOrders, "k", payloadFor(0))})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	msgs := []*wharf.Message{newMessage(TopicOrders, "k", payloadFor(1)), newMessage(TopicEvents, "", payloadFor(2))}
	ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
	defer cancel()
	errs := s.Publish(ctx, msgs)
	checkShape(t, errs, len(msgs))
	if errs == nil {
		t.Fatal("Publish after Close acknowledged the messages")
	}
	for i, err := range errs {
		if err == nil || errors.Is(err, wharf.ErrDuplicate) {
			t.Errorf("message %d: %v after Close, want an error", i, err)
		}
	}
	_ = s.Close()
}

// testMessageID checks that every delivered message carries MessageID and
// arrives with its topic, key and payload intact, keyed or not.
func testMessageID(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	var msgs []*wharf.Message
	for i := range 30 {
		key := []string{"", "a", "b"}[i%3]
		topic := []string{TopicOrders, TopicEvents}[i%2]
		msgs = append(msgs, newMessage(topic, key, payloadFor(i)))
	}
	publishOK(t, h, s, msgs)
	got := consumeAll(t, h, Topics(), msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
	byID := map[string]*wharf.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	for _, r := range got {
		m := byID[r.ID]
		if !bytes.Equal(r.Payload, m.Payload) {
			t.Fatalf("id %s: payload %q, want %q", r.ID, r.Payload, m.Payload)
		}
	}
}

// testAckAfterConfirm checks that what Publish acknowledged is already at the
// destination: a consumer started right after finds all of it at once.
func testAckAfterConfirm(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	var msgs []*wharf.Message
	for i := range 200 {
		msgs = append(msgs, newMessage(TopicOrders, fmt.Sprintf("k%d", i%7), payloadFor(i)))
	}
	publishOK(t, h, s, msgs)
	got := consumeAll(t, h, []string{TopicOrders}, msgs, confirmTimeout)
	checkOrder(t, msgs, got, true)
}

// testLargeBatch publishes 2,000 messages in one call.
func testLargeBatch(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	msgs := make([]*wharf.Message, 2000)
	for i := range msgs {
		msgs[i] = newMessage([]string{TopicOrders, TopicEvents}[i%2], fmt.Sprintf("k%d", i%50), payloadFor(i))
	}
	publishOK(t, h, s, msgs)
	got := consumeAll(t, h, Topics(), msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
}

func randomPayload(n int) []byte {
	p := make([]byte, n)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// testLargePayload delivers a payload of exactly 1 MiB (or of MaxPayload when
// the sink declares less) byte for byte.
func testLargePayload(t *testing.T, h *Harness) {
	size := mib
	if mp := h.Features.MaxPayload; mp > 0 && mp < mib {
		size = mp
		t.Logf("the sink declares MaxPayload %d < 1 MiB: testing a payload of %d bytes", mp, size)
	}
	s := h.NewSink(t)
	msgs := []*wharf.Message{
		newMessage(TopicOrders, "big", []byte("before")),
		newMessage(TopicOrders, "big", randomPayload(size)),
		newMessage(TopicOrders, "big", []byte("after")),
	}
	msgs[1].Headers = map[string]string{"h": "v"}
	publishOK(t, h, s, msgs)
	got := consumeAll(t, h, []string{TopicOrders}, msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
	for _, r := range got {
		if r.ID == msgs[1].ID && !bytes.Equal(r.Payload, msgs[1].Payload) {
			t.Fatalf("the %d-byte payload arrived altered (%d bytes)", size, len(r.Payload))
		}
	}
}

// testOversizePayload checks that a payload the destination cannot take fails
// permanently, that later messages of its key are not attempted, and that the
// other messages of the batch are delivered.
func testOversizePayload(t *testing.T, h *Harness) {
	mp := h.Features.MaxPayload
	if mp <= 0 {
		t.Skip("Features.MaxPayload is 0: the sink declares no payload limit to check")
	}
	s := h.NewSink(t)
	msgs := []*wharf.Message{
		newMessage(TopicOrders, "k", []byte("first")),
		newMessage(TopicOrders, "k", randomPayload(2*mp)),
		newMessage(TopicOrders, "k", []byte("behind the oversize one")),
		newMessage(TopicOrders, "other", []byte("another key")),
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages with an oversize one: want one per message", len(errs), len(msgs))
	}
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("messages around the oversize one failed: %v, %v", errs[0], errs[3])
	}
	if !wharf.IsPermanent(errs[1]) {
		t.Fatalf("the oversize payload failed with %v: want a wharf.Permanent error", errs[1])
	}
	if !errors.Is(errs[2], wharf.ErrNotAttempted) {
		t.Fatalf("the message behind the oversize one of its key got %v: want wharf.ErrNotAttempted", errs[2])
	}
	delivered := []*wharf.Message{msgs[0], msgs[3]}
	consumeAll(t, h, []string{TopicOrders}, delivered, consumeTimeout)
	// Wait a little longer for anything that should not be there.
	got := h.Consume(t, []string{TopicOrders}, len(msgs), time.Second)
	for _, r := range got {
		if r.ID == msgs[1].ID || r.ID == msgs[2].ID {
			t.Fatalf("id %s was delivered although Publish reported it failed or not attempted", r.ID)
		}
	}
}

// testHeaders checks that headers arrive as they were sent.
func testHeaders(t *testing.T, h *Harness) {
	if !h.Features.SupportsHeaders {
		t.Skip("Features.SupportsHeaders is false: the destination carries no headers")
	}
	s := h.NewSink(t)
	sets := []map[string]string{
		nil,
		{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"content-type": "application/json", "X-Tenant": "acme", "greeting": "héllo wörld", "spaces": "a b  c"},
	}
	var msgs []*wharf.Message
	for i, hs := range sets {
		m := newMessage(TopicEvents, "h", payloadFor(i))
		m.Headers = hs
		msgs = append(msgs, m)
	}
	publishOK(t, h, s, msgs)
	got := consumeAll(t, h, []string{TopicEvents}, msgs, consumeTimeout)
	checkOrder(t, msgs, got, true)
	for _, r := range got {
		for _, m := range msgs {
			if r.ID != m.ID {
				continue
			}
			if len(r.Headers) != len(m.Headers) || !maps.Equal(r.Headers, m.Headers) {
				t.Fatalf("id %s: headers %v, want %v", r.ID, r.Headers, m.Headers)
			}
		}
	}
}

// testResultShape checks that Publish returns nil or one result per message,
// for an empty batch, one message and many.
func testResultShape(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
	defer cancel()
	for _, n := range []int{0, 1, 17} {
		msgs := make([]*wharf.Message, n)
		for i := range msgs {
			msgs[i] = newMessage(TopicOrders, "", payloadFor(i))
		}
		errs := s.Publish(ctx, msgs)
		checkShape(t, errs, n)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("batch of %d: message %d failed: %v", n, i, err)
			}
		}
	}
}

// testBrokerUnavailable checks that Publish returns errors, and returns them
// in bounded time, while the broker is down, and that retrying the same batch
// once it is back delivers it.
func testBrokerUnavailable(t *testing.T, h *Harness) {
	if h.BreakBroker == nil || h.HealBroker == nil {
		t.Skip("SKIPPED: Harness.BreakBroker/HealBroker are nil: the broker-outage behaviour of this sink is NOT checked")
	}
	newSink := h.NewSink
	if h.NewBreakableSink != nil {
		newSink = h.NewBreakableSink
	}
	s := newSink(t)
	warm := []*wharf.Message{newMessage(TopicOrders, "k", []byte("warm-up"))}
	publishOK(t, h, s, warm) // connected and metadata loaded before the outage

	var msgs []*wharf.Message
	for i := range 20 {
		msgs = append(msgs, newMessage(TopicOrders, fmt.Sprintf("k%d", i%3), payloadFor(i)))
	}
	h.BreakBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), outageTimeout)
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	took := time.Since(start)
	cancel()
	if took > outageTimeout+5*time.Second {
		t.Fatalf("Publish took %s with the broker down and a %s context: it must give up when the context ends", took, outageTimeout)
	}
	if len(errs) != len(msgs) {
		t.Fatalf("with the broker down Publish returned %d results for %d messages: want an error per message", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err == nil {
			t.Fatalf("with the broker down message %d was acknowledged", i)
		}
		if wharf.IsPermanent(err) {
			t.Fatalf("a broker outage must be retried, but message %d failed permanently: %v", i, err)
		}
	}
	t.Logf("with the broker down Publish failed in %s: %v", took.Round(time.Millisecond), errs[0])

	h.HealBroker(t)
	deadline := time.Now().Add(h.wait(publishTimeout))
	for {
		// The relay retries the same batch; so does the test, for as long as
		// the client needs to reconnect.
		ctx, cancel := context.WithTimeout(context.Background(), h.wait(publishTimeout))
		errs = s.Publish(ctx, msgs)
		cancel()
		checkShape(t, errs, len(msgs))
		if firstErr(errs) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after HealBroker the retried batch still fails: %v", firstErr(errs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	all := append(warm, msgs...)
	got := consumeAll(t, h, []string{TopicOrders}, all, consumeTimeout)
	checkOrder(t, all, got, false)
}

// firstErr returns the first failure; a duplicate acknowledgement is a
// delivery (the destination already holds the message).
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil && !errors.Is(err, wharf.ErrDuplicate) {
			return err
		}
	}
	return nil
}

// testCancelledContext checks that a cancelled context yields errors, never
// acknowledgements.
func testCancelledContext(t *testing.T, h *Harness) {
	s := h.NewSink(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := []*wharf.Message{
		newMessage(TopicOrders, "k", []byte("x")),
		newMessage(TopicOrders, "k", []byte("y")),
		newMessage(TopicOrders, "", []byte("z")),
	}
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("with a cancelled context Publish returned %d results for %d messages: want an error per message", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err == nil {
			t.Fatalf("with a cancelled context message %d was acknowledged", i)
		}
	}
	if !strings.Contains(errs[0].Error(), "context canceled") && !errors.Is(errs[0], context.Canceled) {
		t.Logf("note: the error does not mention the cancellation: %v", errs[0])
	}
}

// BenchmarkPublish measures a sink's publish rate: b.N messages of 200 bytes
// over 100 keys, in batches of 1,000, with 1 and with 4 Publish calls in
// flight. newSink opens a fresh sink for each sub-benchmark; the rate is
// reported as msgs/s. Compare it with [BenchmarkDirect] on the same broker.
func BenchmarkPublish(b *testing.B, newSink func(b *testing.B) wharf.Sink) {
	BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		s := newSink(b)
		b.Cleanup(func() { _ = s.Close() })
		return func(ctx context.Context, msgs []*wharf.Message) error {
			for _, err := range s.Publish(ctx, msgs) {
				if err != nil {
					return err
				}
			}
			return nil
		}
	})
}

// BenchmarkDirect measures the broker's own publish rate with the same
// workload as [BenchmarkPublish]: newPublish returns a function that publishes
// one batch with the broker's client alone (no wharf sink) and returns once
// the broker confirmed every message of it. That is the "direct publish"
// baseline a sink's rate is judged against. newPublish is called once per
// sub-benchmark and cleans up with b.Cleanup.
func BenchmarkDirect(b *testing.B, newPublish func(b *testing.B) func(ctx context.Context, msgs []*wharf.Message) error) {
	for _, conc := range []int{1, 4} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			publish := newPublish(b)
			payload := []byte(strings.Repeat("x", 200))
			const batch = 1000
			batches := make(chan []*wharf.Message)
			go func() {
				defer close(batches)
				// Ids unique across runs: brokers that deduplicate on the
				// message id (JetStream) must not drop a rerun's messages.
				id := time.Now().UnixNano()
				for left := b.N; left > 0; left -= batch {
					msgs := make([]*wharf.Message, min(batch, left))
					for i := range msgs {
						id++
						msgs[i] = &wharf.Message{ID: wharf.FormatID(id, rand.Int64()), Seq: id, Topic: TopicOrders, Key: fmt.Sprintf("k%d", id%100), Payload: payload}
					}
					batches <- msgs
				}
			}()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range conc {
				wg.Go(func() {
					for msgs := range batches {
						if err := publish(context.Background(), msgs); err != nil {
							b.Error(err)
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
