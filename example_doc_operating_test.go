package wharf_test

// Code of docs/operating.md: the doc pastes these lines, so change both.
// Compiled by go test; the console, metrics and tracing are tested in their
// packages.

import (
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfotel"
	"github.com/wharfhq/wharf/wharfprom"
)

// observe mounts the console, serves the metrics of the relay and of the
// flows, and traces enqueues, deliveries and flow steps.
func observe(mux *http.ServeMux, pool *pgxpool.Pool, token string, flowDefs []wharfflow.Definition) (*wharf.Client, *wharfflow.Runner, error) {
	tracer := wharfotel.New() // the global OpenTelemetry provider
	client, err := wharf.NewClient(pool, &wharf.Config{Handler: deliver, Tracer: tracer})
	if err != nil {
		return nil, nil, err
	}
	flows, err := wharfflow.NewClient(pool, "wharf", wharfflow.WithTracer(tracer))
	if err != nil {
		return nil, nil, err
	}
	flowMetrics := wharfflow.NewMetrics(pool, "wharf")
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{
		Flows: flowDefs, Metrics: flowMetrics, Tracer: tracer,
	})
	if err != nil {
		return nil, nil, err
	}
	prometheus.MustRegister(wharfprom.NewCollector(client), flowMetrics)
	mux.Handle("/metrics", promhttp.Handler())
	mux.Handle("/console/", http.StripPrefix("/console",
		wharfconsole.Handler(client, wharfconsole.WithToken(token), wharfconsole.WithFlows(flows))))
	return client, runner, nil
}

var _ = observe
