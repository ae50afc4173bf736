// Package upgradetest checks that a database a released version of Wharf
// left behind upgrades to the current schema and runs to the end: pending and
// retrying outbox messages, dead letters, and flow instances at every stage.
//
// Each release has a fixture, testdata/<version>.sql: the data (not the
// schema) of an outbox and its flows as that release left them, dumped with
// pg_dump after Build ran against the release's schema. The test creates the
// release's schema from its migrations (which never change once released),
// loads the fixture, migrates to the head and runs everything to the end.
//
// Write a release's fixture once, from the release's own commit, with
//
//	WHARF_WRITE_UPGRADE_FIXTURE=<version> go test -run TestFixtureRecipe ./internal/upgradetest
//
// and never rewrite it afterwards.
package upgradetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

// Order is the state of the "order" flow.
type Order struct {
	ID string `json:"id"`
}

// Parcel is the state of the "parcel" flow, the children of "shipment".
type Parcel struct {
	Item string `json:"item"`
}

// Shipment is the state of the "shipment" flow.
type Shipment struct {
	ID    string   `json:"id"`
	Items []string `json:"items"`
}

// Flows are the fixture's flow definitions. While Broken is true the "flaky"
// flow's step fails for good; afterwards it succeeds, as after a fix.
//
//   - order: "reserve" awaits the "payment" signal (deadline far away) and
//     "paid" emits an orders.shipped message and ends;
//   - shipment: "pack" spawns a parcel child per item and "joined" ends with
//     their count;
//   - parcel: "wait" awaits the "pickup" signal, under the concurrency key
//     "dock" (limit 1), and "picked" ends;
//   - flaky: "start" fails while broken.
type Flows struct {
	Order    *wharfflow.Flow[Order]
	Shipment *wharfflow.Flow[Shipment]
	Parcel   *wharfflow.Flow[Parcel]
	Flaky    *wharfflow.Flow[Order]
	Broken   atomic.Bool
}

// NewFlows returns the fixture's flows, with Broken false.
func NewFlows() *Flows {
	f := &Flows{}
	broken := &f.Broken
	far := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	order := wharfflow.New[Order]("order", nil).
		Step("reserve", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment").Deadline(far, "expire")
		}).
		Step("paid", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o.ID).Emit(wharf.Message{
				Topic: "orders.shipped", Key: o.ID, Payload: []byte(`{"order":"` + o.ID + `"}`),
			})
		}).
		Step("expire", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("the payment deadline passed"))
		})
	parcel := wharfflow.New[Parcel]("parcel", nil).
		Step("wait", func(ctx context.Context, p *Parcel, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("picked", "pickup")
		}).
		Step("picked", func(ctx context.Context, p *Parcel, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	shipment := wharfflow.New[Shipment]("shipment", nil).
		Step("pack", func(ctx context.Context, s *Shipment, in wharfflow.Input) wharfflow.Outcome {
			var children []wharfflow.Child
			for _, item := range s.Items {
				children = append(children, parcel.Child(Parcel{Item: item},
					wharfflow.Options{ConcurrencyKey: "dock", ConcurrencyLimit: 1}))
			}
			return wharfflow.Spawn("joined", children...)
		}).
		Step("joined", func(ctx context.Context, s *Shipment, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(len(in.Children))
		})
	flaky := wharfflow.New[Order]("flaky", nil).
		Step("start", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			if broken.Load() {
				return wharfflow.Fail(errors.New("a bug, fixed in the next release"))
			}
			return wharfflow.Done(o.ID)
		})
	f.Order, f.Shipment, f.Parcel, f.Flaky = order, shipment, parcel, flaky
	return f
}

// Definitions are the flows for a runner's Config.
func (f *Flows) Definitions() []wharfflow.Definition {
	return []wharfflow.Definition{f.Order, f.Shipment, f.Parcel, f.Flaky}
}

// The fixture's contents, as Build leaves them.
const (
	// Pending outbox messages, on keys k0..k2; the fourth is retrying.
	PendingMessages = 30
	// Orders awaiting their payment, and orders started but not yet run
	// (the first of them has its payment signal already, twice with one
	// dedup key).
	AwaitingOrders, ReadyOrders = 3, 2
	// Shipments joining their parcels (two each, all awaiting pickup), and
	// one not yet run.
	JoiningShipments, ReadyShipments = 2, 1
	// Failed instances of flaky.
	FailedFlaky = 2
)

// Build fills schema, migrated to the release under test, as that release
// leaves an outbox and its flows: a runner ran the flows until instances
// were awaiting, joining and failed, then stopped; more were started; the
// outbox holds pending messages, one retrying, and a dead letter.
func Build(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	for i := 0; i < PendingMessages; i++ {
		if _, err := pool.Exec(ctx, "SELECT "+schema+".enqueue('orders', $1, $2::jsonb)",
			fmt.Sprintf("k%d", i%3), fmt.Sprintf(`{"n":%d}`, i)); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
	}
	// A relay failed the fourth message twice; another went to the dead
	// letters after twelve attempts.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.retries (id, lane, attempts, next_attempt_at, last_error, nonce)
SELECT id, lane, 2, now(), 'earlier failure', nonce FROM `+schema+`.outbox ORDER BY id OFFSET 3 LIMIT 1`); err != nil {
		return fmt.Errorf("retry: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (id, nonce, topic, key, payload, created_at, attempts, last_error)
VALUES (1000000, 77, 'orders', 'k0', '"dead"', now(), 12, 'gave up')`); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}

	flows := NewFlows()
	flows.Broken.Store(true)
	client, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return err
	}
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: flows.Definitions(), RunnerID: "upgrade-fixture"})
	if err != nil {
		return err
	}
	if err := runner.Start(ctx); err != nil {
		return err
	}
	var starts []wharfflow.Start
	for i := 1; i <= AwaitingOrders; i++ {
		starts = append(starts, flows.Order.Start(Order{ID: fmt.Sprintf("o%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("o%d", i)}))
	}
	for i := 1; i <= JoiningShipments; i++ {
		id := fmt.Sprintf("s%d", i)
		starts = append(starts, flows.Shipment.Start(Shipment{ID: id, Items: []string{id + "-a", id + "-b"}}, wharfflow.StartOptions{Key: id}))
	}
	for i := 1; i <= FailedFlaky; i++ {
		starts = append(starts, flows.Flaky.Start(Order{ID: fmt.Sprintf("f%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("f%d", i)}))
	}
	if _, err := client.Start(ctx, starts...); err != nil {
		return err
	}
	want := map[string]int64{
		"order/awaiting":   AwaitingOrders,
		"shipment/joining": JoiningShipments,
		"parcel/awaiting":  2 * JoiningShipments,
		"flaky/failed":     FailedFlaky,
	}
	if err := waitCounts(ctx, client, want); err != nil {
		return err
	}
	if err := runner.Stop(ctx); err != nil {
		return err
	}

	// Started while no runner ran.
	starts = nil
	for i := AwaitingOrders + 1; i <= AwaitingOrders+ReadyOrders; i++ {
		starts = append(starts, flows.Order.Start(Order{ID: fmt.Sprintf("o%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("o%d", i)}))
	}
	for i := JoiningShipments + 1; i <= JoiningShipments+ReadyShipments; i++ {
		id := fmt.Sprintf("s%d", i)
		starts = append(starts, flows.Shipment.Start(Shipment{ID: id, Items: []string{id + "-a", id + "-b"}}, wharfflow.StartOptions{Key: id}))
	}
	if _, err := client.Start(ctx, starts...); err != nil {
		return err
	}
	// The payment of the first ready order arrives before it awaits, twice.
	paid := wharfflow.Signal{Flow: "order", Key: fmt.Sprintf("o%d", AwaitingOrders+1), Name: "payment", DedupKey: "psp-early"}
	for range 2 {
		if _, err := client.Send(ctx, paid); err != nil {
			return err
		}
	}
	return nil
}

// waitCounts waits until the instances counted by flow and status include
// want ("flow/status": n).
func waitCounts(ctx context.Context, client *wharfflow.Client, want map[string]int64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		counts, err := client.StatusCounts(ctx)
		if err != nil {
			return err
		}
		got := map[string]int64{}
		for _, c := range counts {
			got[c.Flow+"/"+c.Status] += c.N
		}
		ok := true
		for k, n := range want {
			if got[k] != n {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %v: have %v", want, got)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
