package wharf_test

// The code of docs/getting-started.md (and the README's examples that come
// from it), run as an example: the docs paste these lines, so change both.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

// Order is a row of the orders table.
type Order struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
}

// Fulfilment is the state of one order's fulfilment flow, saved as JSON
// after every step.
type Fulfilment struct {
	OrderID string `json:"order_id"`
	Charged bool   `json:"charged"`
	Parcel  string `json:"parcel,omitempty"`
}

// fulfilment charges the order, waits until the warehouse signals that it
// packed the parcel, then ships it and tells the outbox.
var fulfilment = wharfflow.New[Fulfilment]("fulfilment", nil).
	Step("charge", func(ctx context.Context, f *Fulfilment, in wharfflow.Input) wharfflow.Outcome {
		// Call the payment provider here with in.IdempotencyKey: a step runs
		// again if its runner dies before the step's outcome is committed.
		f.Charged = true
		return wharfflow.Await("ship", "packed")
	}).
	Step("ship", func(ctx context.Context, f *Fulfilment, in wharfflow.Input) wharfflow.Outcome {
		var packed struct {
			Parcel string `json:"parcel"`
		}
		if err := json.Unmarshal(in.Signals[0].Payload, &packed); err != nil {
			return wharfflow.Fail(err)
		}
		f.Parcel = packed.Parcel
		// The outcome and this message commit in one transaction.
		return wharfflow.Done(f).Emit(wharf.Message{
			Topic:   "orders.shipped",
			Key:     f.OrderID,
			Payload: []byte(`{"order":"` + f.OrderID + `","parcel":"` + f.Parcel + `"}`),
		})
	})

// placeOrder stores the order, enqueues "orders.placed" and starts the
// order's fulfilment in one transaction: all three happen, or none does.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, outbox *wharf.Client, flows *wharfflow.Client, o Order) (flowID int64, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, cents) VALUES ($1, $2)`, o.ID, o.Cents); err != nil {
			return err
		}
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		if _, err := outbox.EnqueueTx(ctx, tx, wharf.Message{Topic: "orders.placed", Key: o.ID, Payload: payload}); err != nil {
			return err
		}
		ids, err := flows.StartTx(ctx, tx, fulfilment.Start(Fulfilment{OrderID: o.ID}, wharfflow.StartOptions{Key: o.ID}))
		if err != nil {
			return err
		}
		flowID = ids[0]
		return nil
	})
	return flowID, err
}

// run wires the tutorial together: a relay that hands every message to a Go
// function, a flow runner, one order and the warehouse's signal.
func run(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var mu sync.Mutex
	outbox, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema, // "wharf" unless you migrated another schema
		Handler: func(ctx context.Context, m *wharf.Message) error {
			mu.Lock()
			defer mu.Unlock()
			fmt.Printf("%s %s %s\n", m.Topic, m.Key, m.Payload)
			return nil // acknowledged: the message leaves the outbox
		},
	})
	if err != nil {
		return err
	}
	flows, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return err
	}
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{fulfilment}})
	if err != nil {
		return err
	}
	if err := runner.Start(ctx); err != nil {
		return err
	}
	defer runner.Stop(context.Background()) //nolint:errcheck

	id, err := placeOrder(ctx, pool, outbox, flows, Order{ID: "o-1", Cents: 4200})
	if err != nil {
		return err
	}
	// The warehouse packed the parcel: signal the order's flow by its key.
	_, err = flows.Send(ctx, wharfflow.Signal{
		Flow: "fulfilment", Key: "o-1", Name: "packed",
		Payload: map[string]string{"parcel": "PX-7"},
	})
	if err != nil {
		return err
	}
	if _, err := flows.Wait(ctx, id, 10*time.Millisecond); err != nil {
		return err
	}
	// Deliver everything committed, then return. A service calls
	// outbox.Start(ctx) instead, and outbox.Stop when it shuts down.
	return outbox.Drain(ctx)
}

// The tutorial of docs/getting-started.md: an order committed with its
// outbox message and its flow, a relay to a Go function, a flow that awaits
// a signal and emits a message when it ends.
func Example_gettingStarted() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer admin.Close()
	schema, drop := exampleSchema(ctx, admin)
	defer drop()
	// The tutorial's table lives in the example's schema.
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents integer NOT NULL, status text NOT NULL DEFAULT 'new')`); err != nil {
		panic(err)
	}
	if err := run(ctx, pool, schema); err != nil {
		panic(err)
	}
	// Unordered output:
	// orders.placed o-1 {"id":"o-1","cents":4200}
	// orders.shipped o-1 {"order":"o-1","parcel":"PX-7"}
}
