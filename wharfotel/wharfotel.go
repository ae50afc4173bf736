// Package wharfotel traces messages through the outbox with OpenTelemetry: a
// [wharf.Tracer] for [wharf.Config.Tracer].
//
// At enqueue ([wharf.Client.EnqueueTx], EnqueueSQLTx, Enqueue) the tracer
// writes the trace context of the caller's ctx (W3C traceparent and
// tracestate, with the default propagator) into the message's headers, which
// are stored with it in the outbox. When the relay publishes the message, the
// tracer starts one span per message — kind producer, named "<topic>
// publish" — as a child of that stored context, and writes the span's own
// context into the headers the sink sends, so a consumer that extracts the
// trace context from the Kafka record headers, NATS headers, AMQP headers,
// Redis "h:traceparent" field or webhook HTTP headers continues the same
// trace: request → enqueue → relay publish → consumer.
//
// The relay's span is a child of the producer's context, not a root span
// linked to it: each span carries exactly one message, so it has exactly one
// producer context, and being in the producer's trace is what lets a trace
// view show the whole path, including how long the message waited in the
// outbox (the gap between the enqueuing span and the publish span). A
// message enqueued without a trace in its ctx gets a root span. Every attempt
// of a message is a sibling under the producer's context: the stored headers
// are put back after each sink call, so a retry never hangs under the
// previous attempt's span.
//
// Span attributes: messaging.system=wharf, messaging.operation.type=send,
// messaging.operation.name=publish, messaging.destination.name (the topic),
// messaging.message.id (the message id, the destination's deduplication id),
// messaging.message.body.size, wharf.sink (the sink's name) and wharf.attempt
// (1 on the first delivery). A failed message ends its span with an error
// status and the error recorded; wharf.permanent=true marks a failure that
// dead-letters it at once, wharf.duplicate=true a destination that already
// held the message (a success). The message key is not recorded: it may be
// personal data.
//
// The same Tracer traces flows (package wharfflow): as
// wharfflow.Config.Tracer it makes a span of each executed step, and a
// wharfflow client built wharfflow.WithTracer stores the starting request's
// trace context with each start, so the steps' spans are its children (see
// [Tracer.Step]).
//
// [FromEnv] builds the tracer and an OTLP exporter from the standard OTEL_*
// environment variables, for the wharf CLI; it returns a nil Tracer (no
// tracing, no cost) unless those variables ask for tracing.
package wharfotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

// ScopeName is the instrumentation scope of the spans this package starts.
const ScopeName = "github.com/wharfhq/wharf/wharfotel"

// Option configures [New].
type Option func(*Tracer)

// WithTracerProvider sets the provider of the relay's spans. Defaults to the
// global provider (otel.GetTracerProvider) at the time New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(t *Tracer) { t.provider = tp }
}

// WithPropagator sets how trace context is written to and read from message
// headers. Defaults to the global propagator (otel.GetTextMapPropagator) when
// one is set when New is called, else W3C Trace Context and Baggage.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(t *Tracer) { t.prop = p }
}

// Tracer is a [wharf.Tracer] built on OpenTelemetry. Build it with [New].
type Tracer struct {
	provider trace.TracerProvider
	prop     propagation.TextMapPropagator
	tracer   trace.Tracer
	fields   []string
}

var _ wharf.Tracer = (*Tracer)(nil)

// New returns a tracer for [wharf.Config.Tracer].
func New(opts ...Option) *Tracer {
	t := &Tracer{}
	for _, o := range opts {
		o(t)
	}
	if t.provider == nil {
		t.provider = otel.GetTracerProvider()
	}
	if t.prop == nil {
		t.prop = otel.GetTextMapPropagator()
		// The global propagator is a no-op until an application sets one:
		// tracing would then silently stop at the outbox.
		if len(t.prop.Fields()) == 0 {
			t.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		}
	}
	t.tracer = t.provider.Tracer(ScopeName)
	t.fields = t.prop.Fields()
	return t
}

// Enqueue writes the trace context of ctx into the message's headers (its
// own copy: the caller's map is not changed). A ctx without a trace writes
// nothing.
func (t *Tracer) Enqueue(ctx context.Context, m *wharf.Message) {
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	t.prop.Inject(ctx, propagation.MapCarrier(m.Headers))
}

// Publish starts one producer span per message, each a child of the trace
// context in the message's headers, and replaces that context in the headers
// with the span's for the sink call. The function it returns ends the spans
// with the results and puts the stored headers back. The context it returns
// is ctx: a batch holds many traces, so none of them is the batch's.
func (t *Tracer) Publish(ctx context.Context, sink string, msgs []*wharf.Message) (context.Context, func(errs []error)) {
	spans := make([]trace.Span, len(msgs))
	saved := make([]stored, len(msgs))
	for i, m := range msgs {
		parent := t.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
		sctx, span := t.tracer.Start(parent, m.Topic+" publish",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "wharf"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.operation.name", "publish"),
				attribute.String("messaging.destination.name", m.Topic),
				attribute.String("messaging.message.id", m.ID),
				attribute.Int("messaging.message.body.size", len(m.Payload)),
				attribute.String("wharf.sink", sink),
				attribute.Int("wharf.attempt", m.Attempt),
			))
		spans[i] = span
		saved[i] = t.save(m)
		// sctx holds the producer's baggage too, so it travels on unchanged.
		t.prop.Inject(sctx, propagation.MapCarrier(m.Headers))
	}
	return ctx, func(errs []error) {
		for i, span := range spans {
			var err error
			if i < len(errs) {
				err = errs[i]
			}
			end(span, err)
			t.restore(msgs[i], saved[i])
		}
	}
}

func end(span trace.Span, err error) {
	switch {
	case err == nil:
	case errors.Is(err, wharf.ErrDuplicate):
		span.SetAttributes(attribute.Bool("wharf.duplicate", true))
	default:
		if wharf.IsPermanent(err) {
			span.SetAttributes(attribute.Bool("wharf.permanent", true))
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// stored is a message's trace headers as the outbox holds them.
type stored struct {
	nilMap bool
	values map[string]string // field -> value; absent fields are deleted on restore
}

func (t *Tracer) save(m *wharf.Message) stored {
	if m.Headers == nil {
		m.Headers = map[string]string{}
		return stored{nilMap: true}
	}
	var s stored
	for _, f := range t.fields {
		if v, ok := m.Headers[f]; ok {
			if s.values == nil {
				s.values = make(map[string]string, len(t.fields))
			}
			s.values[f] = v
		}
	}
	return s
}

// restore puts the stored trace headers back, so the next attempt is again a
// child of the producer and not of this attempt's span.
func (t *Tracer) restore(m *wharf.Message, s stored) {
	if s.nilMap {
		m.Headers = nil
		return
	}
	for _, f := range t.fields {
		if v, ok := s.values[f]; ok {
			m.Headers[f] = v
		} else {
			delete(m.Headers, f)
		}
	}
}

var _ wharfflow.Tracer = (*Tracer)(nil)

// Inject writes the trace context of ctx into carrier: a wharfflow client
// built with wharfflow.WithTracer stores it with each start.
func (t *Tracer) Inject(ctx context.Context, carrier map[string]string) {
	t.prop.Inject(ctx, propagation.MapCarrier(carrier))
}

// Step starts the span of one executed flow step, named "wharf.flow.step
// <flow>/<step>", a child of the trace context in carrier (its instance's
// start, or its nearest ancestor's; a root span when there is none), with
// the attributes wharf.flow, wharf.flow.instance, wharf.flow.step and
// wharf.flow.attempt (0 on the first run), and wharf.flow.outcome when it
// ends. A step that fails or retries ends it with an error status and the
// error recorded. The state and signal payloads are not recorded: they may
// be personal data.
func (t *Tracer) Step(ctx context.Context, s wharfflow.StepInfo, carrier map[string]string) (context.Context, func(outcome string, err error)) {
	parent := ctx
	if len(carrier) > 0 {
		parent = t.prop.Extract(ctx, propagation.MapCarrier(carrier))
	}
	sctx, span := t.tracer.Start(parent, "wharf.flow.step "+s.Flow+"/"+s.Step,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			attribute.String("wharf.flow", s.Flow),
			attribute.Int64("wharf.flow.instance", s.Instance),
			attribute.String("wharf.flow.step", s.Step),
			attribute.Int("wharf.flow.attempt", s.Attempt),
		))
	return sctx, func(outcome string, err error) {
		span.SetAttributes(attribute.String("wharf.flow.outcome", outcome))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
