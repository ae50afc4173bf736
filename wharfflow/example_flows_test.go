package wharfflow_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// exampleFlows gives an example a migrated schema of its own, a client and a
// started runner of flows; stop stops the runner and drops the schema.
func exampleFlows(ctx context.Context, cfg wharfflow.Config) (pool *pgxpool.Pool, client *wharfflow.Client, stop func()) {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	cfg.Schema = "wfx_" + hex.EncodeToString(b[:])
	m, err := wharfmigrate.New(cfg.Schema)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		panic(err)
	}
	cfg.Logger = testLogger()
	runner, err := wharfflow.NewRunner(pool, &cfg)
	if err != nil {
		panic(err)
	}
	if err := runner.Start(ctx); err != nil {
		panic(err)
	}
	client, err = wharfflow.NewClient(pool, cfg.Schema)
	if err != nil {
		panic(err)
	}
	return pool, client, func() {
		_ = runner.Stop(ctx)
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+cfg.Schema+" CASCADE")
		pool.Close()
	}
}

// wait returns instance id once it has ended.
func wait(client *wharfflow.Client, id int64) wharfflow.Instance {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := client.Wait(ctx, id, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	return inst
}

type Greeting struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

// A flow is a named list of steps over a state saved as JSON; each step says
// what comes next. Start one instance and wait for its result.
func ExampleClient_Start() {
	ctx := context.Background()
	greet := wharfflow.New[Greeting]("greet", nil).
		Step("compose", func(ctx context.Context, g *Greeting, in wharfflow.Input) wharfflow.Outcome {
			g.Text = "hello, " + g.Name
			return wharfflow.Next("finish")
		}).
		Step("finish", func(ctx context.Context, g *Greeting, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(g.Text)
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{greet}})
	defer stop()

	ids, err := client.Start(ctx, greet.Start(Greeting{Name: "Ada"}, wharfflow.StartOptions{Key: "ada"}))
	if err != nil {
		panic(err)
	}
	inst := wait(client, ids[0])
	fmt.Println(inst.Status, string(inst.Result))
	// Output:
	// done "hello, Ada"
}

type Approval struct {
	Document string `json:"document"`
}

// A step awaits a signal; Send (or SignalTx, inside the caller's
// transaction) delivers it to the instance by flow and key, and the next
// step reads its payload.
func ExampleClient_Send() {
	ctx := context.Background()
	approval := wharfflow.New[Approval]("approval", nil).
		Step("ask", func(ctx context.Context, a *Approval, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("decide", "approved", "rejected")
		}).
		Step("decide", func(ctx context.Context, a *Approval, in wharfflow.Input) wharfflow.Outcome {
			sig := in.Signals[0]
			return wharfflow.Done(sig.Name + " by " + string(sig.Payload))
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{approval}})
	defer stop()

	ids, err := client.Start(ctx, approval.Start(Approval{Document: "budget.pdf"}, wharfflow.StartOptions{Key: "doc-12"}))
	if err != nil {
		panic(err)
	}
	if _, err := client.Send(ctx, wharfflow.Signal{Flow: "approval", Key: "doc-12", Name: "approved", Payload: "grace"}); err != nil {
		panic(err)
	}
	inst := wait(client, ids[0])
	fmt.Println(inst.Status, string(inst.Result))
	// Output:
	// done "approved by \"grace\""
}

// Await with a deadline: when no awaited signal has come by then, the
// instance resumes at the timeout step instead.
func ExampleOutcome_Deadline() {
	ctx := context.Background()
	approval := wharfflow.New[Approval]("approval", nil).
		Step("ask", func(ctx context.Context, a *Approval, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("decide", "approved").Deadline(time.Now().Add(100*time.Millisecond), "expire")
		}).
		Step("decide", func(ctx context.Context, a *Approval, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done("approved")
		}).
		Step("expire", func(ctx context.Context, a *Approval, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("nobody approved " + a.Document + " in time"))
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{approval}})
	defer stop()

	ids, err := client.Start(ctx, approval.Start(Approval{Document: "budget.pdf"}, wharfflow.StartOptions{}))
	if err != nil {
		panic(err)
	}
	inst := wait(client, ids[0])
	fmt.Println(inst.Status, inst.Step+":", inst.Error)
	// Output:
	// failed expire: nobody approved budget.pdf in time
}

type Batch struct {
	Files []string `json:"files"`
}

type File struct {
	Name string `json:"name"`
}

// Spawn starts child instances (of any flow) and runs the join step once
// they have all ended, with their results in Input.Children.
func ExampleSpawn() {
	ctx := context.Background()
	resize := wharfflow.New[File]("resize", nil).
		Step("resize", func(ctx context.Context, f *File, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(len(f.Name))
		})
	batch := wharfflow.New[Batch]("batch", nil).
		Step("fan-out", func(ctx context.Context, b *Batch, in wharfflow.Input) wharfflow.Outcome {
			var children []wharfflow.Child
			for _, name := range b.Files {
				children = append(children, resize.Child(File{Name: name}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("join", children...)
		}).
		Step("join", func(ctx context.Context, b *Batch, in wharfflow.Input) wharfflow.Outcome {
			done := 0
			for _, c := range in.Children {
				if c.Status == "done" {
					done++
				}
			}
			return wharfflow.Done(fmt.Sprintf("%d of %d resized", done, len(in.Children)))
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{batch, resize}})
	defer stop()

	ids, err := client.Start(ctx, batch.Start(Batch{Files: []string{"a.png", "b.png", "c.png"}}, wharfflow.StartOptions{}))
	if err != nil {
		panic(err)
	}
	inst := wait(client, ids[0])
	fmt.Println(inst.Status, string(inst.Result))
	// Output:
	// done "3 of 3 resized"
}

type Invoice struct {
	Number string `json:"number"`
}

// A step's outcome can emit outbox messages: they commit with the outcome,
// and only if it commits, and the relay (wharf.Client) delivers them.
func ExampleOutcome_Emit() {
	ctx := context.Background()
	invoicing := wharfflow.New[Invoice]("invoicing", nil).
		Step("issue", func(ctx context.Context, inv *Invoice, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil).Emit(wharf.Message{
				Topic: "invoices.issued", Key: inv.Number, Payload: []byte(`{"invoice":"` + inv.Number + `"}`),
			})
		})
	pool, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{invoicing}})
	defer stop()

	ids, err := client.Start(ctx, invoicing.Start(Invoice{Number: "INV-7"}, wharfflow.StartOptions{}))
	if err != nil {
		panic(err)
	}
	wait(client, ids[0])

	relay, err := wharf.NewClient(pool, &wharf.Config{
		Schema: client.Schema(),
		Logger: testLogger(),
		Handler: func(_ context.Context, m *wharf.Message) error {
			fmt.Println(m.Topic, m.Key, string(m.Payload))
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	if err := relay.Drain(ctx); err != nil {
		panic(err)
	}
	// Output:
	// invoices.issued INV-7 {"invoice":"INV-7"}
}

type Lookup struct {
	Query string `json:"query"`
}

// Instances with a RateKey share a token bucket (Config.RateLimits); a step
// that hits the upstream's limit anyway returns RateLimited, which pauses
// every step on the key and runs this one again later without spending an
// attempt.
func ExampleRateLimited() {
	ctx := context.Background()
	var calls atomic.Int32
	lookup := wharfflow.New[Lookup]("lookup", nil).
		Step("call", func(ctx context.Context, l *Lookup, in wharfflow.Input) wharfflow.Outcome {
			if calls.Add(1) == 1 { // the upstream answers 429, Retry-After: 1
				return wharfflow.RateLimited("geo-api", time.Now().Add(time.Second))
			}
			return wharfflow.Done(fmt.Sprintf("%s found (attempt %d)", l.Query, in.Attempt))
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{
		Flows:      []wharfflow.Definition{lookup},
		RateLimits: map[string]wharfflow.RateLimit{"geo-api": {PerSecond: 50, Burst: 5}},
	})
	defer stop()

	ids, err := client.Start(ctx, lookup.Start(Lookup{Query: "Lisbon"}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: "geo-api"}}))
	if err != nil {
		panic(err)
	}
	inst := wait(client, ids[0])
	fmt.Println(inst.Status, string(inst.Result), "after", calls.Load(), "calls")
	// Output:
	// done "Lisbon found (attempt 0)" after 2 calls
}

type Deploy struct {
	Service string `json:"service"`
}

// Instances with the same ConcurrencyKey run at most ConcurrencyLimit steps
// at once across every runner (here one: the deploys of an environment go
// one by one).
func ExampleOptions_concurrencyKey() {
	ctx := context.Background()
	var mu sync.Mutex
	running, most := 0, 0
	deploy := wharfflow.New[Deploy]("deploy", nil).
		Step("roll-out", func(ctx context.Context, d *Deploy, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			defer func() { mu.Lock(); running--; mu.Unlock() }()
			return wharfflow.Done(nil)
		})
	_, client, stop := exampleFlows(ctx, wharfflow.Config{Flows: []wharfflow.Definition{deploy}})
	defer stop()

	var starts []wharfflow.Start
	for _, svc := range []string{"api", "web", "worker", "cron"} {
		starts = append(starts, deploy.Start(Deploy{Service: svc},
			wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "env-production", ConcurrencyLimit: 1}}))
	}
	ids, err := client.Start(ctx, starts...)
	if err != nil {
		panic(err)
	}
	for _, id := range ids {
		wait(client, id)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("deployed:", len(ids), "at most at once:", most)
	// Output:
	// deployed: 4 at most at once: 1
}
