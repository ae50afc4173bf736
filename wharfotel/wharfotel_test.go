package wharfotel

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestEnqueueInjectsTraceContextOfCtx(t *testing.T) {
	tp, _ := newProvider(t)
	tr := New(WithTracerProvider(tp))
	ctx, span := tp.Tracer("app").Start(context.Background(), "checkout")
	defer span.End()

	m := &wharf.Message{Topic: "orders.paid", Headers: map[string]string{"a": "b"}}
	tr.Enqueue(ctx, m)
	require.Equal(t, "b", m.Headers["a"])
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
	require.True(t, got.IsValid(), "traceparent %q", m.Headers["traceparent"])
	require.Equal(t, span.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), got.SpanID())

	// No trace in ctx: nothing written, but a nil map is made usable.
	m2 := &wharf.Message{Topic: "t"}
	tr.Enqueue(context.Background(), m2)
	require.NotNil(t, m2.Headers)
	require.Empty(t, m2.Headers)
}

func TestDefaultPropagatorIsW3CWhenNoGlobalIsSet(t *testing.T) {
	tr := New()
	require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, tr.fields)
}

func TestPublishSpansAreChildrenOfTheProducerAndReachTheHeaders(t *testing.T) {
	tp, exp := newProvider(t)
	tr := New(WithTracerProvider(tp))
	pctx, producer := tp.Tracer("app").Start(context.Background(), "checkout")
	producer.End()

	traced := &wharf.Message{ID: wharf.FormatID(7, 1), Seq: 7, Topic: "orders.paid", Payload: []byte("12345"), Attempt: 1,
		Headers: map[string]string{"x": "y"}}
	tr.Enqueue(pctx, traced)
	stored := traced.Headers["traceparent"]
	untraced := &wharf.Message{ID: wharf.FormatID(8, 1), Seq: 8, Topic: "orders.paid", Attempt: 3} // nil headers
	dup := &wharf.Message{ID: wharf.FormatID(9, 1), Seq: 9, Topic: "t2", Attempt: 1, Headers: map[string]string{}}
	perm := &wharf.Message{ID: wharf.FormatID(10, 1), Seq: 10, Topic: "t2", Attempt: 2, Headers: map[string]string{}}
	msgs := []*wharf.Message{traced, untraced, dup, perm}

	ctx, done := tr.Publish(context.Background(), "wharfkafka", msgs)
	require.False(t, trace.SpanContextFromContext(ctx).IsValid(), "the batch's context carries no message's span")
	// What the sink sees: each message's own span as the parent.
	sent := map[string]trace.SpanContext{}
	for _, m := range msgs {
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		require.True(t, sc.IsValid(), "message %d carries no trace context to the sink", m.Seq)
		sent[m.ID] = sc
	}
	require.Equal(t, "y", traced.Headers["x"])
	done([]error{nil, errors.New("broker said no"), wharf.ErrDuplicate, wharf.Permanent(errors.New("too big"))})

	// After the call the outbox's own headers are back.
	require.Equal(t, stored, traced.Headers["traceparent"])
	require.Nil(t, untraced.Headers)
	require.Empty(t, dup.Headers)

	spans := exp.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == "checkout" {
			continue
		}
		byID[attrs(s)["messaging.message.id"].AsString()] = s
	}
	require.Len(t, byID, 4)

	s := byID[traced.ID]
	require.Equal(t, "orders.paid publish", s.Name)
	require.Equal(t, trace.SpanKindProducer, s.SpanKind)
	require.Equal(t, producer.SpanContext().TraceID(), s.SpanContext.TraceID(), "publish span is in the producer's trace")
	require.Equal(t, producer.SpanContext().SpanID(), s.Parent.SpanID(), "publish span is the producer span's child")
	require.Equal(t, s.SpanContext.SpanID(), sent[traced.ID].SpanID(), "the sink got the publish span's context")
	a := attrs(s)
	require.Equal(t, "wharf", a["messaging.system"].AsString())
	require.Equal(t, "orders.paid", a["messaging.destination.name"].AsString())
	require.Equal(t, "wharfkafka", a["wharf.sink"].AsString())
	require.Equal(t, int64(1), a["wharf.attempt"].AsInt64())
	require.Equal(t, int64(5), a["messaging.message.body.size"].AsInt64())
	require.Equal(t, codes.Unset, s.Status.Code)

	s = byID[untraced.ID]
	require.False(t, s.Parent.IsValid(), "a message enqueued without a trace gets a root span")
	require.Equal(t, int64(3), attrs(s)["wharf.attempt"].AsInt64())
	require.Equal(t, codes.Error, s.Status.Code)
	require.Equal(t, "broker said no", s.Status.Description)
	require.NotEmpty(t, s.Events, "the error is recorded")

	s = byID[dup.ID]
	require.Equal(t, codes.Unset, s.Status.Code, "a duplicate is a success")
	require.True(t, attrs(s)["wharf.duplicate"].AsBool())

	s = byID[perm.ID]
	require.Equal(t, codes.Error, s.Status.Code)
	require.True(t, attrs(s)["wharf.permanent"].AsBool())
}

func TestRetriesAreSiblingsUnderTheProducer(t *testing.T) {
	tp, exp := newProvider(t)
	tr := New(WithTracerProvider(tp))
	pctx, producer := tp.Tracer("app").Start(context.Background(), "checkout")
	producer.End()
	m := &wharf.Message{ID: wharf.FormatID(1, 1), Topic: "t", Attempt: 1}
	tr.Enqueue(pctx, m)
	for attempt := 1; attempt <= 3; attempt++ {
		m.Attempt = attempt
		_, done := tr.Publish(context.Background(), "s", []*wharf.Message{m})
		done([]error{errors.New("down")})
	}
	n := 0
	for _, s := range exp.GetSpans() {
		if s.Name == "t publish" {
			n++
			require.Equal(t, producer.SpanContext().SpanID(), s.Parent.SpanID(), "attempt %d", attrs(s)["wharf.attempt"].AsInt64())
		}
	}
	require.Equal(t, 3, n)
}

func TestPublishNilResultsMeansAllDelivered(t *testing.T) {
	tp, exp := newProvider(t)
	tr := New(WithTracerProvider(tp))
	msgs := []*wharf.Message{{ID: "a", Topic: "t"}, {ID: "b", Topic: "t"}}
	_, done := tr.Publish(context.Background(), "s", msgs)
	done(nil)
	require.Len(t, exp.GetSpans(), 2)
	for _, s := range exp.GetSpans() {
		require.Equal(t, codes.Unset, s.Status.Code)
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnvIsOffByDefault(t *testing.T) {
	for _, e := range []map[string]string{
		{},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
		{"OTEL_SERVICE_NAME": "x"},
	} {
		tr, shutdown, err := fromEnv(context.Background(), "wharf", "v1", env(e))
		require.NoError(t, err)
		require.Nil(t, tr, "env %v", e)
		require.NoError(t, shutdown(context.Background()))
		require.False(t, enabled(env(e)))
	}
}

func TestFromEnvRefusesWhatItCannotDo(t *testing.T) {
	for e, want := range map[string]map[string]string{
		`OTEL_TRACES_EXPORTER="zipkin": unsupported exporter "zipkin"; use otlp, console or none`:               {"OTEL_TRACES_EXPORTER": "zipkin"},
		`OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported; use http/protobuf`:                           {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		`OTEL_PROPAGATORS="b3": unsupported propagator "b3"; use tracecontext, baggage or none`:                 {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_PROPAGATORS": "b3"},
		`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="thrift" is not supported; use http/protobuf (collector port 4318)`: {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
	} {
		tr, _, err := fromEnv(context.Background(), "wharf", "", env(want))
		require.Nil(t, tr)
		require.ErrorContains(t, err, e)
	}
}

// otlpReceiver is an OTLP/HTTP endpoint that records the requests it gets.
type otlpReceiver struct {
	mu    sync.Mutex
	paths []string
	types []string
	sizes []int
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.paths = append(r.paths, req.URL.Path)
	r.types = append(r.types, req.Header.Get("Content-Type"))
	r.sizes = append(r.sizes, len(b))
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func TestFromEnvExportsOverOTLPHTTP(t *testing.T) {
	rec := &otlpReceiver{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "relay-under-test")
	require.True(t, Enabled())

	tr, shutdown, err := FromEnv(context.Background(), "wharf", "v0.0.1")
	require.NoError(t, err)
	require.NotNil(t, tr)
	m := &wharf.Message{ID: "x", Topic: "orders"}
	_, done := tr.Publish(context.Background(), "null", []*wharf.Message{m})
	done(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx), "shutdown flushes the span")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.paths, "no OTLP request arrived")
	require.Equal(t, "/v1/traces", rec.paths[0])
	require.Equal(t, "application/x-protobuf", rec.types[0])
	require.Positive(t, rec.sizes[0])
}

func TestBaggageTravelsFromProducerToConsumer(t *testing.T) {
	tp, _ := newProvider(t)
	tr := New(WithTracerProvider(tp))
	m := &wharf.Message{ID: "x", Topic: "t", Headers: map[string]string{}}
	tr.Enqueue(context.Background(), m)
	m.Headers["baggage"] = "tenant=acme"
	_, done := tr.Publish(context.Background(), "s", []*wharf.Message{m})
	require.Equal(t, "tenant=acme", m.Headers["baggage"])
	require.NotEmpty(t, m.Headers["traceparent"])
	done(nil)
	require.Equal(t, map[string]string{"baggage": "tenant=acme"}, m.Headers)
}
