package wharfflow_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfotel"
)

type traced struct {
	ID string `json:"id"`
}

// With a tracer, each executed step is a span named after its flow and
// step, with its instance, attempt and outcome, in the trace of the request
// that started the instance: a child of the start's span, for the steps of
// its child flows too. A retried step is two spans, the first with the
// error. An instance started without a trace gets root spans. A message a
// step emits carries the step span's context, so its delivery span is that
// step's child.
func TestStepSpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := wharfotel.New(wharfotel.WithTracerProvider(tp), wharfotel.WithPropagator(propagation.TraceContext{}))

	parcel := wharfflow.New[traced]("parcel", nil).
		Step("ship", func(context.Context, *traced, wharfflow.Input) wharfflow.Outcome { return wharfflow.Done("shipped") })
	order := wharfflow.New[traced]("order", nil).
		Step("reserve", func(_ context.Context, _ *traced, in wharfflow.Input) wharfflow.Outcome {
			if in.Attempt == 0 {
				return wharfflow.RetryAfter(errors.New("stock service busy"), time.Millisecond)
			}
			return wharfflow.Await("paid", "paid")
		}).
		Step("paid", func(_ context.Context, o *traced, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("shipped", parcel.Child(traced{ID: o.ID + "/a"}, wharfflow.Options{}),
				parcel.Child(traced{ID: o.ID + "/b"}, wharfflow.Options{}))
		}).
		Step("shipped", func(_ context.Context, o *traced, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o).Emit(wharf.Message{Topic: "orders", Key: o.ID, Payload: []byte(`{}`)})
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{order, parcel}, Tracer: tracer})

	// One instance started in a traced request, one without a trace.
	client, err := wharfflow.NewClient(b.pool, b.schema, wharfflow.WithTracer(tracer))
	require.NoError(t, err)
	reqCtx, req := tp.Tracer("test").Start(ctx, "POST /orders")
	var ids []int64
	require.NoError(t, pgx.BeginFunc(reqCtx, b.pool, func(tx pgx.Tx) error {
		ids, err = client.StartTx(reqCtx, tx, order.Start(traced{ID: "o-1"}, wharfflow.StartOptions{Key: "o-1"}))
		return err
	}))
	req.End()
	plain, err := client.Start(ctx, order.Start(traced{ID: "o-2"}, wharfflow.StartOptions{Key: "o-2"}))
	require.NoError(t, err)
	_, err = client.Send(ctx, wharfflow.Signal{Flow: "order", Key: "o-1", Name: "paid"}, wharfflow.Signal{Flow: "order", Key: "o-2", Name: "paid"})
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, id := range []int64{ids[0], plain[0]} {
		got, err := client.Wait(waitCtx, id, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, "done", got.Status)
	}

	spans := exp.GetSpans()
	slices.SortFunc(spans, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	of := func(flow string, instance int64) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range spans {
			a := spanAttrs(s)
			if a["wharf.flow"].AsString() == flow && (instance == 0 || a["wharf.flow.instance"].AsInt64() == instance) {
				out = append(out, s)
			}
		}
		return out
	}
	type step struct {
		name, outcome string
		attempt       int64
	}
	steps := func(ss []tracetest.SpanStub) []step {
		var out []step
		for _, s := range ss {
			a := spanAttrs(s)
			require.Equal(t, a["wharf.flow"].AsString()+"/"+a["wharf.flow.step"].AsString(), strings.TrimPrefix(s.Name, "wharf.flow.step "))
			out = append(out, step{s.Name, a["wharf.flow.outcome"].AsString(), a["wharf.flow.attempt"].AsInt64()})
		}
		return out
	}
	want := []step{
		{"wharf.flow.step order/reserve", "retry", 0}, {"wharf.flow.step order/reserve", "await", 1},
		{"wharf.flow.step order/paid", "spawn", 0}, {"wharf.flow.step order/shipped", "done", 0},
	}

	// The traced instance: its steps and its children's are children of the request's span.
	tracedSteps := of("order", ids[0])
	require.Equal(t, want, steps(tracedSteps))
	var children []tracetest.SpanStub
	for _, s := range of("parcel", 0) {
		if s.SpanContext.TraceID() == req.SpanContext().TraceID() {
			children = append(children, s)
		}
	}
	require.Len(t, children, 2, "each child's step is traced under the parent's start")
	for _, s := range append(slices.Clone(tracedSteps), children...) {
		require.Equal(t, req.SpanContext().TraceID(), s.SpanContext.TraceID(), s.Name)
		require.Equal(t, req.SpanContext().SpanID(), s.Parent.SpanID(), "%s is a child of the start's span", s.Name)
	}
	require.Equal(t, codes.Error, tracedSteps[0].Status.Code)
	require.Equal(t, "stock service busy", tracedSteps[0].Status.Description)
	require.Len(t, tracedSteps[0].Events, 1, "the retried step's error is recorded")
	require.Equal(t, codes.Unset, tracedSteps[1].Status.Code)

	// The untraced instance: the same steps, root spans of their own traces.
	plainSteps := of("order", plain[0])
	require.Equal(t, want, steps(plainSteps))
	for _, s := range plainSteps {
		require.False(t, s.Parent.IsValid(), "%s: no start trace, a root span", s.Name)
		require.NotEqual(t, req.SpanContext().TraceID(), s.SpanContext.TraceID())
	}

	// The emitted message carries the emitting step's span context.
	var traceparent string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT headers->>'traceparent' FROM "+b.schema+".outbox WHERE key = 'o-1'").Scan(&traceparent))
	shipped := tracedSteps[3]
	require.Equal(t, "00-"+shipped.SpanContext.TraceID().String()+"-"+shipped.SpanContext.SpanID().String()+"-01", traceparent)
}

func spanAttrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}
