package wharf_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
)

// Route topics to different sinks by pattern: "*" is one dot-separated
// segment, a final "**" one or more; the first matching route wins.
func ExampleNewRouter() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	var mu sync.Mutex
	got := map[string][]string{}
	sinkNamed := func(name string) wharf.Sink {
		return wharf.NewHandlerSink(func(_ context.Context, m *wharf.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[name] = append(got[name], m.Topic)
			return nil
		}, 1)
	}
	router, err := wharf.NewRouter(
		wharf.Route{Pattern: "orders.*", Sink: sinkNamed("orders")},
		wharf.Route{Pattern: "**", Sink: sinkNamed("everything else")},
	)
	if err != nil {
		panic(err)
	}
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Sink: router, Logger: testLogger()})
	if err != nil {
		panic(err)
	}
	if _, err := client.Enqueue(ctx,
		wharf.Message{Topic: "orders.paid", Key: "1", Payload: []byte("{}")},
		wharf.Message{Topic: "orders.eu.paid", Key: "2", Payload: []byte("{}")},
		wharf.Message{Topic: "audit", Payload: []byte("{}")},
	); err != nil {
		panic(err)
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	for _, name := range []string{"orders", "everything else"} {
		sort.Strings(got[name])
		fmt.Printf("%s: %s\n", name, strings.Join(got[name], ", "))
	}
	// Output:
	// orders: orders.paid
	// everything else: audit, orders.eu.paid
}
