package wharfconsole_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
	"github.com/wharfhq/wharf/wharfflow"
)

// Mount the console under /console/ of the application's server, behind a
// token, with the Flows pages.
func ExampleHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	client, err := wharf.NewClient(pool, &wharf.Config{})
	if err != nil {
		log.Fatal(err)
	}
	flows, err := wharfflow.NewClient(pool, client.Schema())
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", wharfconsole.Handler(client,
		wharfconsole.WithToken(os.Getenv("CONSOLE_TOKEN")), wharfconsole.WithFlows(flows))))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
