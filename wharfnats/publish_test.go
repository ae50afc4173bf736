package wharfnats

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
)

// modes are the two ways a sink publishes a batch.
var modes = []struct {
	name   string
	strict bool
}{{"pipelined", false}, {"strict_order", true}}

// sinkOn returns a sink built with New on a connection of its own,
// configured as Open configures one, publishing w's topics under w.prefix
// unless opts says otherwise.
func sinkOn(t testing.TB, w *world, opts Options) *Sink {
	t.Helper()
	nc, err := nats.Connect(w.url, nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if opts.SubjectTemplate == "" {
		opts.SubjectTemplate = w.prefix + "." + TopicPlaceholder
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = testAckTimeout
	}
	s, err := New(nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newMsg returns message seq of one outbox: a random nonce makes its id
// unique, as the database does.
func newMsg(seq int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(seq, rand.Int64()), Seq: seq, Topic: topic, Key: key, Payload: []byte(payload), Attempt: 1}
}

func publish(t *testing.T, s wharf.Sink, msgs ...*wharf.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(errs), len(msgs))
	}
	if errs == nil {
		errs = make([]error, len(msgs))
	}
	return errs
}

// stored returns the Nats-Msg-Id of every message the stream holds, in
// stream order.
func stored(t *testing.T, js jetstream.JetStream, stream string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	state := st.CachedInfo().State
	var ids []string
	for seq := state.FirstSeq; seq <= state.LastSeq && state.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s #%d: %v", stream, seq, err)
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

func idsOf(msgs ...*wharf.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// watcher records the Nats-Msg-Id of every message published on a world's
// subjects, whether a stream stored it or not: it sees what was sent.
type watcher struct {
	mu    sync.Mutex
	seen  map[string]bool
	count atomic.Int64
}

// watch subscribes to w's subjects; at, when not nil, runs once the watcher
// saw after messages.
func watch(t *testing.T, w *world, after int64, at func()) *watcher {
	t.Helper()
	nc := requireServer(t, w.url)
	wa := &watcher{seen: map[string]bool{}}
	sub, err := nc.Subscribe(w.prefix+".>", func(m *nats.Msg) {
		wa.mu.Lock()
		wa.seen[m.Header.Get(jetstream.MsgIDHeader)] = true
		wa.mu.Unlock()
		if wa.count.Add(1) == after && at != nil {
			at()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the subscription
		t.Fatal(err)
	}
	return wa
}

func (wa *watcher) saw(id string) bool {
	wa.mu.Lock()
	defer wa.mu.Unlock()
	return wa.seen[id]
}

// settle waits until the watcher saw n messages or a second passed, then a
// little longer for any that should not come.
func (wa *watcher) settle(n int) {
	deadline := time.Now().Add(time.Second)
	for wa.count.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
}

// A message JetStream already holds (same Nats-Msg-Id within the duplicate
// window) is reported with wharf.ErrDuplicate, does not hold back the rest of
// its key, and the stream keeps one copy.
func TestDuplicateIsReported(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w, js := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.Duplicates = time.Minute })
			s := sinkOn(t, w, Options{Stream: w.stream, StrictOrder: mode.strict})
			m1 := newMsg(1, "t", "k", "one")
			if errs := publish(t, s, m1); errs[0] != nil {
				t.Fatalf("first publish: %v", errs[0])
			}
			m2 := newMsg(2, "t", "k", "two")
			errs := publish(t, s, m1, m2)
			if !errors.Is(errs[0], wharf.ErrDuplicate) || errs[1] != nil {
				t.Fatalf("results %v: want ErrDuplicate for the resent message, nil for the next one of its key", errs)
			}
			if got, want := stored(t, js, w.stream), idsOf(m1, m2); !slices.Equal(got, want) {
				t.Fatalf("the stream holds %v, want %v: one copy of the duplicate", got, want)
			}
		})
	}
}

// Two outboxes (two databases, or one restored) reuse positions; their
// messages differ by id, so one stream takes both.
func TestSameSeqOfTwoOutboxesBothLand(t *testing.T) {
	t.Parallel()
	w, js := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.Duplicates = time.Minute })
	a := sinkOn(t, w, Options{Stream: w.stream})
	b := sinkOn(t, w, Options{Stream: w.stream})
	ma := newMsg(7, "t", "k", "from outbox A")
	mb := newMsg(7, "t", "k", "from outbox B")
	if ma.ID == mb.ID {
		t.Fatal("the two messages have the same id")
	}
	if errs := publish(t, a, ma); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if errs := publish(t, b, mb); errs[0] != nil {
		t.Fatalf("the second outbox's message with the same Seq: %v, want it stored", errs[0])
	}
	if got, want := stored(t, js, w.stream), idsOf(ma, mb); !slices.Equal(got, want) {
		t.Fatalf("the stream holds %v, want both %v", got, want)
	}
}

// When the stream rejects a message (here: above its max_msg_size), strict
// order sends nothing later of that key, while other keys go on; the default
// pipelined mode has already sent the later message, and the stream took it.
func TestStrictOrderStopsKeyAfterRejection(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w, js := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 512 })
			s := sinkOn(t, w, Options{Stream: w.stream, StrictOrder: mode.strict})
			wa := watch(t, w, 0, nil)
			a1 := newMsg(1, "t", "a", "a1")
			a2 := newMsg(2, "t", "a", strings.Repeat("x", 1024)) // above max_msg_size
			a3 := newMsg(3, "t", "a", "a3")
			b1 := newMsg(4, "t", "b", "b1")
			b2 := newMsg(5, "t", "b", "b2")
			errs := publish(t, s, a1, a2, a3, b1, b2)
			if errs[0] != nil || errs[3] != nil || errs[4] != nil {
				t.Fatalf("results %v: want a1, b1, b2 acknowledged", errs)
			}
			if !wharf.IsPermanent(errs[1]) {
				t.Fatalf("the rejected message: %v, want a permanent error", errs[1])
			}
			if mode.strict {
				wa.settle(4)
				if !errors.Is(errs[2], wharf.ErrNotAttempted) {
					t.Fatalf("a3 after the rejected a2: %v, want ErrNotAttempted", errs[2])
				}
				if wa.saw(a3.ID) {
					t.Fatal("a3 was published after a2 of its key failed")
				}
				// Keys run in parallel: only each key's own order is fixed.
				if got, want := stored(t, js, w.stream), idsOf(a1, b1, b2); !slices.Equal(slices.Sorted(slices.Values(got)), want) || slices.Index(got, b1.ID) > slices.Index(got, b2.ID) {
					t.Fatalf("the stream holds %v, want %v with b1 before b2", got, want)
				}
				return
			}
			if errs[2] != nil {
				t.Fatalf("pipelined: a3 %v, want its real result (stored)", errs[2])
			}
			if got, want := stored(t, js, w.stream), idsOf(a1, a3, b1, b2); !slices.Equal(got, want) {
				t.Fatalf("pipelined: the stream holds %v, want %v", got, want)
			}
		})
	}
}

// A retryable rejection (a full stream with discard=new): strict order sends
// nothing later of the key, and once the operator makes room the relay's
// retry leaves the stream in order, first copies included.
func TestStrictOrderAfterRetryableFailure(t *testing.T) {
	t.Parallel()
	w, js := newStream(t, sharedURL, func(c *jetstream.StreamConfig) {
		c.MaxMsgs = 1
		c.Discard = jetstream.DiscardNew
	})
	s := sinkOn(t, w, Options{Stream: w.stream, StrictOrder: true})
	wa := watch(t, w, 0, nil)
	a1, a2, a3 := newMsg(1, "t", "a", "a1"), newMsg(2, "t", "a", "a2"), newMsg(3, "t", "a", "a3")
	errs := publish(t, s, a1, a2, a3)
	if errs[0] != nil || errs[1] == nil || wharf.IsPermanent(errs[1]) || !errors.Is(errs[2], wharf.ErrNotAttempted) {
		t.Fatalf("results %v: want a1 acknowledged, a2 a retryable error, a3 not attempted", errs)
	}
	t.Logf("a2 failed with: %v", errs[1])
	wa.settle(2)
	if wa.saw(a3.ID) {
		t.Fatal("a3 was published after a2 of its key failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	st, err := js.Stream(ctx, w.stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if errs := publish(t, s, a2, a3); errs[0] != nil || errs[1] != nil {
		t.Fatalf("retry after making room: %v", errs)
	}
	if got, want := stored(t, js, w.stream), idsOf(a1, a2, a3); !slices.Equal(got, want) {
		t.Fatalf("the stream holds %v, want %v", got, want)
	}
}

// Publish stops sending once its context ends mid-batch, returns promptly,
// and gives every message it did not get an acknowledgement for a retryable
// error; what it reported as not sent never reaches the server.
func TestPublishStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, how := range []string{"cancelled", "deadline"} {
			t.Run(mode.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				w, _ := newStream(t, sharedURL, nil)
				s := sinkOn(t, w, Options{Stream: w.stream, StrictOrder: mode.strict})
				var ctx context.Context
				var cancel context.CancelFunc
				var cancelled atomic.Int64 // unix nanos
				n, keys := 30000, 100
				if mode.strict {
					n = 20000 // 200 round trips per key
				}
				msgs := make([]*wharf.Message, n)
				for i := range msgs {
					msgs[i] = newMsg(int64(i+1), "t", fmt.Sprintf("k%d", i%keys), "x")
				}
				var at func()
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				if how == "cancelled" {
					at = func() { cancelled.Store(time.Now().UnixNano()); cancel() }
				} else {
					// A deadline that passes when a tenth of the batch
					// reached the server, not after a time: on a loaded
					// machine a fixed one could pass before the first
					// message or after the last.
					d := newEventDeadline()
					ctx = d
					at = func() { cancelled.Store(time.Now().UnixNano()); d.pass() }
				}
				// The context ends once a tenth of the batch reached the
				// server: by construction, mid-batch.
				wa := watch(t, w, int64(n/10), at)
				errs := s.Publish(ctx, msgs)
				returned := time.Now()
				if len(errs) != n {
					t.Fatalf("%d results for %d messages", len(errs), n)
				}
				// A hang guard, not a speed check: Publish returns once its
				// context ended, without waiting out the rest of the batch.
				if took := returned.Sub(time.Unix(0, cancelled.Load())); took > 30*time.Second {
					t.Fatalf("Publish returned %s after its context ended", took)
				}
				// Not sent: cut short, or held back behind a message of its
				// key that was cut short while awaiting its PubAck.
				unsent := func(err error) bool {
					return errors.Is(err, errNotSent) || errors.Is(err, wharf.ErrNotAttempted)
				}
				var acked, stopped, heldBack, gaveUp int
				lastSent, firstUnsent := -1, n
				for i, err := range errs {
					switch {
					case err == nil:
						acked++
					case errors.Is(err, errNotSent):
						stopped++
						if !errors.Is(err, ctx.Err()) {
							t.Fatalf("message %d: %v does not wrap %v", i, err, ctx.Err())
						}
					case errors.Is(err, wharf.ErrNotAttempted):
						heldBack++
					case errors.Is(err, ctx.Err()):
						gaveUp++
					default:
						t.Fatalf("message %d: %v, want the context's error or not attempted", i, err)
					}
					if err != nil && wharf.IsPermanent(err) {
						t.Fatalf("message %d: %v is permanent", i, err)
					}
					if unsent(err) {
						firstUnsent = min(firstUnsent, i)
					} else {
						lastSent = i
					}
				}
				t.Logf("%d acknowledged, %d sent and given up on, %d not sent, %d held back", acked, gaveUp, stopped, heldBack)
				if stopped+heldBack == 0 {
					t.Fatalf("the context ended mid-batch, yet every message was sent (%d acknowledged, %d given up on)", acked, gaveUp)
				}
				if !mode.strict && lastSent > firstUnsent {
					t.Fatalf("pipelined: message %d was sent after message %d was not", lastSent, firstUnsent)
				}
				wa.settle(acked + gaveUp)
				for i, err := range errs {
					if unsent(err) && wa.saw(msgs[i].ID) {
						t.Fatalf("message %d was reported not sent (%v), but the server received it", i, err)
					}
				}
			})
		}
	}
}

// With a context that ended before the call, nothing is sent.
func TestPublishWithEndedContextSendsNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w, _ := newStream(t, sharedURL, nil)
			s := sinkOn(t, w, Options{Stream: w.stream, StrictOrder: mode.strict})
			wa := watch(t, w, 0, nil)
			ctx, cancel := context.WithCancelCause(context.Background())
			lost := errors.New("lease lost")
			cancel(lost)
			msgs := []*wharf.Message{newMsg(1, "t", "k", "x"), newMsg(2, "t", "k", "y"), newMsg(3, "t", "", "z")}
			errs := s.Publish(ctx, msgs)
			if len(errs) != len(msgs) {
				t.Fatalf("%d results for %d messages", len(errs), len(msgs))
			}
			for i, err := range errs {
				if !errors.Is(err, errNotSent) || !errors.Is(err, context.Canceled) || !errors.Is(err, lost) || wharf.IsPermanent(err) {
					t.Fatalf("message %d: %v, want a retryable not-sent error with the context's cause", i, err)
				}
			}
			wa.settle(0)
			if n := wa.count.Load(); n != 0 {
				t.Fatalf("the server received %d messages", n)
			}
		})
	}
}

// eventDeadline is a context whose deadline passes when the test says so
// (pass): Err is then context.DeadlineExceeded and Deadline the time it
// passed, as for a deadline reached on the clock.
type eventDeadline struct {
	context.Context
	mu   sync.Mutex
	at   time.Time
	done chan struct{}
}

func newEventDeadline() *eventDeadline {
	return &eventDeadline{Context: context.Background(), at: time.Now().Add(time.Hour), done: make(chan struct{})}
}

func (d *eventDeadline) pass() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = time.Now()
	close(d.done)
}

func (d *eventDeadline) Deadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at, true
}

func (d *eventDeadline) Done() <-chan struct{} { return d.done }

func (d *eventDeadline) Err() error {
	select {
	case <-d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
