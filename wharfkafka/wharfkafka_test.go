package wharfkafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/faultproxy"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// kfake and franz-go stop every goroutine they start on Close.
func TestMain(m *testing.M) { leakcheck.Main(m) }

const (
	testPrefix = "wharf-test."
	// testMaxBytes leaves room for a 1 MiB payload with the suite's headers.
	testMaxBytes = 1<<20 + 4096
	// testDeliveryTimeout makes a broken broker fail records in seconds.
	testDeliveryTimeout = 3 * time.Second
)

// world is one test's Kafka: its own in-process cluster, so that a test can
// break its broker without touching the others running in parallel.
type world struct {
	cluster *kfake.Cluster
	outage  *kfake.FaultHandle
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
}

func newCluster(t testing.TB, extra ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	var topics []string
	for _, tp := range wharfsinktest.Topics() {
		topics = append(topics, testPrefix+tp)
	}
	opts := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(3, topics...),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": fmt.Sprint(2 << 20)}),
	}, extra...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newTestSink(t testing.TB, c *kfake.Cluster) *Sink {
	t.Helper()
	s, err := New(Options{
		Brokers:         c.ListenAddrs(),
		TopicTemplate:   testPrefix + TopicPlaceholder,
		MaxMessageBytes: testMaxBytes,
		DeliveryTimeout: testDeliveryTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (h *harness) newSink(t *testing.T) wharf.Sink {
	c := newCluster(t)
	h.worlds.Set(t, &world{cluster: c})
	return newTestSink(t, c)
}

func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	return consume(t, h.worlds.Get(t).cluster, topics, want, timeout)
}

// consume reads the topics from the start with a fresh consumer, keeping
// each partition's order, which is each key's order.
func consume(t *testing.T, c *kfake.Cluster, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	t.Helper()
	var dest []string
	for _, tp := range topics {
		dest = append(dest, testPrefix+tp)
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(dest...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMaxBytes(8<<20),
		kgo.FetchMaxPartitionBytes(8<<20),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []wharfsinktest.Received
	for len(got) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				t.Logf("consume %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			rc := wharfsinktest.Received{
				Topic:   strings.TrimPrefix(r.Topic, testPrefix),
				Key:     string(r.Key),
				Payload: r.Value,
			}
			for _, hd := range r.Headers {
				if hd.Key == HeaderMessageID {
					rc.ID = string(hd.Value)
					continue
				}
				if rc.Headers == nil {
					rc.Headers = map[string]string{}
				}
				rc.Headers[hd.Key] = string(hd.Value)
			}
			got = append(got, rc)
		})
	}
	return got
}

func TestConformance(t *testing.T) {
	h := &harness{}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink: h.newSink,
		Consume: h.consume,
		BreakBroker: func(t *testing.T) {
			w := h.worlds.Get(t)
			// Every produce is answered with a retriable error, as when
			// too few replicas are in sync for acks=all.
			w.outage = w.cluster.Fault(kfake.Fault{
				Keys:  []kmsg.Key{kmsg.Produce},
				Err:   kerr.NotEnoughReplicas,
				Count: -1,
			})
		},
		HealBroker: func(t *testing.T) { h.worlds.Get(t).outage.Remove() },
		Features: wharfsinktest.Features{
			MaxPayload:      1 << 20,
			SupportsHeaders: true,
		},
	})
}

// poisoned makes the cluster reject, with err, every produce request to
// topic whose record batch holds marker: the broker refuses a whole record
// batch for one bad record, as Kafka does with INVALID_RECORD. Records must be
// sent uncompressed for the marker to be found.
func poisoned(c *kfake.Cluster, topic string, marker []byte, err *kerr.Error, count int) *kfake.FaultHandle {
	return c.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: topic,
		Err:   err,
		Count: count,
		When: func(r kmsg.Request) bool {
			for _, t := range r.(*kmsg.ProduceRequest).Topics {
				for _, p := range t.Partitions {
					if bytes.Contains(p.Records, marker) {
						return true
					}
				}
			}
			return false
		},
	})
}

// onePartitionCluster is a cluster whose suite topics have one partition
// each, so that every record of a topic shares one partition.
func onePartitionCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(1, testPrefix+wharfsinktest.TopicOrders, testPrefix+wharfsinktest.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func msg(seq int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(seq, 7), Seq: seq, Topic: topic, Key: key, Payload: []byte(payload)}
}

// INVALID_RECORD rejects a record batch, and franz-go fails every record
// buffered for its partition with it: the sink cannot tell the bad record from
// the others, so all are retried (the relay dead-letters one that keeps
// failing), and records of other topics are unaffected.
func TestInvalidRecordIsRetriedWithItsPartition(t *testing.T) {
	t.Parallel()
	c := onePartitionCluster(t)
	// No broker outage here: a delivery timeout that a loaded machine
	// cannot reach, so that every result is the broker's answer.
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder,
		DeliveryTimeout: time.Minute, Compression: "none"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	poisoned(c, testPrefix+wharfsinktest.TopicEvents, []byte("poison"), kerr.InvalidRecord, -1)
	ev := wharfsinktest.TopicEvents
	msgs := []*wharf.Message{
		msg(1, ev, "a", "fine"),
		msg(2, ev, "b", "poison"),
		msg(3, ev, "c", "fine too"),
		msg(4, wharfsinktest.TopicOrders, "a", "other topic"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	// The client's first records wait for the topics' metadata. The broker
	// holds that metadata until Publish has handed every record over, so
	// the three events records go out in one record batch (otherwise a
	// busy machine can pause Publish between two records long enough for
	// the first to go out alone).
	var handedOver atomic.Bool
	c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !handedOver.Load() {
			c.SleepControl(func() {
				for s.Client().BufferedProduceRecords() < int64(len(msgs)) && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
				handedOver.Store(true)
			})
		}
		return nil, nil, false // the cluster answers
	})
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) || errs[3] != nil {
		t.Fatalf("results %v: want the events records to fail and the orders record to succeed", errs)
	}
	for i, err := range errs[:3] {
		if !errors.Is(err, kerr.InvalidRecord) || wharf.IsPermanent(err) {
			t.Fatalf("message %d: %v: want a retryable INVALID_RECORD", i, err)
		}
	}
	// The relay's retries separate them: the good records go through.
	if errs := s.Publish(ctx, []*wharf.Message{msgs[0], msgs[2]}); errs != nil {
		t.Fatalf("retrying the good records: %v", errs)
	}
	if errs := s.Publish(ctx, msgs[1:2]); len(errs) != 1 || !errors.Is(errs[0], kerr.InvalidRecord) {
		t.Fatalf("retrying the bad record: %v: want INVALID_RECORD again", errs)
	}
}

// When a record batch of a partition is rejected, the later records of the
// same key that the same Publish had handed to franz-go are not written ahead
// of it: franz-go fails every record buffered for the partition, and a later
// batch already in flight is refused by the broker's sequence check. (A record
// handed over after franz-go failed the partition but before the sink heard
// of it can be: the broker holds the rejected request here until the whole
// batch was handed over, leaving that race out.)
func TestRejectedBatchStopsLaterBatchesOfItsPartition(t *testing.T) {
	t.Parallel()
	c := onePartitionCluster(t)
	// One record per batch: a 300-byte payload leaves no room for a second
	// record in 512 bytes, so the key's records go in successive batches,
	// several produce requests in flight at once.
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder,
		DeliveryTimeout: testDeliveryTimeout, Compression: "none", MaxMessageBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	or := wharfsinktest.TopicOrders
	pad := strings.Repeat("x", 300)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	warm := msg(1, or, "k", "warm-up "+pad)
	if errs := s.Publish(ctx, []*wharf.Message{warm}); errs != nil {
		t.Fatalf("warm-up: %v", errs) // the partition pipelines only after a first success
	}
	requests := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
	poisoned(c, testPrefix+or, []byte("poison"), kerr.InvalidRecord, 1)
	c.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if bytes.Contains(r.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records, []byte("poison")) {
			c.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
		}
		return nil, nil, false // the cluster answers, with the fault above
	})
	msgs := []*wharf.Message{msg(2, or, "k", "ok "+pad), msg(3, or, "k", "poison "+pad)}
	for i := int64(4); i < 12; i++ {
		msgs = append(msgs, msg(i, or, "k", "later "+pad))
	}
	errs := s.Publish(ctx, msgs)
	t.Logf("%d produce requests; results %v", requests.Hits(), errs)
	if len(errs) != len(msgs) || errs[0] != nil {
		t.Fatalf("results %v: want the first record acknowledged, the rest failed", errs)
	}
	for i, err := range errs[1:] {
		if err == nil || wharf.IsPermanent(err) {
			t.Fatalf("message %d: %v: want a retryable error", i+1, err)
		}
	}
	got := consume(t, c, []string{or}, 2, 3*time.Second)
	if len(got) != 2 || got[0].ID != warm.ID || got[1].ID != msgs[0].ID {
		t.Fatalf("the topic holds %v: want only the warm-up and the first record", ids(got))
	}
}

func ids(got []wharfsinktest.Received) []string {
	out := make([]string, len(got))
	for i, r := range got {
		out[i] = r.ID
	}
	return out
}

// stallProduce makes the cluster read produce requests and answer none, as
// a broker that went silent without closing its connections, until the
// returned function is called.
func stallProduce(c *kfake.Cluster) (heal func()) {
	var stalled atomic.Bool
	stalled.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, stalled.Load() // handled without an answer: dropped
	})
	return func() { stalled.Store(false) }
}

// checkKeyOrder fails t unless, for every key, the last copies of its
// messages come in Seq order (what a compacted topic keeps), and with
// firstToo the first copies as well (what a consumer that skips ids it has
// seen processes). Redelivery may add copies in between.
func checkKeyOrder(t *testing.T, msgs []*wharf.Message, got []wharfsinktest.Received, firstToo bool) {
	t.Helper()
	seqOf := map[string]int64{}
	for _, m := range msgs {
		seqOf[m.ID] = m.Seq
	}
	byKey := map[string][]int64{}
	for _, r := range got {
		seq, ok := seqOf[r.ID]
		if !ok {
			t.Fatalf("the topic holds id %s, which the test never published", r.ID)
		}
		k := r.Topic + "/" + r.Key
		byKey[k] = append(byKey[k], seq)
	}
	inOrder := func(pos map[int64]int) bool {
		for a, ia := range pos {
			for b, ib := range pos {
				if a < b && ia > ib {
					return false
				}
			}
		}
		return true
	}
	for k, seqs := range byKey {
		first, last := map[int64]int{}, map[int64]int{}
		for i, seq := range seqs {
			if _, ok := first[seq]; !ok {
				first[seq] = i
			}
			last[seq] = i
		}
		if !inOrder(last) {
			t.Fatalf("key %s: the last copies are out of order (seqs in partition order: %v)", k, seqs)
		}
		if !inOrder(first) {
			if firstToo {
				t.Fatalf("key %s: the first copies are out of order (seqs in partition order: %v)", k, seqs)
			}
			t.Logf("key %s: the first copies are out of order (seqs in partition order: %v)", k, seqs)
		}
	}
}

// checkAll fails t unless every message of msgs is in got.
func checkAll(t *testing.T, msgs []*wharf.Message, got []wharfsinktest.Received) {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range got {
		seen[r.ID] = true
	}
	for _, m := range msgs {
		if !seen[m.ID] {
			t.Fatalf("message seq %d (id %s) is missing from the topic, which holds %d records", m.Seq, m.ID, len(got))
		}
	}
}

// A broker that reads a produce request and never answers does not hold
// Publish beyond delivery_timeout, even with a context that never ends: the
// records fail with retryable errors, and once the broker answers again a
// retry delivers them, the last copies of each key in order.
func TestPublishReturnsWhenTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := newTestSink(t, c)
	or := wharfsinktest.TopicOrders
	warm := []*wharf.Message{msg(1, or, "k0", "warm-up")}
	if errs := s.Publish(context.Background(), warm); errs != nil {
		t.Fatalf("warm-up: %v", errs)
	}
	heal := stallProduce(c)
	var msgs []*wharf.Message
	for i := range 30 {
		msgs = append(msgs, msg(int64(i+2), or, fmt.Sprintf("k%d", i%3), fmt.Sprintf("m%d", i)))
	}
	start := time.Now()
	errs := s.Publish(context.Background(), msgs)
	took := time.Since(start)
	t.Logf("with the broker silent Publish returned in %s: %v", took.Round(time.Millisecond), firstErr(errs))
	if took > testDeliveryTimeout+5*time.Second {
		t.Fatalf("Publish took %s with a silent broker: want at most delivery_timeout (%s) + 5s", took, testDeliveryTimeout)
	}
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %v: want an error per message", errs)
	}
	for i, err := range errs {
		if err == nil || wharf.IsPermanent(err) {
			t.Fatalf("message %d: %v: want a retryable error", i, err)
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kgo.ErrRecordTimeout) {
			t.Fatalf("message %d: %v: want it to fail for the delivery timeout", i, err)
		}
	}

	heal()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = s.Publish(ctx, msgs)
		cancel()
		if errs == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("once the broker answers again the retry still fails: %v", firstErr(errs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	all := append(warm, msgs...)
	consume(t, c, []string{or}, len(all), 10*time.Second)
	got := consume(t, c, []string{or}, 4*len(all), time.Second)
	t.Logf("the topic holds %d records for %d messages", len(got), len(all))
	checkAll(t, all, got)
	checkKeyOrder(t, all, got, false)
}

// During a network partition (bytes neither way, connections left open, new
// ones accepted and silent) Publish returns within delivery_timeout, also
// when the relay retries during the partition. When the network heals, the
// requests the partition held reach the broker late, ahead of or behind the
// retry; none lands behind a later message of its key.
func TestPublishDuringANetworkPartition(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	proxy, err := faultproxy.New(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder, DeliveryTimeout: testDeliveryTimeout},
		// Every connection, also to the broker metadata names, goes
		// through the proxy.
		kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy.Addr())
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	or := wharfsinktest.TopicOrders
	warm := []*wharf.Message{msg(1, or, "k0", "warm-up")}
	if errs := s.Publish(context.Background(), warm); errs != nil {
		t.Fatalf("warm-up: %v", errs)
	}
	var msgs []*wharf.Message
	for i := range 30 {
		msgs = append(msgs, msg(int64(i+2), or, fmt.Sprintf("k%d", i%3), fmt.Sprintf("m%d", i)))
	}
	proxy.Stall()
	for attempt := range 2 {
		start := time.Now()
		errs := s.Publish(context.Background(), msgs)
		took := time.Since(start)
		t.Logf("attempt %d during the partition: Publish returned in %s: %v", attempt+1, took.Round(time.Millisecond), firstErr(errs))
		if took > testDeliveryTimeout+5*time.Second {
			t.Fatalf("Publish took %s during a network partition: want at most delivery_timeout (%s) + 5s", took, testDeliveryTimeout)
		}
		if len(errs) != len(msgs) {
			t.Fatalf("Publish returned %v: want an error per message", errs)
		}
		for i, err := range errs {
			if err == nil || wharf.IsPermanent(err) {
				t.Fatalf("message %d: %v: want a retryable error", i, err)
			}
		}
	}
	proxy.Resume()
	later := msg(100, or, "k0", "later")
	batch := append(append([]*wharf.Message(nil), msgs...), later)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs := s.Publish(ctx, batch)
		cancel()
		if errs == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("once the network healed the retry still fails: %v", firstErr(errs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	all := append(warm, batch...)
	consume(t, c, []string{or}, len(all), 10*time.Second)
	// Give late requests time to land, then read everything.
	time.Sleep(500 * time.Millisecond)
	got := consume(t, c, []string{or}, 4*len(all), 2*time.Second)
	t.Logf("the topic holds %d records for %d messages", len(got), len(all))
	checkAll(t, all, got)
	// The first copies are not checked: a record the retry handed over just
	// after franz-go failed the records ahead of it in its partition can be
	// written ahead of them (see the package documentation).
	checkKeyOrder(t, all, got, false)
}

// Publish returns promptly once its context ends, even with produce requests
// unanswered, and nothing of it is sent afterwards: the records fail with
// retryable errors that say why.
func TestPublishHonoursContext(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder, DeliveryTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	or := wharfsinktest.TopicOrders
	if errs := s.Publish(context.Background(), []*wharf.Message{msg(1, or, "k", "warm-up")}); errs != nil {
		t.Fatalf("warm-up: %v", errs)
	}
	heal := stallProduce(c)
	var msgs []*wharf.Message
	for i := range 20 {
		msgs = append(msgs, msg(int64(i+2), or, fmt.Sprintf("k%d", i%4), "x"))
	}
	lost := errors.New("the lease of the batch's lanes was lost")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(300*time.Millisecond, func() { cancel(lost) })
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	took := time.Since(start)
	t.Logf("Publish returned %s after it started, %s after its context ended", took.Round(time.Millisecond), (took - 300*time.Millisecond).Round(time.Millisecond))
	if took > 300*time.Millisecond+time.Second {
		t.Fatalf("Publish took %s, its context ended after 300ms: want it to return promptly", took)
	}
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %v: want an error per message", errs)
	}
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) || !errors.Is(err, lost) || wharf.IsPermanent(err) {
			t.Fatalf("message %d: %v: want a retryable error wrapping the context's error and cause", i, err)
		}
	}
	// Nothing of the cut-short Publish goes out later: with the broker
	// answering again, a later Publish is all the topic receives.
	heal()
	after := []*wharf.Message{msg(100, or, "k0", "after")}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	for errs := s.Publish(ctx2, after); errs != nil; errs = s.Publish(ctx2, after) {
		if ctx2.Err() != nil {
			t.Fatalf("after the stall: %v", errs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := consume(t, c, []string{or}, 3, 3*time.Second)
	if len(got) != 2 || got[1].ID != after[0].ID {
		t.Fatalf("the topic holds %v: want only the warm-up and the later message", ids(got))
	}
}

// Publish hands nothing more to franz-go once its context ended, also while
// it is blocked handing records over (franz-go's buffer is full): those
// records fail as not sent.
func TestPublishStopsHandingOverWhenContextEnds(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder, DeliveryTimeout: time.Minute},
		kgo.MaxBufferedRecords(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	or := wharfsinktest.TopicOrders
	if errs := s.Publish(context.Background(), []*wharf.Message{msg(1, or, "k", "warm-up")}); errs != nil {
		t.Fatalf("warm-up: %v", errs)
	}
	defer stallProduce(c)()
	var msgs []*wharf.Message
	for i := range 100 {
		msgs = append(msgs, msg(int64(i+2), or, fmt.Sprintf("k%d", i%5), "x"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	// A hang guard (the produce is stalled for good): the errors below say
	// the context ended the wait.
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Publish took %s with a 300ms context: want it to return once the context ended", took)
	}
	var notSent int
	for i, err := range errs {
		if err == nil || wharf.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("message %d: %v: want a retryable error wrapping the context's", i, err)
		}
		if errors.Is(err, errNotSent) {
			notSent++
		}
	}
	if len(errs) != len(msgs) || notSent < len(msgs)-11 {
		t.Fatalf("%d of %d results, %d not sent: want the records beyond franz-go's 10-record buffer never handed over", len(errs), len(msgs), notSent)
	}
}

// A produce request the broker answers only after Publish gave up on it
// (delivery_timeout cancelled it) never lands behind the records sent since:
// the client moved to a new producer epoch, and the broker refuses the late
// request's older epoch once the partition holds a newer batch; when the late
// request comes first it lands first. Either way each key's copies are in
// order.
func TestLateProduceRequestDoesNotReorder(t *testing.T) {
	t.Parallel()
	for _, lateFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("late_request_first=%v", lateFirst), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			s := newTestSink(t, c)
			or := wharfsinktest.TopicOrders
			warm := msg(1, or, "k", "warm-up")
			if errs := s.Publish(context.Background(), []*wharf.Message{warm}); errs != nil {
				t.Fatalf("warm-up: %v", errs)
			}
			// The next produce request waits at the broker until release
			// is closed, then the broker handles it as usual.
			var armed atomic.Bool
			armed.Store(true)
			release := make(chan struct{})
			woke := make(chan struct{})
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				if armed.CompareAndSwap(true, false) {
					c.SleepControl(func() { <-release })
					close(woke)
				}
				return nil, nil, false
			})
			a1, a2 := msg(2, or, "k", "a1"), msg(3, or, "k", "a2")
			errs := s.Publish(context.Background(), []*wharf.Message{a1})
			if len(errs) != 1 || errs[0] == nil || wharf.IsPermanent(errs[0]) {
				t.Fatalf("with its request held at the broker: %v: want a retryable error", errs)
			}
			if lateFirst {
				close(release)
				<-woke
			}
			// The relay sends a1 again, then a2.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for errs = s.Publish(ctx, []*wharf.Message{a1, a2}); errs != nil; errs = s.Publish(ctx, []*wharf.Message{a1, a2}) {
				if ctx.Err() != nil {
					t.Fatalf("the retry: %v", errs)
				}
			}
			if !lateFirst {
				close(release)
				<-woke
			}
			// A marker written after the late request was handled.
			marker := msg(4, or, "k", "marker")
			for errs = s.Publish(ctx, []*wharf.Message{marker}); errs != nil; errs = s.Publish(ctx, []*wharf.Message{marker}) {
				if ctx.Err() != nil {
					t.Fatalf("the marker: %v", errs)
				}
			}
			all := []*wharf.Message{warm, a1, a2, marker}
			want := 4
			if lateFirst {
				want = 5 // the late a1, then the retried a1
			}
			got := consume(t, c, []string{or}, want, 5*time.Second)
			t.Logf("partition holds %v", ids(got))
			checkKeyOrder(t, all, got, true)
			if len(got) != want || got[len(got)-1].ID != marker.ID {
				t.Fatalf("the partition holds %d records %v: want %d ending with the marker", len(got), ids(got), want)
			}
		})
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

// An unknown topic (the broker does not create topics) is retried, not
// dead-lettered: an operator can create it.
func TestUnknownTopicIsRetryable(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s, err := New(Options{
		Brokers:         c.ListenAddrs(),
		TopicTemplate:   "missing.{{topic}}",
		DeliveryTimeout: testDeliveryTimeout,
	}, kgo.UnknownTopicRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs := s.Publish(ctx, []*wharf.Message{{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Payload: []byte("x")}})
	if len(errs) != 1 || errs[0] == nil || wharf.IsPermanent(errs[0]) {
		t.Fatalf("results %v: want one retryable error", errs)
	}
}

func TestTopicTemplate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ tmpl, topic, want string }{
		{"", "orders", "orders"},
		{"prod.{{topic}}", "orders", "prod.orders"},
		{"{{topic}}-v2", "orders", "orders-v2"},
		{"all-events", "orders", "all-events"},
	} {
		s, err := New(Options{Brokers: []string{"127.0.0.1:1"}, TopicTemplate: tc.tmpl})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Topic(tc.topic); got != tc.want {
			t.Errorf("template %q: topic %q -> %q, want %q", tc.tmpl, tc.topic, got, tc.want)
		}
		_ = s.Close()
	}
	if _, err := New(Options{Brokers: []string{"h:1"}, TopicTemplate: "{{topic}}.{{topic}}"}); err == nil {
		t.Error("a template with two placeholders was accepted")
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	good := []struct {
		raw  string
		want Options
		tls  bool
	}{
		{"kafka://k1:9092", Options{Brokers: []string{"k1:9092"}}, false},
		{"kafka://k1,k2:9093/", Options{Brokers: []string{"k1:9092", "k2:9093"}}, false},
		{
			"kafka://k1:9092?topic_template=prod.%7B%7Btopic%7D%7D&client_id=relay-1&max_message_bytes=2000000&delivery_timeout=10s&compression=zstd&tls=true",
			Options{Brokers: []string{"k1:9092"}, TopicTemplate: "prod.{{topic}}", ClientID: "relay-1", MaxMessageBytes: 2000000, DeliveryTimeout: 10 * time.Second, Compression: "zstd"},
			true,
		},
		{"kafka://k1:9092?topic_template=prod.{{topic}}", Options{Brokers: []string{"k1:9092"}, TopicTemplate: "prod.{{topic}}"}, false},
	}
	for _, tc := range good {
		u, err := url.Parse(tc.raw)
		if err != nil {
			t.Fatalf("%s: %v", tc.raw, err)
		}
		got, tlsOn, err := parseURL(u)
		if err != nil {
			t.Fatalf("%s: %v", tc.raw, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || tlsOn != tc.tls {
			t.Errorf("%s: got %+v tls=%v, want %+v tls=%v", tc.raw, got, tlsOn, tc.want, tc.tls)
		}
	}
	bad := map[string]string{
		"kafka://":                                     "names no broker",
		"kafka://k1?acks=1":                            `unknown option "acks"`,
		"kafka://u:s3cret@k1":                          "no user or password",
		"kafka://k1?max_message_bytes=big":             "max_message_bytes",
		"kafka://k1?delivery_timeout=soon":             "delivery_timeout",
		"kafka://k1?compression=brotli":                "compression",
		"kafka://k1/some/path":                         "write kafka://",
		"kafka://k1?tls=maybe":                         "tls=",
		"kafka://k1?topic_template={{topic}}{{topic}}": "more than once",
		"kafka://k1?ce=json":                           `ce="json": want binary or structured`,
		"kafka://k1?ce_source=/x":                      "no content mode",
		"kafka://k1?ce=binary&ce_source=a%20b":         "white space",
	}
	for raw, want := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		s, err := Open(context.Background(), u)
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: accepted", raw)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not say %q", raw, err, want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q shows the password", raw, err)
		}
	}
}

// BenchmarkPublish is franz-go's direct-publish rate into kfake (in memory,
// same process: an upper bound for the client, not a real broker's rate).
func BenchmarkPublish(b *testing.B) {
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		c := newCluster(b)
		s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}

// BenchmarkDirectPublish is the same workload produced with franz-go alone
// (idempotent, acks=all, every record of a batch in flight, waiting for all
// of them): the baseline BenchmarkPublish is compared with.
func BenchmarkDirectPublish(b *testing.B) {
	wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		c := newCluster(b)
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerBatchCompression(kgo.SnappyCompression()), kgo.ProducerLinger(0))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		topic := testPrefix + wharfsinktest.TopicOrders
		return func(ctx context.Context, msgs []*wharf.Message) error {
			recs := make([]*kgo.Record, len(msgs))
			for i, m := range msgs {
				recs[i] = &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: m.Payload,
					Headers: []kgo.RecordHeader{{Key: HeaderMessageID, Value: []byte(m.ID)}}}
			}
			return cl.ProduceSync(ctx, recs...).FirstErr()
		}
	})
}
