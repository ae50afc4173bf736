package wharfflow

// A Runner is a handful of goroutines around one set of slots (inflight,
// reserved, under mu): at most MaxInFlight steps run at once, however they
// came to the runner. Files, in the order a step goes through them:
//
//   - runner_claim.go: claimLoop leases due steps (claim_flow_steps) into
//     free slots; handBack releases leases the runner will not use.
//   - runner_exec.go: run executes one step in a goroutine and hands its
//     outcome (encode, flow.go) to the completer.
//   - runner_complete.go: complete batches outcomes and write commits them
//     (complete_flow_steps), with the messages they emit; a batch the
//     database refuses is split so that only the bad outcome fails. release
//     frees the batch's slots and runs what the write leased to the runner:
//     continued steps, children, joins, awaits whose signal came first, the
//     next steps of its concurrency keys.
//   - runner_listen.go: one LISTEN connection; notifications are hints
//     (any role may NOTIFY): '' means something is due (claim), 'L' names
//     steps a signal leased to the runner (leaseLoop reads them), 'W' names
//     instances a signal could not resume (wakeLoop).
//   - runner_leased.go: leaseLoop runs the steps signals leased to the
//     runner once the database confirmed the lease (flow_leased_steps), and
//     hands back those it has no slot or no flow for.
//   - runner_wake.go: wakeLoop calls wake_flows for signalled instances.
//   - runner_cancel.go: cancelLoop stops the steps of instances cancelled
//     while they ran ('C' notifications, checked against the database).
//   - runner_register.go: the runner's flow_runners row (signals lease only
//     to live, listening runners).
//   - runner_renew.go: renewLoop extends the leases of long steps and
//     cancels steps whose lease was lost.
//   - runner_maint.go: cleanupLoop deletes expired instances, repairs lost
//     joins, removes dead runners' rows.
//
// Every time two processes must agree on (a lease's end, a due time, the
// retention cut-off) is the database's: the runner only measures durations
// on its own clock.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Runner claims due steps of its flows, runs them and writes their outcomes.
// Any number of runners may share a database.
type Runner struct {
	cfg    Config
	pool   *pgxpool.Pool
	outbox *wharf.Client
	flows  map[string]Definition
	names  []string
	stats  *Stats

	wake    chan struct{}
	results chan result

	// steps counts the step goroutines; closing (under mu) is set before
	// the claim loop waits for them, after which no continued step starts.
	steps   sync.WaitGroup
	workers workers // the goroutines steps run on
	closing bool

	// starved is set while the claim loop waits for a free slot: an
	// outcome written then wakes it.
	starved atomic.Bool

	mu       sync.Mutex
	inflight map[int64]*running
	// reserved counts free slots promised to a claim in flight (as many as
	// it asked for) and to what an outcome write in flight may lease:
	// neither takes the other's, so at most MaxInFlight steps run.
	reserved int
	wakeIDs  []int64 // notified instances for wakeLoop
	// wakeAll is set when more ids were notified than wakeIDs keeps: the
	// wake loop then checks every awaiting instance once.
	wakeAll bool
	// late are instances notified by a signal that could not resume them
	// while the runner ran them (in inflight): a write of theirs in flight
	// may have looked for pending signals before that signal committed, so
	// they are woken once their write has committed (release).
	late    map[int64]bool
	wakeSig chan struct{} // wakeLoop has ids
	// leasedIDs are the instances lease notifications named for leaseLoop
	// to read, with the registration key they were leased to (bounded: past
	// maxPending it reads every step leased to the runner's registration
	// instead, unheardAll); leaseSig says there are some.
	leasedIDs  []leaseRef
	unheardAll bool
	leaseSig   chan struct{}
	// cancelIDs are instances cancelled while the runner ran them, as 'C'
	// notifications name them, for cancelLoop (bounded by maxPending: the
	// rest stop at their next renewal); cancelSig says there are some.
	cancelIDs []int64
	cancelSig chan struct{}
	// queued are steps signals leased to the runner while every slot was
	// taken, waiting (not renewed, at most maxPending) for queueFor before
	// they are handed back; started as slots free, before any claim.
	queued []queuedStep
	// confirming are the queued steps (id → token) startQueued is
	// confirming with the database before it starts them; nil when none.
	confirming map[int64]int64
	// ran are the steps signals leased to the runner that it ran (id →
	// token), kept while a read of leased steps (leaseLoop) that began
	// before their outcome committed may still name them: such a read
	// would otherwise run the step again once its slot was released.
	// ranSeq numbers their releases; a read started at ranSeq s needs only
	// the entries released since s.
	ran    map[int64]ranStep
	ranSeq uint64
	// reading is the ranSeq at which the oldest read of leased steps in
	// flight began (0: none).
	reading uint64
	// batons are steps of concurrency keys reserved to the runner
	// (flow_key_free), by key: when a step of the key ends, the runner
	// starts one at once in the slot it frees, and names it in the step's
	// outcome, whose write makes it running. deferred holds the results of
	// batons that ended before that write was released.
	batons   map[string][]claimed
	deferred map[int64]result
	// keyRunning counts the steps of each concurrency key executing on the
	// runner: it holds no more batons of a key than that (a baton no step
	// of the runner could pass on would wait out its reservation).
	keyRunning map[string]int
	resubmit   []result // deferred results whose baton a write made running
	// key addresses the runner in those notifications (flow_runners.key,
	// set when its listener registers it). listening is set while the
	// listener is connected: only then does the runner heartbeat, so that
	// signals lease to it only while it hears of them. leaving is set by
	// Stop before it removes the runner's row.
	key       atomic.Int64
	listening atomic.Bool
	leaving   atomic.Bool
	// twinWarned: another process registered with this RunnerID (logged
	// once).
	twinWarned atomic.Bool
	// malformedSeen: a notification the runner could not read was logged.
	malformedSeen atomic.Bool
	started       bool
	cancel        context.CancelFunc
	stopped       chan struct{}
}

type running struct {
	token int64
	// claim is when the lease the step runs on began, on the runner's clock
	// (a step continued on its lease keeps its predecessor's: the outcome
	// write keeps the lease's end while half of it is left, so that the
	// row's update is HOT; see complete_flow_steps). renewLoop renews from
	// it.
	claim  time.Time
	chain  int // steps run in a row on this lease (continueChain)
	cancel context.CancelCauseFunc
	// unconverted: a baton started before the write that makes it running
	// committed; its result waits in Runner.deferred until then (written
	// with that write, it would find its row not running yet). dropped: that
	// write did not make it running; its result is not written.
	unconverted, dropped bool
}

// leaseRef is an instance a lease notification named, and the runner key
// it was addressed to.
type leaseRef struct{ key, id int64 }

type ranStep struct {
	token int64
	seq   uint64
}

// continueChain is how many steps of one instance a runner runs in a row
// without a claim (Next without a time continues on the same lease), so
// that a long chain does not keep its slot from other instances for ever.
const continueChain = 16

// claimShare is the share of MaxInFlight one claim asks for at most (it
// claims again at once when it got all it asked): the other slots stay free
// for what an outcome write in flight meanwhile leases to the runner.
const claimShare = 2

// maxPending bounds the ids notifications queue for the wake and lease
// loops: past it, a loop does the work for every instance at once
// (wake_flows(NULL), flow_unheard_leases) instead of keeping more ids, so a
// flood of notifications costs no memory.
const maxPending = 10000

// errLeaseLost is the cause of a step's context when its lease was lost.
var errLeaseLost = errors.New("wharfflow: the step's lease was lost")

// NewRunner returns a runner; Start runs it.
func NewRunner(pool *pgxpool.Pool, cfg *Config) (*Runner, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("wharfflow: NewRunner needs a pool")
	}
	outbox, err := wharf.NewClient(nil, &wharf.Config{Schema: c.Schema, Logger: c.Logger})
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, pool: pool, outbox: outbox, flows: map[string]Definition{}, stats: newStats(),
		wake: make(chan struct{}, 1), wakeSig: make(chan struct{}, 1), leaseSig: make(chan struct{}, 1), cancelSig: make(chan struct{}, 1), results: make(chan result, c.MaxInFlight),
		inflight: map[int64]*running{}, late: map[int64]bool{}, ran: map[int64]ranStep{}, batons: map[string][]claimed{}, keyRunning: map[string]int{},
		deferred: map[int64]result{}, stopped: make(chan struct{})}
	for _, f := range c.Flows {
		r.flows[f.Name()] = f
		r.names = append(r.names, f.Name())
	}
	return r, nil
}

// ID is the runner's id (Config.RunnerID).
func (r *Runner) ID() string { return r.cfg.RunnerID }

// Start checks the schema, writes the flows' definitions, the concurrency
// and rate limits, and starts the runner's goroutines; it returns at once.
// Stop stops them.
func (r *Runner) Start(ctx context.Context) error {
	m, err := wharfmigrate.New(r.cfg.Schema)
	if err != nil {
		return err
	}
	if err := m.Check(ctx, r.pool); err != nil {
		return err
	}
	if err := r.writeSettings(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errors.New("wharfflow: the runner was started already")
	}
	r.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	r.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(7)
	go func() { defer wg.Done(); r.listen(runCtx) }()
	go func() { defer wg.Done(); r.cancelLoop(runCtx) }()
	go func() { defer wg.Done(); r.wakeLoop(runCtx) }()
	go func() { defer wg.Done(); r.leaseLoop(runCtx) }()
	go func() { defer wg.Done(); r.renewLoop(runCtx) }()
	go func() { defer wg.Done(); r.cleanupLoop(runCtx) }()
	completerDone := make(chan struct{})
	go func() { defer wg.Done(); r.complete(runCtx, completerDone) }()
	go func() {
		r.claimLoop(runCtx)
		close(completerDone)
		wg.Wait()
		// Instances whose last write committed after wakeLoop stopped.
		r.mu.Lock()
		ids := r.wakeIDs
		r.mu.Unlock()
		if len(ids) > 0 {
			r.wakeOnce(context.WithoutCancel(runCtx), ids)
		}
		r.workers.close()
		close(r.stopped)
	}()
	return nil
}

// writeSettings writes, in one transaction, the definitions of the
// runner's flows (their steps, for starts from SQL) and the keys' limits of
// Config, under the keys' locks (flow_lock_keys) as claims read them.
func (r *Runner) writeSettings(ctx context.Context) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		s := r.cfg.Schema
		for _, f := range r.cfg.Flows {
			if _, err := tx.Exec(ctx, "INSERT INTO "+s+`.flow_definitions AS d (flow, first_step, steps, runner)
VALUES ($1, $2, $3, $4) ON CONFLICT (flow) DO UPDATE SET first_step = excluded.first_step, steps = excluded.steps,
runner = excluded.runner, updated_at = now()
WHERE (d.first_step, d.steps) IS DISTINCT FROM (excluded.first_step, excluded.steps)`,
				f.Name(), f.firstStep(), f.stepNames(), r.cfg.RunnerID); err != nil {
				return fmt.Errorf("wharfflow: writing the definition of flow %s: %w", f.Name(), err)
			}
		}
		var keys []string
		for k := range r.cfg.RateLimits {
			keys = append(keys, k)
		}
		for k := range r.cfg.ConcurrencyLimits {
			keys = append(keys, k)
		}
		if len(keys) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, "SELECT "+s+".flow_lock_keys($1)", keys); err != nil {
			return fmt.Errorf("wharfflow: locking the keys of Config: %w", err)
		}
		for k, rl := range r.cfg.RateLimits {
			if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.flow_keys AS k (key, rate, burst, tokens)
VALUES ($1, $2, $3, $3) ON CONFLICT (key) DO UPDATE SET rate = excluded.rate, burst = excluded.burst,
tokens = least(k.tokens, excluded.burst)`, k, rl.PerSecond, rl.Burst); err != nil {
				return fmt.Errorf("wharfflow: writing rate limit %q: %w", k, err)
			}
		}
		for k, n := range r.cfg.ConcurrencyLimits {
			if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.flow_keys AS k (key, concurrency_limit)
VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET concurrency_limit = excluded.concurrency_limit`, k, n); err != nil {
				return fmt.Errorf("wharfflow: writing concurrency limit %q: %w", k, err)
			}
		}
		return nil
	})
}

// Stop stops claiming, waits for the running steps to end and their
// outcomes to be written, or for ctx: then the steps are cancelled, and
// steps whose outcome was not written run again after their lease.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	if cancel == nil {
		return errors.New("wharfflow: the runner was not started")
	}
	// Signals lease to the runner no more; those that did meanwhile are
	// handed back (leaseLoop) or wait out their lease.
	r.leaving.Store(true)
	r.deregister(ctx)
	cancel()
	select {
	case <-r.stopped:
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		for _, s := range r.inflight {
			s.cancel(ctx.Err())
		}
		r.mu.Unlock()
		<-r.stopped
		return ctx.Err()
	}
}

// Stopped is closed when the runner has stopped.
func (r *Runner) Stopped() <-chan struct{} { return r.stopped }

// Stats returns the runner's counters.
func (r *Runner) Stats() *Stats { return r.stats }

func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// freeSlots is how many steps the runner may start now. r.mu is held.
func (r *Runner) freeSlots() int {
	return r.cfg.MaxInFlight - len(r.inflight) - r.reserved
}
