package observe

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfkafka"
	"github.com/wharfhq/wharf/wharfnats"
	"github.com/wharfhq/wharf/wharfotel"
	"github.com/wharfhq/wharf/wharfwebhook"
)

const natsURL = "nats://127.0.0.1:4222"

// natsStream connects to the shared NATS server (failing under CI=true when
// it is not there, skipping otherwise) and creates a stream of the test's
// own capturing "<prefix>.>", deleted at cleanup.
func natsStream(t *testing.T) (jetstream.Stream, string) {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		testtool.Missing(t, "nats-server", fmt.Sprintf("no NATS server with JetStream at %s (%v): start it with: nats-server -js -a 127.0.0.1 -p 4222", natsURL, err))
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	id := randHex(5)
	name, prefix := "OBS_"+id, "obs"+id
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return st, prefix
}

func openSink(t *testing.T, open func(context.Context, *url.URL) (wharf.Sink, error), raw string) wharf.Sink {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := open(ctx, u)
	require.NoError(t, err, "open %s", raw)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// hookReceiver records the traceparent of every webhook request and fails
// the first one, so the message is delivered on a second attempt.
type hookReceiver struct {
	mu      sync.Mutex
	parents []string
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parents = append(h.parents, r.Header.Get("Traceparent"))
	if len(h.parents) == 1 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *hookReceiver) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.parents...)
}

func parseParent(t *testing.T, traceparent string) trace.SpanContext {
	t.Helper()
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	require.True(t, sc.IsValid(), "traceparent %q does not parse", traceparent)
	return sc
}

func TestTraceReachesNATSKafkaAndWebhookConsumers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	// NATS JetStream, a stream of the test's own.
	stream, prefix := natsStream(t)
	natsSink := openSink(t, wharfnats.Open, natsURL+"?subject_template="+prefix+".{{topic}}&stream="+stream.CachedInfo().Config.Name)

	// Kafka, in process.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "trace.kafka"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	kafkaSink := openSink(t, wharfkafka.Open, "kafka://"+cluster.ListenAddrs()[0]+"?delivery_timeout=10s")

	// A webhook receiver on loopback.
	hooks := &hookReceiver{}
	hookSrv := httptest.NewServer(hooks)
	t.Cleanup(hookSrv.Close)
	hookSink := openSink(t, wharfwebhook.Open, hookSrv.URL+"/in/{{topic}}?wharf_allow_private=true")

	router, err := wharf.NewRouter(
		wharf.Route{Pattern: "trace.nats", Sink: natsSink},
		wharf.Route{Pattern: "trace.kafka", Sink: kafkaSink},
		wharf.Route{Pattern: "trace.hook", Sink: hookSink},
	)
	require.NoError(t, err)

	pool, schema := migrated(t, databaseURL, 8)
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:       schema,
		Sink:         router,
		Tracer:       wharfotel.New(wharfotel.WithTracerProvider(tp), wharfotel.WithPropagator(propagation.TraceContext{})),
		PollInterval: 10 * time.Millisecond,
		RetryBackoff: 100 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler), // the webhook's first 503 is logged
	})
	require.NoError(t, err)
	startRelay(t, client)

	// The application's request: a span around the enqueue.
	pctx, producer := tp.Tracer("shop").Start(ctx, "POST /checkout")
	ids := enqueue(t, pctx, pool, client,
		wharf.Message{Topic: "trace.nats", Key: "order-1", Payload: []byte(`{"n":1}`)},
		wharf.Message{Topic: "trace.kafka", Key: "order-1", Payload: []byte(`{"k":1}`)},
		wharf.Message{Topic: "trace.hook", Key: "order-1", Payload: []byte(`{"h":1}`)},
	)
	producer.End()
	want := producer.SpanContext()

	// What each consumer receives.
	received := map[string]string{} // topic -> traceparent

	msgs, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	batch, err := msgs.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	require.NoError(t, err)
	for m := range batch.Messages() {
		received["trace.nats"] = m.Headers().Get("traceparent")
		require.NoError(t, m.Ack())
	}
	require.NoError(t, batch.Error())

	kc, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("trace.kafka"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer kc.Close()
	for received["trace.kafka"] == "" && ctx.Err() == nil {
		kc.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "traceparent" {
					received["trace.kafka"] = string(h.Value)
				}
			}
		})
	}

	eventually(t, 30*time.Second, 50*time.Millisecond, func() string {
		if len(hooks.got()) < 2 {
			return fmt.Sprintf("webhook got %d requests, want a failed one and a retry", len(hooks.got()))
		}
		return ""
	})
	received["trace.hook"] = hooks.got()[1]
	eventually(t, 30*time.Second, 50*time.Millisecond, func() string {
		if n := client.Metrics().Delivered.Load(); n != 3 {
			return fmt.Sprintf("%d of 3 delivered", n)
		}
		return ""
	})

	// The relay's spans, by message id.
	publish := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				publish[a.Value.AsString()] = append(publish[a.Value.AsString()], s)
			}
		}
	}

	for i, topic := range []string{"trace.nats", "trace.kafka", "trace.hook"} {
		tp := received[topic]
		require.NotEmpty(t, tp, "%s: the consumer got no traceparent", topic)
		got := parseParent(t, tp)
		require.Equal(t, want.TraceID(), got.TraceID(), "%s: the consumer continues the producer's trace", topic)

		spans := publish[ids[i]]
		require.NotEmpty(t, spans, "%s: no publish span for message %s", topic, ids[i])
		last := spans[len(spans)-1]
		require.Equal(t, topic+" publish", last.Name)
		require.Equal(t, trace.SpanKindProducer, last.SpanKind)
		require.Equal(t, got.SpanID(), last.SpanContext.SpanID(), "%s: the consumer's parent is the relay's publish span", topic)
		for _, s := range spans {
			require.Equal(t, want.TraceID(), s.SpanContext.TraceID(), "%s: publish span in the producer's trace", topic)
			require.Equal(t, want.SpanID(), s.Parent.SpanID(), "%s: publish span is a child of the producer's span", topic)
		}
		attrs := attribute.NewSet(last.Attributes...)
		sys, _ := attrs.Value("messaging.system")
		require.Equal(t, "wharf", sys.AsString())
		dest, _ := attrs.Value("messaging.destination.name")
		require.Equal(t, topic, dest.AsString())
	}

	// The webhook's first attempt failed: two spans, siblings under the
	// producer, the first with an error; each request carried its own span.
	hookSpans := publish[ids[2]]
	require.Len(t, hookSpans, 2)
	require.Equal(t, "Error", hookSpans[0].Status.Code.String())
	require.Equal(t, "Unset", hookSpans[1].Status.Code.String())
	first := parseParent(t, hooks.got()[0])
	require.Equal(t, hookSpans[0].SpanContext.SpanID(), first.SpanID())
	hookAttrs := attribute.NewSet(hookSpans[1].Attributes...)
	attempt, _ := hookAttrs.Value("wharf.attempt")
	require.Equal(t, int64(2), attempt.AsInt64())
}
