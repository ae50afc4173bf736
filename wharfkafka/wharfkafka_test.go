package wharfkafka

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// kfake and franz-go stop every goroutine they start on Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// A record the broker rejects as invalid is dead-lettered at once; the other
// records of the batch are unaffected.
func TestInvalidRecordIsPermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := newTestSink(t, c)
	c.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: testPrefix + wharfsinktest.TopicEvents,
		Err:   kerr.InvalidRecord,
		Count: -1,
	})
	msgs := []*wharf.Message{
		{ID: 1, Topic: wharfsinktest.TopicEvents, Key: "a", Payload: []byte("x")},
		{ID: 2, Topic: wharfsinktest.TopicOrders, Key: "a", Payload: []byte("y")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if len(errs) != 2 || !wharf.IsPermanent(errs[0]) || errs[1] != nil {
		t.Fatalf("results %v: want a permanent error, then success", errs)
	}
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
	errs := s.Publish(ctx, []*wharf.Message{{ID: 1, Topic: "t", Payload: []byte("x")}})
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
					Headers: []kgo.RecordHeader{{Key: HeaderMessageID, Value: []byte(m.MessageID())}}}
			}
			return cl.ProduceSync(ctx, recs...).FirstErr()
		}
	})
}
