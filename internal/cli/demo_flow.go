package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfflow"
)

// The demo's flow step: checkouts that await their payment, ship each item
// in a child flow and emit "shipped" to the outbox.
type demoOrder struct {
	ID      string   `json:"id"`
	Items   []string `json:"items"`
	Shipped []string `json:"shipped,omitempty"`
}

type demoParcel struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

var demoCheckouts = []demoOrder{
	{ID: "checkout-1", Items: []string{"book", "lamp"}},
	{ID: "checkout-2", Items: []string{"pen"}},
	{ID: "checkout-3", Items: []string{"cup", "mug", "plate"}},
}

func demoFlows() (checkout *wharfflow.Flow[demoOrder], shipping *wharfflow.Flow[demoParcel]) {
	shipping = wharfflow.New[demoParcel]("shipping", nil).
		Step("ship", func(_ context.Context, p *demoParcel, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	checkout = wharfflow.New[demoOrder]("checkout", nil).
		Step("reserve", func(context.Context, *demoOrder, wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment-captured").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(_ context.Context, o *demoOrder, _ wharfflow.Input) wharfflow.Outcome {
			var parcels []wharfflow.Child
			for _, item := range o.Items {
				parcels = append(parcels, shipping.Child(demoParcel{Order: o.ID, Item: item}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("shipped", parcels...)
		}).
		Step("shipped", func(_ context.Context, o *demoOrder, in wharfflow.Input) wharfflow.Outcome {
			for _, c := range in.Children {
				var item string
				_ = json.Unmarshal(c.Result, &item)
				o.Shipped = append(o.Shipped, item)
			}
			payload, _ := json.Marshal(map[string]any{"order": o.ID, "status": "shipped", "items": o.Shipped})
			return wharfflow.Done(o).Emit(wharf.Message{Topic: demoTopic, Key: o.ID, Payload: payload})
		}).
		Step("expire", func(context.Context, *demoOrder, wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("no payment within an hour"))
		})
	return checkout, shipping
}

// runFlowShowcase is the demo's flow step: it starts the checkouts in one
// transaction, waits until each awaits its payment, signals them, waits for
// them to end, prints each one's steps with their times, and has a relay
// deliver the messages they emitted.
func runFlowShowcase(ctx context.Context, g *globals, f *demoFlags, pool *pgxpool.Pool, schema string) error {
	out := g.stdout
	checkout, shipping := demoFlows()
	fmt.Fprintf(out, "\n3. Flows: %d checkouts await their payment, ship each item in a child flow, then emit \"shipped\"\n", len(demoCheckouts))
	fmt.Fprintln(out, "           to the outbox in the transaction of their last step (package wharfflow)")
	client, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return err
	}
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Logger: g.log,
		Flows: []wharfflow.Definition{checkout, shipping}})
	if err != nil {
		return err
	}
	if err := runner.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), f.relay.stopWait)
		defer cancel()
		_ = runner.Stop(stopCtx)
	}()
	fmt.Fprintf(out, "   runner     %s started\n", runner.ID())

	starts := make([]wharfflow.Start, len(demoCheckouts))
	var what []string
	for i, o := range demoCheckouts {
		starts[i] = checkout.Start(o, wharfflow.StartOptions{Key: o.ID})
		what = append(what, fmt.Sprintf("%s (%s)", o.ID, strings.Join(o.Items, ", ")))
	}
	var ids []int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = client.StartTx(ctx, tx, starts...)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "   start      %s: started in one transaction\n", strings.Join(what, ", "))

	waitCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	awaiting := func() (bool, error) {
		is, err := client.List(waitCtx, wharfflow.ListOptions{Flow: "checkout", Status: "awaiting", Limit: len(ids)})
		return len(is) == len(ids), err
	}
	if err := demoPoll(waitCtx, "waiting for the checkouts to await their payment", f.timeout, awaiting); err != nil {
		return err
	}
	fmt.Fprintf(out, "   awaiting   all %d ran their first step and wait for the signal payment-captured\n", len(ids))

	sigs := make([]wharfflow.Signal, len(demoCheckouts))
	for i, o := range demoCheckouts {
		sigs[i] = wharfflow.Signal{Flow: "checkout", Key: o.ID, Name: "payment-captured",
			Payload: map[string]int{"cents": 1200 * (i + 1)}, DedupKey: "psp-" + o.ID}
	}
	signalled := time.Now()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := client.SignalTx(ctx, tx, sigs...)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "   signal     payment-captured sent to each, in one transaction (as a payment webhook would)\n")
	for _, id := range ids {
		i, err := client.Wait(waitCtx, id, 10*time.Millisecond)
		if err != nil {
			return fmt.Errorf("waiting for checkout %d to end: %w (raise --timeout)", id, err)
		}
		if i.Status != "done" {
			return fmt.Errorf("checkout %d ended %s: %s", id, i.Status, i.Error)
		}
	}
	fmt.Fprintf(out, "   done       all %d done %s after the signal\n", len(ids), time.Since(signalled).Round(time.Millisecond))

	// Each checkout's steps, from its history, and its children's.
	children, err := client.List(ctx, wharfflow.ListOptions{Flow: "shipping", Limit: 1000})
	if err != nil {
		return err
	}
	byParent := map[int64][]wharfflow.Instance{}
	for _, c := range children {
		byParent[c.ParentID] = append(byParent[c.ParentID], c)
	}
	steps := 0
	for n, id := range ids {
		d, err := client.Get(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   flow       %s, instance %d: %d steps\n", demoCheckouts[n].ID, id, len(d.Steps))
		for _, s := range d.Steps {
			fmt.Fprintf(out, "                %-8s -> %-6s %s\n", s.Step, s.Outcome, s.FinishedAt.Sub(s.StartedAt).Round(10*time.Microsecond))
		}
		steps += len(d.Steps)
		kids := byParent[id]
		slices.SortFunc(kids, func(a, b wharfflow.Instance) int { return int(a.ID - b.ID) })
		var shipped []string
		var longest time.Duration
		for _, k := range kids {
			kd, err := client.Get(ctx, k.ID)
			if err != nil {
				return err
			}
			for _, s := range kd.Steps {
				longest = max(longest, s.FinishedAt.Sub(s.StartedAt))
				steps++
			}
			var item string
			_ = json.Unmarshal(k.Result, &item)
			shipped = append(shipped, fmt.Sprintf("%s %s", item, k.Status))
		}
		noun := "shipping flows"
		if len(kids) == 1 {
			noun = "shipping flow"
		}
		fmt.Fprintf(out, "                children: %d %s (%s), one step each, longest %s\n",
			len(kids), noun, strings.Join(shipped, ", "), longest.Round(10*time.Microsecond))
	}
	fmt.Fprintf(out, "   steps      %d steps run, each outcome (state, signals consumed, children, history, message) committed once;\n", steps)
	fmt.Fprintln(out, "              a step's time is from its start to its outcome's commit")

	// The messages the last steps emitted are in the outbox: a relay delivers them.
	inner, err := sinkurl.Open(ctx, "null:")
	if err != nil {
		return err
	}
	defer inner.Close()
	printer := &demoPrinter{w: out, on: true, arrived: map[string][]string{}}
	cfg := f.relay.cfg
	cfg.Schema = schema
	cfg.Logger = g.log
	cfg.RelayID = ""
	cfg.Sink = &demoSink{inner: inner, onAck: printer.show}
	relay, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		return usageError{err}
	}
	fmt.Fprintf(out, "   relay      %s delivers what the flows emitted:\n", relay.RelayID())
	drainCtx, cancelDrain := context.WithTimeout(ctx, f.timeout)
	err = relay.Drain(drainCtx)
	cancelDrain()
	printer.stop()
	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted")
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the relay did not deliver the flows' messages within %s: giving up (raise --timeout)", f.timeout)
	case err != nil:
		return err
	}
	return nil
}

// demoPoll calls done every 10ms until it holds, ctx ends or timeout passes.
func demoPoll(ctx context.Context, what string, timeout time.Duration, done func() (bool, error)) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		switch {
		case ok:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%s took longer than %s: giving up (raise --timeout)", what, timeout)
		case err != nil:
			return err
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}
