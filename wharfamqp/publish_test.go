package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
)

// modes are the sink's two ordering modes.
var modes = []struct {
	name   string
	option string
	strict bool
}{{"pipelined", "strict_order=false", false}, {"strict_order", "strict_order=true", true}}

// limitedQueue declares a direct exchange of the test's own, routing key "k"
// to a queue that takes at most maxBytes of bodies and refuses (nacks) a
// publish that would go over (x-overflow=reject-publish with
// x-max-length-bytes, so that a later small message still fits). Both are
// deleted at cleanup.
func limitedQueue(t *testing.T, maxBytes int) (exchange, queue string, admin *amqp.Channel) {
	t.Helper()
	conn := requireBroker(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	exchange = "wharftest." + randomID()
	queue = exchange + ".limited"
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{"x-max-length-bytes": int64(maxBytes), "x-overflow": "reject-publish", "x-expires": int64(queueExpiresMilli)}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatalf("declare queue %s: %v", queue, err)
	}
	if err := ch.QueueBind(queue, "k", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = ch.Close()
	})
	return exchange, queue, ch
}

// drain takes every message of queue q and returns their message-ids in
// queue order.
func drain(t *testing.T, ch *amqp.Channel, q string) []string {
	t.Helper()
	var ids []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatalf("get from %s: %v", q, err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
	}
}

func idsOf(msgs ...*wharf.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// inOrder reports whether want appear in got in that order (others may be
// interleaved).
func inOrder(got []string, want ...string) bool {
	last := -1
	for _, id := range want {
		i := slices.Index(got, id)
		if i < 0 || i < last {
			return false
		}
		last = i
	}
	return true
}

// When a queue refuses one message of a key (a nack: the queue is full with
// x-overflow=reject-publish), strict order sends nothing later of that key,
// while other keys go on; once the queue has room the retry leaves the queue
// in order, first copies included. The default pipelined mode has already
// sent the later message, and the queue took it, ahead of the refused one.
// The later message is small enough for the queue to take it after the
// refusal, so its absence shows that it was never published.
func TestStrictOrderStopsKeyAfterNack(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			exchange, queue, admin := limitedQueue(t, 1024)
			s := openSink(t, sinkURL(brokerURL(), "exchange="+exchange, "routing_key_template=k", mode.option))
			big := strings.Repeat("x", 600)
			a1 := msg("t", "a", []byte(big))
			a2 := msg("t", "a", []byte(big)) // 1,200 bytes with a1: refused
			a3 := msg("t", "a", []byte("a3"))
			b1 := msg("t", "b", []byte("b1"))
			b2 := msg("t", "b", []byte("b2"))
			errs, _ := publish(t, s, []*wharf.Message{a1, a2, a3, b1, b2})
			if errs[0] != nil || errs[3] != nil || errs[4] != nil {
				t.Fatalf("results %v: want a1, b1, b2 acknowledged", errs)
			}
			requireRetryable(t, "a2, refused by the full queue", errs[1])
			if !strings.Contains(errs[1].Error(), "nacked") {
				t.Fatalf("a2: %v: want the nack named", errs[1])
			}
			kept := drain(t, admin, queue)
			if !mode.strict {
				// The real result of a3: the queue took it, ahead of a2.
				if errs[2] != nil {
					t.Fatalf("pipelined: a3 %v, want its real result (routed)", errs[2])
				}
				if len(kept) != 4 || !inOrder(kept, a1.ID, a3.ID) || !inOrder(kept, b1.ID, b2.ID) {
					t.Fatalf("pipelined: the queue holds %v, want a1, a3, b1, b2 (each key in order), without a2", kept)
				}
				return
			}
			if !errors.Is(errs[2], wharf.ErrNotAttempted) {
				t.Fatalf("a3 after the refused a2: %v, want ErrNotAttempted", errs[2])
			}
			if len(kept) != 3 || !inOrder(kept, a1.ID) || !inOrder(kept, b1.ID, b2.ID) {
				t.Fatalf("the queue holds %v, want a1, b1, b2: a3 must not be published after a2 failed", kept)
			}
			// The queue was drained, as a consumer would: the relay's
			// retry of a2 and a3 now goes through, in order.
			errs, _ = publish(t, s, []*wharf.Message{a2, a3})
			requireAcked(t, errs)
			if got := drain(t, admin, queue); !slices.Equal(got, idsOf(a2, a3)) {
				t.Fatalf("after the retry the queue holds %v, want a2, a3", got)
			}
		})
	}
}

// An unroutable message (basic.return) in strict order stops its key just as
// a nack does; other keys go on.
func TestStrictOrderStopsKeyAfterReturn(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := openSink(t, sinkURL(brokerURL(), append(w.options(), "strict_order=true")...))
	a1 := msg("orders", "a", []byte("a1"))
	n1 := msg("nowhere", "n", []byte("n1"))
	a2 := msg("orders", "a", []byte("a2"))
	n2 := msg("nowhere", "n", []byte("n2"))
	errs, _ := publish(t, s, []*wharf.Message{a1, n1, a2, n2})
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("results %v: want a1 and a2 acknowledged", errs)
	}
	requireRetryable(t, "n1, unroutable", errs[1])
	if !strings.Contains(errs[1].Error(), "NO_ROUTE") {
		t.Fatalf("n1: %v: want the return named", errs[1])
	}
	if !errors.Is(errs[3], wharf.ErrNotAttempted) {
		t.Fatalf("n2 after the returned n1: %v, want ErrNotAttempted", errs[3])
	}
	if got := w.received([]string{"orders"}, 2, 5*time.Second); len(got) != 2 || got[0].ID != a1.ID || got[1].ID != a2.ID {
		t.Fatalf("the orders queue holds %v, want a1, a2", got)
	}
}

// Strict order keeps a batch's keys in order under load: many keys, several
// messages each, a small max_in_flight, and concurrent Publish calls.
func TestStrictOrderManyKeys(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := openSink(t, sinkURL(brokerURL(), append(w.options(), "strict_order=true", "max_in_flight=7")...))
	var msgs []*wharf.Message
	for i := range 600 {
		m := msg("orders", fmt.Sprintf("k%d", i%13), []byte("x"))
		if i%10 == 0 {
			m.Key = "" // unkeyed, pipelined
		}
		msgs = append(msgs, m)
	}
	errs, _ := publish(t, s, msgs)
	requireAcked(t, errs)
	got := w.received([]string{"orders"}, len(msgs), 10*time.Second)
	if len(got) != len(msgs) {
		t.Fatalf("the queue holds %d messages, want %d", len(got), len(msgs))
	}
	last := map[string]int64{}
	for _, r := range got {
		seq, _, err := wharf.ParseID(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Key != "" && seq <= last[r.Key] {
			t.Fatalf("key %s: seq %d after %d", r.Key, seq, last[r.Key])
		}
		last[r.Key] = seq
	}
}

// Publish stops sending once its context ends, returns promptly, and gives
// every message it had no confirm for a retryable error that names the
// context's cause; what it did not send never reaches the broker, even once
// the broker reads again.
func TestPublishStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			p := startProxy(t)
			// Pipelined with max_in_flight=2 sends a1 and a2 and waits;
			// strict order sends the first of each key, a1 and b1.
			s := openSink(t, sinkURL(withHost(t, p.addr), append(w.options(), mode.option, "max_in_flight=2", "confirm_timeout=60s")...))
			errs, _ := publish(t, s, []*wharf.Message{msg("orders", "w", []byte("warm-up"))})
			requireAcked(t, errs)
			w.received([]string{"orders"}, 1, 5*time.Second)

			var msgs []*wharf.Message
			for _, k := range []string{"a", "a", "a", "b", "b", "b"} {
				msgs = append(msgs, msg("orders", k, []byte(k)))
			}
			mayArrive := idsOf(msgs[0], msgs[1])
			if mode.strict {
				mayArrive = idsOf(msgs[0], msgs[3])
			}
			p.pause("")
			ctx, cancel := context.WithCancelCause(context.Background())
			time.AfterFunc(300*time.Millisecond, func() { cancel(errors.New("the lease of lane 7 was lost")) })
			start := time.Now()
			errs = s.Publish(ctx, msgs)
			took := time.Since(start)
			if took > 2*time.Second {
				t.Fatalf("Publish took %s after its context was cancelled at 300ms", took)
			}
			if len(errs) != len(msgs) {
				t.Fatalf("results %v: want one error per message", errs)
			}
			named := 0
			for i, err := range errs {
				requireNotAcked(t, fmt.Sprintf("message %d", i), err)
				if errors.Is(err, context.Canceled) && strings.Contains(err.Error(), "lease of lane 7") {
					named++
				}
			}
			if named == 0 {
				t.Fatalf("no error names the context's cause: %v", errs)
			}
			t.Logf("%s: returned in %s: %v", mode.name, took.Round(time.Millisecond), errs[0])
			p.unpause(false)
			// Whatever the broker receives arrives within this wait.
			w.received([]string{"orders"}, 1+len(mayArrive), 3*time.Second)
			time.Sleep(500 * time.Millisecond)
			got := w.received([]string{"orders"}, 0, 0)
			for _, r := range got[1:] {
				if !slices.Contains(mayArrive, r.ID) {
					t.Fatalf("%s reached the broker although Publish had stopped sending before it (may arrive: %v)", r.ID, mayArrive)
				}
			}
		})
	}
}
