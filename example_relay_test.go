package wharf_test

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/wharfhq/wharf"
)

// A relay delivers to a Go function: Start runs it in the background until
// Stop. The handler runs once per message (again after a retry), so it must
// be idempotent; returning an error retries the message later.
func ExampleClient_Start() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	delivered := make(chan string)
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema,
		Logger: testLogger(),
		Handler: func(ctx context.Context, m *wharf.Message) error {
			select {
			case delivered <- fmt.Sprintf("%s %s %s", m.Topic, m.Key, m.Payload):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer client.Stop(ctx) //nolint:errcheck

	if _, err := client.Enqueue(ctx, wharf.Message{Topic: "users.signed-up", Key: "u-1", Payload: []byte(`{"user":"u-1"}`)}); err != nil {
		panic(err)
	}
	fmt.Println(<-delivered)
	// Output:
	// users.signed-up u-1 {"user":"u-1"}
}

// Messages with the same topic and key are delivered in enqueue order;
// headers travel with the message to the sink (a Kafka header, an AMQP
// header, a NATS header, an HTTP header...).
func ExampleClient_Enqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:             schema,
		Logger:             testLogger(),
		HandlerConcurrency: 1,
		Handler: func(_ context.Context, m *wharf.Message) error {
			fmt.Printf("%s key=%s tenant=%s %s\n", m.Topic, m.Key, m.Headers["tenant"], m.Payload)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	headers := map[string]string{"tenant": "acme"}
	if _, err := client.Enqueue(ctx,
		wharf.Message{Topic: "carts", Key: "cart-9", Headers: headers, Payload: []byte(`{"add":"book"}`)},
		wharf.Message{Topic: "carts", Key: "cart-9", Headers: headers, Payload: []byte(`{"add":"lamp"}`)},
		wharf.Message{Topic: "carts", Key: "cart-9", Headers: headers, Payload: []byte(`{"remove":"book"}`)},
	); err != nil {
		panic(err)
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	// Output:
	// carts key=cart-9 tenant=acme {"add":"book"}
	// carts key=cart-9 tenant=acme {"add":"lamp"}
	// carts key=cart-9 tenant=acme {"remove":"book"}
}

// Enqueue from database/sql (here with pgx's stdlib driver; any PostgreSQL
// driver works) in the transaction that changes the business data.
func ExampleClient_EnqueueSQLTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema,
		Logger: testLogger(),
		Handler: func(_ context.Context, m *wharf.Message) error {
			fmt.Printf("%s %s\n", m.Topic, m.Payload)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	// ... UPDATE accounts SET ... in tx ...
	if _, err := client.EnqueueSQLTx(ctx, tx, wharf.Message{Topic: "accounts.closed", Key: "a-3", Payload: []byte(`{"account":"a-3"}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	// Output:
	// accounts.closed {"account":"a-3"}
}

// A message with a DedupKey is enqueued once: a second enqueue with the same
// key while the first is still in the outbox is a no-op that returns the
// first message's id.
func ExampleMessage_dedupKey() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	var got []string
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:             schema,
		Logger:             testLogger(),
		HandlerConcurrency: 1,
		Handler: func(_ context.Context, m *wharf.Message) error {
			got = append(got, string(m.Payload))
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	var ids []string
	for range 2 { // e.g. a webhook the provider sent twice
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := client.EnqueueTx(ctx, tx, wharf.Message{Topic: "payments", Key: "p-5", DedupKey: "psp-evt-77", Payload: []byte(`{"payment":"p-5"}`)})
			ids = append(ids, id...)
			return err
		})
		if err != nil {
			panic(err)
		}
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	fmt.Println("same id:", ids[0] == ids[1])
	fmt.Println("delivered:", got)
	// Output:
	// same id: true
	// delivered: [{"payment":"p-5"}]
}
