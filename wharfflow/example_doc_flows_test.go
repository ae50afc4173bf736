package wharfflow_test

// The compiled homes of the Go snippets in docs/flows.md (the flows guide):
// each block there is a run of lines of this file. Change both together.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// guideSchema gives a guide example a migrated schema of its own; drop drops it.
func guideSchema(ctx context.Context) (pool *pgxpool.Pool, schema string, drop func()) {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema = "wfguide_" + hex.EncodeToString(b[:])
	m, err := wharfmigrate.New(schema)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		panic(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// guideRunner starts a runner of flows on schema; the caller stops it.
func guideRunner(ctx context.Context, pool *pgxpool.Pool, cfg wharfflow.Config) *wharfflow.Runner {
	cfg.Logger = testLogger()
	runner, err := wharfflow.NewRunner(pool, &cfg)
	if err != nil {
		panic(err)
	}
	if err := runner.Start(ctx); err != nil {
		panic(err)
	}
	return runner
}

// guideWait returns instance id once it has ended.
func guideWait(ctx context.Context, client *wharfflow.Client, id int64) wharfflow.Instance {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	inst, err := client.Wait(ctx, id, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	return inst
}

// ---- Define a flow, run a runner, start an instance ----

type Signup struct {
	Email   string `json:"email"`
	Welcome string `json:"welcome"`
}

var signup = wharfflow.New[Signup]("signup", &wharfflow.FlowConfig{MaxAttempts: 3, RetryBackoff: time.Second}).
	Step("create-account", func(ctx context.Context, s *Signup, in wharfflow.Input) wharfflow.Outcome {
		// Calls outside the database may run twice: key them by in.IdempotencyKey.
		return wharfflow.Next("send-welcome")
	}).
	Step("send-welcome", func(ctx context.Context, s *Signup, in wharfflow.Input) wharfflow.Outcome {
		s.Welcome = "welcome mail sent to " + s.Email
		return wharfflow.Done(s.Welcome)
	})

func runSignups(ctx context.Context, pool *pgxpool.Pool, schema string) (stop func(), err error) {
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{
		Schema: schema,
		Flows:  []wharfflow.Definition{signup},
	})
	if err != nil {
		return nil, err
	}
	if err := runner.Start(ctx); err != nil {
		return nil, err
	}
	return func() { _ = runner.Stop(context.Background()) }, nil
}

func startSignup(ctx context.Context, pool *pgxpool.Pool, client *wharfflow.Client) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// INSERT INTO users ... in the same transaction: both commit, or neither.
		ids, err := client.StartTx(ctx, tx, signup.Start(Signup{Email: "ada@example.com"},
			wharfflow.StartOptions{Key: "ada@example.com"}))
		if err != nil {
			return err
		}
		id = ids[0]
		return nil
	})
	return id, err
}

// The guide's first flow: two steps, a runner, a start inside the caller's
// transaction, and the result.
func Example_guideStart() {
	ctx := context.Background()
	pool, schema, drop := guideSchema(ctx)
	defer drop()
	stop, err := runSignups(ctx, pool, schema)
	if err != nil {
		panic(err)
	}
	defer stop()
	client, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		panic(err)
	}
	id, err := startSignup(ctx, pool, client)
	if err != nil {
		panic(err)
	}
	inst := guideWait(ctx, client, id)
	fmt.Println(inst.Status, string(inst.Result))
	// Output:
	// done "welcome mail sent to ada@example.com"
}

// ---- Signals, and awaiting them with a deadline ----

type Refund struct {
	Order    string `json:"order"`
	Decision string `json:"decision"`
	By       string `json:"by"`
}

var refund = wharfflow.New[Refund]("refund", nil).
	Step("request", func(ctx context.Context, r *Refund, in wharfflow.Input) wharfflow.Outcome {
		// Resume at "decide" on either signal, or at "expire" after two days.
		return wharfflow.Await("decide", "approved", "rejected").
			Deadline(time.Now().Add(48*time.Hour), "expire")
	}).
	Step("decide", func(ctx context.Context, r *Refund, in wharfflow.Input) wharfflow.Outcome {
		sig := in.Signals[0] // every pending signal of the awaited names, oldest first
		var p struct {
			By string `json:"by"`
		}
		if err := json.Unmarshal(sig.Payload, &p); err != nil {
			return wharfflow.Fail(fmt.Errorf("signal %s: %w", sig.Name, err))
		}
		r.Decision, r.By = sig.Name, p.By
		return wharfflow.Done(r)
	}).
	Step("expire", func(ctx context.Context, r *Refund, in wharfflow.Input) wharfflow.Outcome {
		r.Decision = "expired"
		return wharfflow.Done(r)
	})

func approveRefund(ctx context.Context, pool *pgxpool.Pool, client *wharfflow.Client) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// UPDATE tickets ... in the same transaction.
		_, err := client.SignalTx(ctx, tx, wharfflow.Signal{
			Flow: "refund", Key: "o-7", Name: "approved",
			Payload: map[string]string{"by": "alice"}, DedupKey: "ticket-31",
		})
		return err
	})
}

func sendToNoOne(ctx context.Context, client *wharfflow.Client) {
	_, err := client.Send(ctx, wharfflow.Signal{Flow: "refund", Key: "o-404", Name: "approved"})
	if errors.Is(err, wharfflow.ErrNoInstance) {
		fmt.Println(err)
	}
}

// A refund awaits a decision; a signal sent in the caller's transaction
// resumes it, and a signal that matches no instance is an error.
func Example_guideSignal() {
	ctx := context.Background()
	pool, schema, drop := guideSchema(ctx)
	defer drop()
	client, _ := wharfflow.NewClient(pool, schema)

	ids, err := client.Start(ctx, refund.Start(Refund{Order: "o-7"}, wharfflow.StartOptions{Key: "o-7"}))
	if err != nil {
		panic(err)
	}
	// Signals sent before the await are kept until the step awaits them.
	if err := approveRefund(ctx, pool, client); err != nil {
		panic(err)
	}
	if err := approveRefund(ctx, pool, client); err != nil { // the same dedup key: recorded once
		panic(err)
	}
	runner := guideRunner(ctx, pool, wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{refund}})
	defer runner.Stop(ctx) //nolint:errcheck
	inst := guideWait(ctx, client, ids[0])
	details, _ := client.Get(ctx, ids[0])
	fmt.Println(inst.Status, string(inst.Result), len(details.Signals))
	sendToNoOne(ctx, client)
	// Output:
	// done {"by": "alice", "order": "o-7", "decision": "approved"} 1
	// wharfflow: signal approved: flow refund has no active instance with key "o-404"
}

// ---- Children, and emitting outbox messages ----

type Shipment struct {
	Order   string   `json:"order"`
	Items   []string `json:"items"`
	Shipped int      `json:"shipped"`
}

type Box struct {
	Item string `json:"item"`
}

var pack = wharfflow.New[Box]("pack", nil).
	Step("pack", func(ctx context.Context, b *Box, in wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Done(b.Item)
	})

var shipment = wharfflow.New[Shipment]("shipment", nil).
	Step("split", func(ctx context.Context, s *Shipment, in wharfflow.Input) wharfflow.Outcome {
		var boxes []wharfflow.Child
		for _, item := range s.Items {
			boxes = append(boxes, pack.Child(Box{Item: item}, wharfflow.Options{}))
		}
		return wharfflow.Spawn("join", boxes...)
	}).
	Step("join", func(ctx context.Context, s *Shipment, in wharfflow.Input) wharfflow.Outcome {
		for _, c := range in.Children { // each child's id, flow, status, result and error
			if c.Status != "done" {
				return wharfflow.Fail(fmt.Errorf("box %d %s: %s", c.ID, c.Status, c.Error))
			}
			s.Shipped++
		}
		// The message commits with this outcome, or not at all; the relay delivers it.
		return wharfflow.Done(s.Shipped).Emit(wharf.Message{
			Topic: "shipments", Key: s.Order, Payload: []byte(`{"status":"shipped"}`),
		})
	})

// A shipment spawns a child per item, joins them, and emits a message with
// its last outcome.
func Example_guideChildren() {
	ctx := context.Background()
	pool, schema, drop := guideSchema(ctx)
	defer drop()
	runner := guideRunner(ctx, pool, wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{shipment, pack}})
	defer runner.Stop(ctx) //nolint:errcheck
	client, _ := wharfflow.NewClient(pool, schema)

	ids, err := client.Start(ctx, shipment.Start(Shipment{Order: "o-9", Items: []string{"book", "lamp", "mug"}}, wharfflow.StartOptions{}))
	if err != nil {
		panic(err)
	}
	inst := guideWait(ctx, client, ids[0])
	children, _ := client.List(ctx, wharfflow.ListOptions{Parent: ids[0]})
	var topic, key, payload string
	_ = pool.QueryRow(ctx, "SELECT topic, key, convert_from(payload, 'UTF8') FROM "+schema+".outbox").Scan(&topic, &key, &payload)
	fmt.Println(inst.Status, string(inst.Result), len(children))
	fmt.Println(topic, key, payload)
	// Output:
	// done 3 3
	// shipments o-9 {"status":"shipped"}
}

// ---- Concurrency keys, rate keys and RateLimited ----

type Sync struct {
	Account string `json:"account"`
}

// errSlowDown is what the guide's pretend upstream returns for a 429.
type errSlowDown struct{ retryAfter time.Duration }

func (e errSlowDown) Error() string { return "429 Too Many Requests" }

var crmCalls atomic.Int64

// pushToCRM is the guide's pretend upstream call.
func pushToCRM(ctx context.Context, account, idempotencyKey string) error {
	crmCalls.Add(1)
	return nil
}

var crmSync = wharfflow.New[Sync]("crm-sync", nil).
	Step("push", func(ctx context.Context, s *Sync, in wharfflow.Input) wharfflow.Outcome {
		err := pushToCRM(ctx, s.Account, in.IdempotencyKey)
		var slow errSlowDown
		if errors.As(err, &slow) {
			// Every step on the key waits until then; this one runs again, same attempt.
			return wharfflow.RateLimited("crm-api", time.Now().Add(slow.retryAfter))
		}
		if err != nil {
			return wharfflow.Retry(err)
		}
		return wharfflow.Done(nil)
	})

func runCRMSync(ctx context.Context, pool *pgxpool.Pool, schema string) (*wharfflow.Runner, error) {
	runner, err := wharfflow.NewRunner(pool, &wharfflow.Config{
		Schema: schema,
		Flows:  []wharfflow.Definition{crmSync},
		// At most 2 steps of tenant "t-7" at once, across every runner.
		ConcurrencyLimits: map[string]int{"tenant:t-7": 2},
		// At most 10 steps a second on "crm-api", 20 saved up.
		RateLimits: map[string]wharfflow.RateLimit{"crm-api": {PerSecond: 10, Burst: 20}},
	})
	if err != nil {
		return nil, err
	}
	return runner, runner.Start(ctx)
}

func startCRMSync(ctx context.Context, client *wharfflow.Client, account string) ([]int64, error) {
	return client.Start(ctx, crmSync.Start(Sync{Account: account}, wharfflow.StartOptions{
		Key: "sync:" + account,
		Options: wharfflow.Options{
			Priority:       1,
			ConcurrencyKey: "tenant:t-7",
			RateKey:        "crm-api",
		},
	}))
}

// Syncs of one tenant run two at a time and ten a second.
func Example_guideKeys() {
	ctx := context.Background()
	pool, schema, drop := guideSchema(ctx)
	defer drop()
	runner, err := runCRMSync(ctx, pool, schema)
	if err != nil {
		panic(err)
	}
	defer runner.Stop(ctx) //nolint:errcheck
	client, _ := wharfflow.NewClient(pool, schema)
	var ids []int64
	for _, account := range []string{"a-1", "a-2", "a-3"} {
		id, err := startCRMSync(ctx, client, account)
		if err != nil {
			panic(err)
		}
		ids = append(ids, id...)
	}
	for _, id := range ids {
		fmt.Println(guideWait(ctx, client, id).Status)
	}
	fmt.Println(crmCalls.Load())
	// Output:
	// done
	// done
	// done
	// 3
}

// ---- Retries, failure, retry and cancel ----

type Payout struct {
	Amount int `json:"amount"`
}

var errDeclined = errors.New("card declined")

var declines atomic.Int64

// charge is the guide's pretend payment call: declined once.
func charge(ctx context.Context, amount int, idempotencyKey string) error {
	if declines.Add(1) == 1 {
		return errDeclined
	}
	return nil
}

var payout = wharfflow.New[Payout]("payout", &wharfflow.FlowConfig{
	MaxAttempts:     5,               // runs of a step before Retry fails the instance
	RetryBackoff:    time.Second,     // the first Retry's delay, doubled each time, with jitter
	MaxRetryBackoff: 5 * time.Minute, // the longest delay
}).
	Step("charge", func(ctx context.Context, p *Payout, in wharfflow.Input) wharfflow.Outcome {
		err := charge(ctx, p.Amount, in.IdempotencyKey)
		switch {
		case errors.Is(err, errDeclined):
			return wharfflow.Fail(err) // no point retrying: an operator decides
		case err != nil:
			return wharfflow.Retry(err) // after the backoff; fails the instance at MaxAttempts
		}
		return wharfflow.Done(p.Amount)
	})

func operate(ctx context.Context, client *wharfflow.Client, failed, stuck int64) error {
	// Run the failed step again, from attempt 0.
	if err := client.Retry(ctx, failed); err != nil {
		return err
	}
	// Cancel an instance and its children that have not ended.
	n, err := client.Cancel(ctx, stuck)
	if err != nil {
		return err
	}
	fmt.Println("cancelled", n)
	return nil
}

// A payout fails on a declined card; an operator retries it, and cancels
// another.
func Example_guideRetry() {
	ctx := context.Background()
	pool, schema, drop := guideSchema(ctx)
	defer drop()
	runner := guideRunner(ctx, pool, wharfflow.Config{Schema: schema, Flows: []wharfflow.Definition{payout, refund}})
	defer runner.Stop(ctx) //nolint:errcheck
	client, _ := wharfflow.NewClient(pool, schema)

	ids, err := client.Start(ctx,
		payout.Start(Payout{Amount: 4200}, wharfflow.StartOptions{}),
		refund.Start(Refund{Order: "o-8"}, wharfflow.StartOptions{Key: "o-8"}))
	if err != nil {
		panic(err)
	}
	failed := guideWait(ctx, client, ids[0])
	fmt.Println(failed.Status, failed.Error)
	if err := operate(ctx, client, ids[0], ids[1]); err != nil {
		panic(err)
	}
	retried := guideWait(ctx, client, ids[0])
	fmt.Println(retried.Status, string(retried.Result))
	fmt.Println(guideWait(ctx, client, ids[1]).Status)
	// Output:
	// failed card declined
	// cancelled 1
	// done 4200
	// cancelled
}
