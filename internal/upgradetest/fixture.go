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
	"strings"
	"sync"
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
//   - flaky: "start" fails while broken;
//   - slow: "work" ends, after waiting for Hold when it is set;
//   - note: "write" ends, under the rate key "mail".
type Flows struct {
	Order    *wharfflow.Flow[Order]
	Shipment *wharfflow.Flow[Shipment]
	Parcel   *wharfflow.Flow[Parcel]
	Flaky    *wharfflow.Flow[Order]
	Slow     *wharfflow.Flow[Order]
	Note     *wharfflow.Flow[Order]
	Broken   atomic.Bool
	// Hold, when set, is where the "slow" flow's step waits, and Running is
	// closed when it has started.
	Hold, Running chan struct{}
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
	slow := wharfflow.New[Order]("slow", nil).
		Step("work", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			if f.Hold != nil {
				close(f.Running)
				<-f.Hold
			}
			return wharfflow.Done(o.ID)
		})
	note := wharfflow.New[Order]("note", nil).
		Step("write", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o.ID)
		})
	f.Order, f.Shipment, f.Parcel, f.Flaky, f.Slow, f.Note = order, shipment, parcel, flaky, slow, note
	return f
}

// Definitions are the flows for a runner's Config.
func (f *Flows) Definitions() []wharfflow.Definition {
	return []wharfflow.Definition{f.Order, f.Shipment, f.Parcel, f.Flaky, f.Slow, f.Note}
}

// RateLimits are the fixture runners' rate limits.
var RateLimits = map[string]wharfflow.RateLimit{"mail": {PerSecond: 1000, Burst: 10}}

// The fixture's contents, as Build leaves them.
const (
	// Pending outbox messages, on keys k0..k2; {"n": 3} is retrying.
	KeyedMessages = 30
	// Pending messages of other shapes: two without a key, one with
	// headers, one with a dedup key, one scheduled in the past, one a
	// killed relay was delivering; and one scheduled for 2100, which stays.
	OtherMessages, ScheduledMessages = 6, 1
	// Delivered when the relay drains what the release left.
	PendingMessages = KeyedMessages + OtherMessages
	// Orders awaiting their payment, and orders started but not yet run
	// (the first of them has its payment signal already, twice with one
	// dedup key).
	AwaitingOrders, ReadyOrders = 3, 2
	// Shipments joining their parcels (two each, all awaiting pickup), and
	// one not yet run.
	JoiningShipments, ReadyShipments = 2, 1
	// Failed instances of flaky.
	FailedFlaky = 2
	// The order whose payment came before it awaited it.
	EarlyPaidOrder = "o5"
	// A slow instance running when its runner was killed; notes under a
	// rate key done, and one ready; an order cancelled while it awaited.
	RunningSlow, DoneNotes, ReadyNotes, CancelledOrders = 1, 2, 1, 1
)

// Build fills schema, migrated to the release under test, as that release
// leaves an outbox and its flows when its processes are killed: a relay
// holds lanes and a message in flight; a runner holds a running step; before
// that, a runner ran flows until instances were done, awaiting, joining,
// failed and cancelled, and more were started; the outbox holds pending
// messages of every shape, one retrying, and a dead letter.
//
// What a kill leaves is what the database holds while those processes
// still run: dump it before calling stop, which ends them.
func Build(ctx context.Context, pool *pgxpool.Pool, schema string) (stop func(), err error) {
	// A relay is delivering the first message when it is killed; it
	// delivers nothing else (one handler call at a time).
	if _, err := pool.Exec(ctx, "SELECT "+schema+`.enqueue('orders', 'held', '{"held":true}')`); err != nil {
		return nil, err
	}
	inHandler := make(chan struct{})
	var once sync.Once
	relay, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, RelayID: "upgrade-fixture-killed", HandlerConcurrency: 1,
		Handler: func(ctx context.Context, m *wharf.Message) error {
			once.Do(func() { close(inHandler) })
			<-ctx.Done()
			return ctx.Err()
		}})
	if err != nil {
		return nil, err
	}
	if err := relay.Start(ctx); err != nil {
		return nil, err
	}
	select {
	case <-inHandler:
	case <-time.After(2 * time.Minute):
		return nil, errors.New("the relay's handler did not start")
	}
	for i := 0; i < KeyedMessages; i++ {
		if _, err := pool.Exec(ctx, "SELECT "+schema+".enqueue('orders', $1, $2::jsonb)",
			fmt.Sprintf("k%d", i%3), fmt.Sprintf(`{"n":%d}`, i)); err != nil {
			return nil, fmt.Errorf("enqueue: %w", err)
		}
	}
	for _, q := range []string{
		`SELECT {{schema}}.enqueue('audit', NULL, '{"unkeyed":1}')`,
		`SELECT {{schema}}.enqueue('audit', NULL, '{"unkeyed":2}')`,
		`SELECT {{schema}}.enqueue('orders', 'h1', '{"headers":true}', '{"trace":"t-1","tenant":"acme"}')`,
		`SELECT {{schema}}.enqueue('orders', 'd1', '{"dedup":true}', '{}', NULL, 'evt-1')`,
		`SELECT {{schema}}.enqueue('orders', 'p1', '{"scheduled":"past"}', '{}', now() - interval '1 hour')`,
		`SELECT {{schema}}.enqueue('orders', 'f1', '{"scheduled":"2100"}', '{}', '2100-01-01T00:00:00Z')`,
	} {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(q, "{{schema}}", schema)); err != nil {
			return nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	// A relay failed message {"n": 3} twice; another went to the dead
	// letters after twelve attempts.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.retries (id, lane, attempts, next_attempt_at, last_error, nonce)
SELECT id, lane, 2, now(), 'earlier failure', nonce FROM `+schema+`.outbox WHERE convert_from(payload, 'UTF8')::jsonb = '{"n": 3}'`); err != nil {
		return nil, fmt.Errorf("retry: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (id, nonce, topic, key, payload, created_at, attempts, last_error)
VALUES (1000000, 77, 'orders', 'k0', '"dead"', now(), 12, 'gave up')`); err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	flows := NewFlows()
	flows.Broken.Store(true)
	client, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return nil, err
	}
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: flows.Definitions(),
		RunnerID: "upgrade-fixture", RateLimits: RateLimits})
	if err != nil {
		return nil, err
	}
	if err := runner.Start(ctx); err != nil {
		return nil, err
	}
	var starts []wharfflow.Start
	for i := 1; i <= AwaitingOrders+CancelledOrders; i++ {
		starts = append(starts, flows.Order.Start(Order{ID: fmt.Sprintf("o%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("o%d", i)}))
	}
	for i := 1; i <= JoiningShipments; i++ {
		id := fmt.Sprintf("s%d", i)
		starts = append(starts, flows.Shipment.Start(Shipment{ID: id, Items: []string{id + "-a", id + "-b"}}, wharfflow.StartOptions{Key: id}))
	}
	for i := 1; i <= FailedFlaky; i++ {
		starts = append(starts, flows.Flaky.Start(Order{ID: fmt.Sprintf("f%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("f%d", i)}))
	}
	for i := 1; i <= DoneNotes; i++ {
		starts = append(starts, flows.Note.Start(Order{ID: fmt.Sprintf("n%d", i)}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "mail"}}))
	}
	if _, err := client.Start(ctx, starts...); err != nil {
		return nil, err
	}
	if err := waitCounts(ctx, client, map[string]int64{
		"order/awaiting":   AwaitingOrders + CancelledOrders,
		"shipment/joining": JoiningShipments,
		"parcel/awaiting":  2 * JoiningShipments,
		"flaky/failed":     FailedFlaky,
		"note/done":        DoneNotes,
	}); err != nil {
		return nil, err
	}
	// The last awaiting order is cancelled.
	cancelled, err := client.List(ctx, wharfflow.ListOptions{Flow: "order", Key: fmt.Sprintf("o%d", AwaitingOrders+CancelledOrders)})
	if err != nil || len(cancelled) != 1 {
		return nil, fmt.Errorf("the order to cancel (%d found): %w", len(cancelled), err)
	}
	if _, err := client.Cancel(ctx, cancelled[0].ID); err != nil {
		return nil, err
	}
	if err := runner.Stop(ctx); err != nil {
		return nil, err
	}

	// Started while no runner ran.
	starts = nil
	for i := AwaitingOrders + CancelledOrders + 1; i <= AwaitingOrders+CancelledOrders+ReadyOrders; i++ {
		starts = append(starts, flows.Order.Start(Order{ID: fmt.Sprintf("o%d", i)}, wharfflow.StartOptions{Key: fmt.Sprintf("o%d", i)}))
	}
	for i := JoiningShipments + 1; i <= JoiningShipments+ReadyShipments; i++ {
		id := fmt.Sprintf("s%d", i)
		starts = append(starts, flows.Shipment.Start(Shipment{ID: id, Items: []string{id + "-a", id + "-b"}}, wharfflow.StartOptions{Key: id}))
	}
	for i := DoneNotes + 1; i <= DoneNotes+ReadyNotes; i++ {
		starts = append(starts, flows.Note.Start(Order{ID: fmt.Sprintf("n%d", i)}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "mail"}}))
	}
	if _, err := client.Start(ctx, starts...); err != nil {
		return nil, err
	}
	// The payment of the first ready order arrives before it awaits, twice.
	paid := wharfflow.Signal{Flow: "order", Key: EarlyPaidOrder, Name: "payment", DedupKey: "psp-early"}
	for range 2 {
		if _, err := client.Send(ctx, paid); err != nil {
			return nil, err
		}
	}

	// What a kill leaves: a runner in the middle of a step (and the relay
	// above in the middle of delivering its message), holding leases.
	flows.Hold, flows.Running = make(chan struct{}), make(chan struct{})
	// It runs the slow flow only, leaving the ready instances above ready.
	killed, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{flows.Slow},
		RunnerID: "upgrade-fixture-killed"})
	if err != nil {
		return nil, err
	}
	if err := killed.Start(ctx); err != nil {
		return nil, err
	}
	if _, err := client.Start(ctx, flows.Slow.Start(Order{ID: "w1"}, wharfflow.StartOptions{Key: "w1"})); err != nil {
		return nil, err
	}
	select {
	case <-flows.Running:
	case <-time.After(2 * time.Minute):
		return nil, errors.New("the slow step did not start")
	}
	return func() {
		close(flows.Hold)
		_ = relay.StopAndCancel(ctx)
		_ = killed.Stop(ctx)
	}, nil
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
