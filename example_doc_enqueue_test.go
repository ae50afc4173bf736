package wharf_test

// Code of docs/enqueue.md and the README's enqueue example: the docs paste
// these lines, so change both. Compiled by go test; run by the examples and
// tests they mirror (Example_enqueueTx, the EnqueueSQLTx tests).

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
)

// markPaid is the README's enqueue example: the order's update and its
// outbox message commit together.
func markPaid(ctx context.Context, pool *pgxpool.Pool, client *wharf.Client, orderID, traceID string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The UPDATE locks the order's row: writes to its key are serialised,
		// so the outbox's order is the commit order (see Keys and order).
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, orderID); err != nil {
			return err
		}
		_, err := client.EnqueueTx(ctx, tx, wharf.Message{
			Topic:   "orders.paid",
			Key:     orderID, // the ordering scope
			Payload: []byte(`{"order":"` + orderID + `","amount":1999}`),
			Headers: map[string]string{"trace-id": traceID},
		})
		return err
	})
}

// newProducer is a client that only enqueues: no Handler or Sink needed.
func newProducer(pool *pgxpool.Pool) (*wharf.Client, error) {
	return wharf.NewClient(pool, &wharf.Config{}) // Schema "wharf" by default
}

// enqueueOptions shows the optional fields of a message.
func enqueueOptions(ctx context.Context, tx pgx.Tx, client *wharf.Client) ([]string, error) {
	return client.EnqueueTx(ctx, tx,
		wharf.Message{Topic: "orders.created", Key: "42", Payload: []byte(`{"order":42}`)},
		wharf.Message{
			Topic:     "orders.reminder",
			Key:       "42",
			Payload:   []byte(`{"order":42}`),
			DeliverAt: time.Now().Add(24 * time.Hour), // not delivered before then
			DedupKey:  "reminder-42",                  // a second enqueue with this key is a no-op
		})
}

// enqueueSQL enqueues through database/sql (any PostgreSQL driver).
func enqueueSQL(ctx context.Context, db *sql.DB, client *wharf.Client, body []byte) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "42"); err != nil {
		return err
	}
	if _, err := client.EnqueueSQLTx(ctx, tx, wharf.Message{Topic: "orders.paid", Key: "42", Payload: body}); err != nil {
		return err
	}
	return tx.Commit()
}

var (
	_ = markPaid
	_ = newProducer
	_ = enqueueOptions
	_ = enqueueSQL
)
