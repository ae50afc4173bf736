package wharfotel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/wharfhq/wharf"
)

// Enabled reports whether the environment asks for tracing (see [FromEnv]),
// without building anything.
func Enabled() bool { return enabled(os.Getenv) }

func enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if ex := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); ex != "" {
		return !strings.EqualFold(ex, "none")
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv returns a Tracer that exports the relay's spans as the standard
// OpenTelemetry environment variables say, and a function that flushes the
// spans not yet exported and stops the exporter (call it on the way out).
//
// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter, or
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set;
// OTEL_SDK_DISABLED=true turns it off. Off, FromEnv returns a nil Tracer and
// a shutdown that does nothing, starts nothing, and leaves
// [wharf.Config.Tracer] nil, which costs the relay nothing.
//
//   - OTEL_TRACES_EXPORTER: "otlp" (the default), "console" (spans as JSON
//     on standard error, for a look), "none"; several separated by commas.
//   - OTEL_EXPORTER_OTLP_PROTOCOL / OTEL_EXPORTER_OTLP_TRACES_PROTOCOL:
//     "http/protobuf" (the default, port 4318) or "grpc" (port 4317).
//   - OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION,
//     _CERTIFICATE, _CLIENT_KEY, _CLIENT_CERTIFICATE, _INSECURE: read by the
//     OTLP exporter.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES: the resource
//     (service.name defaults to serviceName).
//   - OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG: the sampler (default:
//     parentbased_always_on, so a sampled producer's messages are traced).
//   - OTEL_BSP_*: the batch span processor's queue and delays.
//   - OTEL_PROPAGATORS: "tracecontext" and "baggage" (the default is both),
//     or "none".
//
// The global OpenTelemetry provider and propagator are left as they are.
func FromEnv(ctx context.Context, serviceName, version string) (wharf.Tracer, func(context.Context) error, error) {
	return fromEnv(ctx, serviceName, version, os.Getenv)
}

func fromEnv(ctx context.Context, serviceName, version string, getenv func(string) string) (wharf.Tracer, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	if !enabled(getenv) {
		return nil, noop, nil
	}
	prop, err := propagatorFromEnv(getenv)
	if err != nil {
		return nil, noop, err
	}
	names := splitList(getenv("OTEL_TRACES_EXPORTER"))
	if len(names) == 0 {
		names = []string{"otlp"}
	}
	var exporters []sdktrace.SpanExporter
	shutdownAll := func() {
		for _, e := range exporters {
			_ = e.Shutdown(context.WithoutCancel(ctx))
		}
	}
	for _, name := range names {
		var exp sdktrace.SpanExporter
		switch name {
		case "otlp":
			exp, err = otlpExporter(ctx, getenv)
		case "console":
			exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
		case "none":
			continue
		default:
			err = fmt.Errorf("wharfotel: OTEL_TRACES_EXPORTER=%q: unsupported exporter %q; use otlp, console or none", getenv("OTEL_TRACES_EXPORTER"), name)
		}
		if err != nil {
			shutdownAll()
			return nil, noop, err
		}
		exporters = append(exporters, exp)
	}
	if len(exporters) == 0 { // "none" in a list
		return nil, noop, nil
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", serviceName)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// Later detectors win: the environment's service name beats ours.
	res, err := resource.New(ctx,
		resource.WithAttributes(attrs...),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		shutdownAll()
		return nil, noop, fmt.Errorf("wharfotel: OTEL_RESOURCE_ATTRIBUTES or OTEL_SERVICE_NAME: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, e := range exporters {
		opts = append(opts, sdktrace.WithBatcher(e))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return New(WithTracerProvider(tp), WithPropagator(prop)), tp.Shutdown, nil
}

func otlpExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, name = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL")), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch proto {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("wharfotel: %s=%q is not supported; use http/protobuf (collector port 4318) or grpc (port 4317)", name, proto)
	}
}

func propagatorFromEnv(getenv func(string) string) (propagation.TextMapPropagator, error) {
	names := splitList(getenv("OTEL_PROPAGATORS"))
	if len(names) == 0 {
		names = []string{"tracecontext", "baggage"}
	}
	var props []propagation.TextMapPropagator
	for _, n := range names {
		switch n {
		case "tracecontext":
			props = append(props, propagation.TraceContext{})
		case "baggage":
			props = append(props, propagation.Baggage{})
		case "none":
		default:
			return nil, fmt.Errorf("wharfotel: OTEL_PROPAGATORS=%q: unsupported propagator %q; use tracecontext, baggage or none", getenv("OTEL_PROPAGATORS"), n)
		}
	}
	return propagation.NewCompositeTextMapPropagator(props...), nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.ToLower(strings.TrimSpace(p)); p != "" {
			out = append(out, p)
		}
	}
	return out
}
