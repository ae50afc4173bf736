package wharfprom_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfprom"
)

// Serve a relay's metrics on /metrics and its probes on /healthz and
// /readyz, next to the relay in the application's process.
func ExampleHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	client, err := wharf.NewClient(pool, &wharf.Config{Handler: func(ctx context.Context, m *wharf.Message) error { return nil }})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck
	log.Fatal(http.ListenAndServe(":9750", wharfprom.Handler(client, wharfprom.WithVersion("1.4.2"))))
}

// Add the relay's metrics to a registry the application already serves.
func ExampleNewCollector() {
	client, err := wharf.NewClient(nil, &wharf.Config{})
	if err != nil {
		log.Fatal(err)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(wharfprom.NewCollector(client))
}
