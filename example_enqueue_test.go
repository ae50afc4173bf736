package wharf_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// exampleSchema gives an example a migrated schema of its own and returns a
// function that drops it.
func exampleSchema(ctx context.Context, pool *pgxpool.Pool) (string, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "wx_" + hex.EncodeToString(b[:])
	m, err := wharfmigrate.New(schema)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		panic(err)
	}
	return schema, func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }
}

// Enqueue messages in the transaction that changes the business data, then
// relay them to a handler: only committed messages arrive, in order per
// topic and key.
func Example_enqueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema, drop := exampleSchema(ctx, pool)
	defer drop()

	var mu sync.Mutex
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema,
		Logger: testLogger(),
		Handler: func(_ context.Context, m *wharf.Message) error {
			mu.Lock()
			defer mu.Unlock()
			fmt.Printf("%s %s %s\n", m.Topic, m.Key, m.Payload)
			return nil
		},
		HandlerConcurrency: 1,
	})
	if err != nil {
		panic(err)
	}
	// Committed with the business data...
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := client.EnqueueTx(ctx, tx,
			wharf.Message{Topic: "orders.created", Key: "42", Payload: []byte(`{"order":42}`)},
			wharf.Message{Topic: "orders.paid", Key: "42", Payload: []byte(`{"order":42,"amount":1999}`)})
		return err
	})
	if err != nil {
		panic(err)
	}
	// ...and rolled back with it: never delivered.
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := client.EnqueueTx(ctx, tx, wharf.Message{Topic: "orders.created", Key: "43", Payload: []byte(`{"order":43}`)}); err != nil {
			return err
		}
		return fmt.Errorf("payment declined")
	})
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	// Unordered output:
	// orders.created 42 {"order":42}
	// orders.paid 42 {"order":42,"amount":1999}
}
