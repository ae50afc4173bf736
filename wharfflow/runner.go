package wharfflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	closing bool

	// starved is set while the claim loop waits for a free slot: an
	// outcome written then wakes it.
	starved atomic.Bool

	mu       sync.Mutex
	inflight map[int64]*running
	// reserved counts free slots promised to a claim in flight (as many as
	// it asked for) and to the children an outcome write in flight may
	// lease: neither takes the other's, so at most MaxInFlight steps run.
	reserved int
	wakeIDs  []int64 // notified instances for wakeLoop
	// late are instances notified by a signal that could not resume them
	// while the runner ran them (in inflight): a write of theirs in flight
	// may have looked for pending signals before that signal committed, so
	// they are woken once their write has committed (release).
	late    map[int64]bool
	wakeSig chan struct{} // wakeLoop has ids
	// leasedSteps are steps signals leased to the runner, as their
	// notifications carried them, and leasedIDs those notified by id only
	// (too large to carry: leaseLoop reads them); leaseSig says there are
	// some. queued are such steps waiting while every slot is taken: in
	// inflight (so their leases are renewed), started as slots free,
	// before any claim.
	leasedSteps []claimed
	leasedIDs   []int64
	leaseSig    chan struct{}
	queued      []claimed
	// key addresses the runner in those notifications (flow_runners.key,
	// set when its listener registers it). listening is set while the
	// listener is connected: only then does the runner heartbeat, so that
	// signals lease to it only while it hears of them. leaving is set by
	// Stop before it removes the runner's row.
	key       atomic.Int64
	listening atomic.Bool
	leaving   atomic.Bool
	started   bool
	cancel    context.CancelFunc
	stopped   chan struct{}
}

type running struct {
	token int64
	// claim is when the runner took the lease the step runs on (a step
	// continued on its lease keeps its predecessor's: the outcome write
	// keeps the lease's end while half of it is left, so that the row's
	// update is HOT; see complete_flow_steps). renewLoop renews from it.
	claim  time.Time
	chain  int // steps run in a row on this lease (continueChain)
	cancel context.CancelCauseFunc
	queued bool // leased by a signal, waiting for a slot (Runner.queued)
}

// continueChain is how many steps of one instance a runner runs in a row
// without a claim (Next without a time continues on the same lease), so
// that a long chain does not keep its slot from other instances for ever.
const continueChain = 16

// claimShare is the share of MaxInFlight one claim asks for at most (it
// claims again at once when it got all it asked): the other slots stay free
// for the children that an outcome write in flight meanwhile leases to the
// runner.
const claimShare = 2

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
		wake: make(chan struct{}, 1), wakeSig: make(chan struct{}, 1), leaseSig: make(chan struct{}, 1), results: make(chan result, c.MaxInFlight),
		inflight: map[int64]*running{}, late: map[int64]bool{}, stopped: make(chan struct{})}
	for _, f := range c.Flows {
		r.flows[f.Name()] = f
		r.names = append(r.names, f.Name())
	}
	return r, nil
}

// ID is the runner's id (Config.RunnerID).
func (r *Runner) ID() string { return r.cfg.RunnerID }

// Start checks the schema, writes the rate limits and starts the runner's
// goroutines; it returns at once. Stop stops them.
func (r *Runner) Start(ctx context.Context) error {
	m, err := wharfmigrate.New(r.cfg.Schema)
	if err != nil {
		return err
	}
	if err := m.Check(ctx, r.pool); err != nil {
		return err
	}
	for k, rl := range r.cfg.RateLimits {
		if _, err := r.pool.Exec(ctx, `INSERT INTO `+r.cfg.Schema+`.flow_keys AS k (key, rate, burst, tokens)
VALUES ($1, $2, $3, $3) ON CONFLICT (key) DO UPDATE SET rate = excluded.rate, burst = excluded.burst,
tokens = least(k.tokens, excluded.burst)`, k, rl.PerSecond, rl.Burst); err != nil {
			return fmt.Errorf("wharfflow: writing rate limit %q: %w", k, err)
		}
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
	wg.Add(6)
	go func() { defer wg.Done(); r.listen(runCtx) }()
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
		close(r.stopped)
	}()
	return nil
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
