package wharf_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
)

// A handler refuses a message with wharf.Permanent: it moves to the
// dead-letter table at once. Once the cause is fixed, RetryDeadLetters puts
// it back, with its id, and the relay delivers it.
func ExampleClient_RetryDeadLetters() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	fixed := false
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema,
		Logger: testLogger(),
		Handler: func(_ context.Context, m *wharf.Message) error {
			if !fixed {
				return wharf.Permanent(errors.New("unknown customer"))
			}
			fmt.Printf("delivered %s %s\n", m.Topic, m.Payload)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	ids, err := client.Enqueue(ctx, wharf.Message{Topic: "invoices", Key: "c-7", Payload: []byte(`{"customer":"c-7"}`)})
	if err != nil {
		panic(err)
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	if err != nil {
		panic(err)
	}
	fmt.Printf("dead: %s after %d attempt: %s\n", dead[0].Topic, dead[0].Attempts, dead[0].LastError)
	fmt.Println("same id:", dead[0].ID == ids[0])

	fixed = true
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{IDs: ids})
	if err != nil {
		panic(err)
	}
	fmt.Println("retried:", n)
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	// Output:
	// dead: invoices after 1 attempt: permanent: unknown customer
	// same id: true
	// retried: 1
	// delivered invoices {"customer":"c-7"}
}
