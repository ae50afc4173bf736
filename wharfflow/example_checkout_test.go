package wharfflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

type Order struct {
	ID      string   `json:"id"`
	Items   []string `json:"items"`
	Shipped []string `json:"shipped"`
}

type Parcel struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

// A checkout: reserve, await the payment signal (an hour at most), ship each
// item in a child flow, then emit an "order shipped" outbox message in the
// same transaction as the outcome.
func Example_checkout() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, databaseURL)
	defer pool.Close()
	schema := "example_checkout"
	m, _ := wharfmigrate.New(schema)
	_, _ = m.Up(ctx, pool)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	shipping := wharfflow.New[Parcel]("shipping", nil).
		Step("ship", func(ctx context.Context, p *Parcel, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	checkout := wharfflow.New[Order]("checkout", nil).
		Step("reserve", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment-captured").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			var parcels []wharfflow.Child
			for _, item := range o.Items {
				parcels = append(parcels, shipping.Child(Parcel{Order: o.ID, Item: item}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("shipped", parcels...)
		}).
		Step("shipped", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			for _, c := range in.Children {
				var item string
				_ = json.Unmarshal(c.Result, &item)
				o.Shipped = append(o.Shipped, item)
			}
			return wharfflow.Done(o).Emit(wharf.Message{
				Topic: "orders", Key: o.ID, Payload: []byte(`{"order":"` + o.ID + `","status":"shipped"}`),
			})
		}).
		Step("expire", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("no payment within an hour"))
		})

	client, _ := wharfflow.NewClient(pool, schema)
	runner, _ := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{checkout, shipping}})
	_ = runner.Start(ctx)
	defer runner.Stop(ctx) //nolint:errcheck

	// Start the checkout in the transaction that stores the order.
	var id int64
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ...
		ids, err := client.StartTx(ctx, tx, checkout.Start(Order{ID: "o-1", Items: []string{"book", "lamp"}},
			wharfflow.StartOptions{Key: "o-1"}))
		id = ids[0]
		return err
	})
	// The payment provider's webhook, in its own transaction.
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := client.SignalTx(ctx, tx, wharfflow.Signal{Flow: "checkout", Key: "o-1", Name: "payment-captured",
			Payload: map[string]int{"cents": 4200}, DedupKey: "psp-evt-981"})
		return err
	})

	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done, _ := client.Wait(waitCtx, id, 10*time.Millisecond)
	fmt.Println(done.Status, string(done.Result))
	var topic, payload string
	_ = pool.QueryRow(ctx, "SELECT topic, convert_from(payload, 'UTF8') FROM "+schema+".outbox").Scan(&topic, &payload)
	fmt.Println(topic, payload)
	// Output:
	// done {"id": "o-1", "items": ["book", "lamp"], "shipped": ["book", "lamp"]}
	// orders {"order":"o-1","status":"shipped"}
}
