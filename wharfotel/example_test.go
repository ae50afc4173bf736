package wharfotel_test

import (
	"context"
	"fmt"
	"log"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfotel"
)

// The tracer stores the caller's trace context in a message's headers at
// enqueue; the relay's publish span is its child, and the headers the sink
// sends carry the publish span's context to the consumer. Here the tracer's
// two calls, which the client and the relay make, are made directly.
func ExampleNew() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	tracer := wharfotel.New(wharfotel.WithTracerProvider(tp))
	// In an application: wharf.NewClient(pool, &wharf.Config{Tracer: tracer, ...}).

	ctx, request := tp.Tracer("shop").Start(context.Background(), "POST /orders")
	msg := &wharf.Message{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}
	tracer.Enqueue(ctx, msg) // what Client.EnqueueTx does
	request.End()

	_, end := tracer.Publish(context.Background(), "wharfkafka", []*wharf.Message{msg}) // what the relay does
	sent := msg.Headers["traceparent"]                                                  // what the sink sends
	end(nil)

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, s.SpanKind, "same trace:", s.SpanContext.TraceID() == request.SpanContext().TraceID(),
			"child of the request:", s.Parent.SpanID() == request.SpanContext().SpanID())
	}
	publish := spans.GetSpans()[1].SpanContext
	fmt.Println("the sink sends the publish span's context:",
		sent == "00-"+publish.TraceID().String()+"-"+publish.SpanID().String()+"-01")
	// Output:
	// POST /orders internal same trace: true child of the request: false
	// orders publish producer same trace: true child of the request: true
	// the sink sends the publish span's context: true
}

// Export spans as the standard OpenTelemetry environment variables say
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...), and flush them
// on the way out.
func ExampleFromEnv() {
	ctx := context.Background()
	tracer, shutdown, err := wharfotel.FromEnv(ctx, "checkout-service", "1.4.2")
	if err != nil {
		log.Fatal(err)
	}
	defer shutdown(ctx) //nolint:errcheck
	_ = &wharf.Config{Tracer: tracer}
}
