package wharf_test

// Code of docs/relay.md and the README's relay example: the docs paste these
// lines, so change both. Compiled by go test; the behaviour they show is
// tested by the relay and router tests and examples.

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfnats"
	"github.com/wharfhq/wharf/wharfwebhook"
)

var (
	errMalformed = errors.New("malformed order")
	errThrottled = errors.New("throttled")
)

// deliver stands for your publishing code.
func deliver(ctx context.Context, m *wharf.Message) error { return nil }

// startRelay runs a relay in this process that hands each message to a Go
// function; stop it with the returned function when the service shuts down.
func startRelay(ctx context.Context, pool *pgxpool.Pool) (stop func(context.Context) error, err error) {
	client, err := wharf.NewClient(pool, &wharf.Config{
		Handler: func(ctx context.Context, m *wharf.Message) error {
			err := deliver(ctx, m)
			switch {
			case errors.Is(err, errMalformed):
				return wharf.Permanent(err) // dead-letter now, no more attempts
			case errors.Is(err, errThrottled):
				return wharf.RetryAfter(30*time.Second, err) // retry no sooner than 30 s
			}
			return err // nil: acknowledged; any other error: retried with backoff
		},
		HandlerConcurrency: 16, // handler calls at once; one at a time per key
	})
	if err != nil {
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	return client.Stop, nil
}

// routedRelay sends orders.* to NATS JetStream and everything else to a
// signed webhook, as `--route` does on the command line.
func routedRelay(pool *pgxpool.Pool) (*wharf.Client, error) {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		return nil, err
	}
	toNATS, err := wharfnats.New(nc, wharfnats.Options{Stream: "ORDERS"})
	if err != nil {
		return nil, err
	}
	toHook, err := wharfwebhook.New(wharfwebhook.Options{
		URL:    "https://hooks.example.com/in/{{topic}}",
		Secret: os.Getenv("HOOK_SECRET"), // whsec_...
	})
	if err != nil {
		return nil, err
	}
	router, err := wharf.NewRouter(
		wharf.Route{Pattern: "orders.*", Sink: toNATS},
		wharf.Route{Pattern: "**", Sink: toHook},
	)
	if err != nil {
		return nil, err
	}
	return wharf.NewClient(pool, &wharf.Config{Sink: router})
}

var (
	_ = startRelay
	_ = routedRelay
)
