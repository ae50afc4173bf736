package wharfflow

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// RateLimit is a token bucket: PerSecond tokens a second, at most Burst
// saved up.
type RateLimit struct {
	PerSecond float64
	// Burst defaults to 1.
	Burst float64
}

// Config configures a Runner.
type Config struct {
	// Schema is the schema of the outbox and its flows. Defaults to wharf.
	Schema string
	// Flows are the flows this runner executes; it claims steps of these
	// flows only. Required.
	Flows []Definition
	// RunnerID names the runner in leases and step history. Defaults to
	// host-pid-random.
	RunnerID string
	// MaxInFlight is how many steps run at once. Defaults to 256.
	MaxInFlight int
	// LeaseTTL is how long a claimed step is the runner's without renewal;
	// a step of a runner that died runs again after it. Renewed every third
	// of it while the step runs. Defaults to 30s.
	LeaseTTL time.Duration
	// RateLimits sets the token buckets of rate keys (Options.RateKey),
	// written to the database when the runner starts.
	RateLimits map[string]RateLimit
	// Retention is how long done and cancelled instances are kept. Defaults
	// to 7 days.
	Retention time.Duration
	// CleanupInterval is how often expired instances are deleted (in
	// batches of 1000). Defaults to 1m.
	CleanupInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, counts this runner's steps (NewMetrics; one
	// Metrics may serve every runner of a process).
	Metrics *Metrics
	// Tracer, when set, makes a span of each executed step, a child of the
	// trace context its instance (or its nearest ancestor) was started
	// with (NewClient WithTracer); wharfotel.New() implements it. When it
	// is also a wharf.Tracer (wharfotel's is), the messages a step emits
	// carry the step span's context. Costs one query per claim when set,
	// nothing when nil.
	Tracer Tracer
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = wharfmigrate.DefaultSchema
	}
	if err := wharfmigrate.ValidateSchema(out.Schema); err != nil {
		return out, fmt.Errorf("wharfflow: Config.Schema: %w", err)
	}
	if len(out.Flows) == 0 {
		return out, errors.New("wharfflow: Config.Flows is empty: give the runner the flows it executes")
	}
	seen := map[string]bool{}
	for i, f := range out.Flows {
		if f == nil || f.Name() == "" || f.firstStep() == "" {
			return out, fmt.Errorf("wharfflow: Config.Flows[%d]: a flow needs a name and at least one step", i)
		}
		if seen[f.Name()] {
			return out, fmt.Errorf("wharfflow: Config.Flows: flow %s is given twice", f.Name())
		}
		seen[f.Name()] = true
	}
	if out.RunnerID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		out.RunnerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if out.MaxInFlight <= 0 {
		out.MaxInFlight = 256
	}
	if out.LeaseTTL <= 0 {
		out.LeaseTTL = 30 * time.Second
	}
	if out.LeaseTTL < 100*time.Millisecond {
		return out, fmt.Errorf("wharfflow: Config.LeaseTTL %s is too short: use at least 100ms", out.LeaseTTL)
	}
	for k, rl := range out.RateLimits {
		if rl.PerSecond <= 0 {
			return out, fmt.Errorf("wharfflow: Config.RateLimits[%q]: PerSecond must be positive", k)
		}
		if rl.Burst == 0 {
			rl.Burst = 1
			out.RateLimits[k] = rl
		}
		if rl.Burst < 1 {
			return out, fmt.Errorf("wharfflow: Config.RateLimits[%q]: Burst must be at least 1", k)
		}
	}
	if out.Retention <= 0 {
		out.Retention = 7 * 24 * time.Hour
	}
	if out.CleanupInterval <= 0 {
		out.CleanupInterval = time.Minute
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

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

// claimed is a row claim_flow_steps returned.
type claimed struct {
	ID       int64
	Flow     string
	Step     string
	State    []byte
	Attempt  int
	Token    int64
	Until    time.Time
	Signals  []ReceivedSignal
	Children []ChildResult
	Trace    map[string]string // the start's trace context, with a Tracer
	parent   int64             // a child leased by its spawn's write: the spawning instance
	// leased is when the runner took the lease this step runs on, for a
	// step continued on its predecessor's lease (zero: the step starts a
	// lease of its own).
	leased time.Time
}

type result struct {
	c       claimed
	w       wireOutcome
	emit    []wharf.Message
	elapsed time.Duration
	chain   int
}

// claimLoop claims as many due steps as there are free slots, runs them,
// and sleeps until a notification, an outcome written, or the next due
// time.
func (r *Runner) claimLoop(ctx context.Context) {
	defer func() {
		r.mu.Lock()
		r.closing = true
		queued := r.queued
		r.queued = nil
		for _, c := range queued {
			delete(r.inflight, c.ID)
		}
		r.mu.Unlock()
		r.handBack(ctx, queued)
		r.steps.Wait()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoffDelay := 100 * time.Millisecond
	for ctx.Err() == nil {
		r.mu.Lock()
		free := r.cfg.MaxInFlight - len(r.inflight) - r.reserved
		// Under mu, with the slots counted: a release that frees one after
		// this sees it set.
		r.starved.Store(free <= 0)
		ask := min(free, max(1, r.cfg.MaxInFlight/claimShare))
		if ask > 0 {
			r.reserved += ask
		}
		r.mu.Unlock()
		var sleep time.Duration = -1 // until woken
		if ask > 0 {
			// A claim that Stop cancelled mid-statement may have committed
			// its leases without the rows reaching the runner: they would
			// wait out their leases. The claim ends on its own (bounded by
			// the lease it takes), and what it got is handed back if the
			// runner is stopping.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
			rows, next, err := r.claim(cctx, ask)
			cancel()
			if ctx.Err() != nil {
				r.mu.Lock()
				r.reserved -= ask
				r.mu.Unlock()
				r.handBack(ctx, rows)
				return
			}
			switch {
			case err != nil:
				r.cfg.Logger.Warn("wharfflow: claiming steps", "err", err)
				sleep = backoffDelay
				backoffDelay = min(2*backoffDelay, 5*time.Second)
			case len(rows) == ask:
				backoffDelay = 100 * time.Millisecond
				sleep = 0 // more may be due; claim again when a slot frees
			default:
				backoffDelay = 100 * time.Millisecond
				// Rows leased by another runner's write (continued steps,
				// children, joins) are not notified: looking again after
				// LeaseTTL at the latest, an idle runner learns their lease
				// ends and takes them over if their runner died.
				sleep = r.cfg.LeaseTTL
				if next != nil {
					sleep = min(max(time.Until(*next), time.Millisecond), r.cfg.LeaseTTL)
				}
			}
			r.stats.claimed.Add(int64(len(rows)))
			r.mu.Lock()
			for _, c := range rows {
				r.run(ctx, c, 0)
			}
			r.reserved -= ask
			r.startQueued(ctx)
			r.mu.Unlock()
			if sleep == 0 {
				continue
			}
		}
		if sleep > 0 {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// handBack releases the leases of claimed steps the stopping runner will
// not run: they are due at once, for another runner.
func (r *Runner) handBack(ctx context.Context, rows []claimed) {
	if len(rows) == 0 {
		return
	}
	ids, tokens := make([]int64, len(rows)), make([]int64, len(rows))
	for i, c := range rows {
		ids[i], tokens[i] = c.ID, c.Token
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	if _, err := r.pool.Exec(hctx, "SELECT "+r.cfg.Schema+".release_flow_leases($1, $2, $3)", r.cfg.RunnerID, ids, tokens); err != nil {
		r.cfg.Logger.Warn("wharfflow: handing back steps; they run after their lease", "err", err)
	}
}

// claim leases up to n due steps. When it got fewer, next is when the
// next row falls due (nil: none is scheduled; a notification or an outcome
// written wakes the runner).
func (r *Runner) claim(ctx context.Context, n int) (out []claimed, next *time.Time, err error) {
	return r.queryClaimed(ctx, "SELECT id, flow, step, state, attempt, lease_token, lease_until, signals, children FROM "+
		r.cfg.Schema+".claim_flow_steps($1, $2, $3, $4)", r.cfg.RunnerID, r.names, n, r.cfg.LeaseTTL)
}

// queryClaimed reads rows shaped as claim_flow_steps returns them (and
// flow_leased_steps), with their trace context.
func (r *Runner) queryClaimed(ctx context.Context, sql string, args ...any) (out []claimed, next *time.Time, err error) {
	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c claimed
		var sigs, children []byte
		var until *time.Time
		if err := rows.Scan(&c.ID, &c.Flow, &c.Step, &c.State, &c.Attempt, &c.Token, &until, &sigs, &children); err != nil {
			return nil, nil, err
		}
		if c.ID == 0 { // the next due time
			next = until
			continue
		}
		if until != nil {
			c.Until = *until
		}
		if len(sigs) > 0 {
			if err := json.Unmarshal(sigs, &c.Signals); err != nil {
				return nil, nil, err
			}
		}
		if len(children) > 0 {
			if err := json.Unmarshal(children, &c.Children); err != nil {
				return nil, nil, err
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if err := r.loadTraces(ctx, out); err != nil {
		// The steps are leased: run them, untraced, rather than wait for
		// their leases to end.
		r.cfg.Logger.Warn("wharfflow: reading the steps' trace context", "err", err)
	}
	return out, next, nil
}

// run executes one claimed step in a goroutine and hands its outcome to the
// completer. r.mu is held.
func (r *Runner) run(ctx context.Context, c claimed, chain int) {
	stepCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	leased := c.leased
	if leased.IsZero() {
		leased = time.Now()
	}
	r.inflight[c.ID] = &running{token: c.Token, claim: leased, chain: chain, cancel: cancel}
	c.leased = leased
	r.steps.Add(1)
	go func() {
		defer r.steps.Done()
		def := r.flows[c.Flow]
		in := Input{Instance: c.ID, Flow: c.Flow, Step: c.Step, Attempt: c.Attempt, Signals: c.Signals,
			Children: c.Children, IdempotencyKey: idempotencyKey(c.ID, c.Step, c.Attempt)}
		start := time.Now()
		runCtx, endSpan := r.traceStep(stepCtx, c)
		state, o := def.run(runCtx, c.State, in)
		res := result{c: c, w: encode(def, c, state, o, start), emit: o.emit, elapsed: time.Since(start), chain: chain}
		if res.w.Kind == "fail" && state == nil {
			res.w.State = nil // keep the saved state
		}
		res.emit = endSpan(res.w, res.emit)
		res.w.Cont = res.w.Kind == "next" && res.w.RunAt == nil && chain+1 < continueChain && ctx.Err() == nil
		r.results <- res
	}()
}

// complete writes outcomes in batches: whatever came while the previous
// batch was being written goes in the next one.
func (r *Runner) complete(ctx context.Context, claimDone <-chan struct{}) {
	batch := make([]result, 0, r.cfg.MaxInFlight)
	for {
		select {
		case res := <-r.results:
			batch = append(batch[:0], res)
		case <-claimDone:
			// The claim loop waited for its steps; write what they left.
			for {
				select {
				case res := <-r.results:
					batch = append(batch, res)
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				r.write(ctx, batch)
			}
			return
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case res := <-r.results:
				batch = append(batch, res)
			default:
				break more
			}
		}
		r.write(ctx, batch)
		batch = batch[:0]
	}
}

// write applies one batch of outcomes: one statement, or a transaction of
// two when outcomes emit outbox messages. Outcomes of steps whose lease was
// lost are not applied, and their messages are not enqueued. The write may
// lease to the runner the children its spawns start and the joins of the
// parents whose last child it ends (planLeases); release runs them.
func (r *Runner) write(runCtx context.Context, batch []result) {
	ctx := context.WithoutCancel(runCtx)
	ws := make([]wireOutcome, len(batch))
	emits := false
	for i := range batch {
		ws[i] = batch[i].w
		emits = emits || len(batch[i].emit) > 0
	}
	flows, reserve := r.planLeases(runCtx, ws)
	// In id order, the order the write then locks the instances in, as
	// wake_flows does: the two never wait on each other in a cycle.
	slices.SortFunc(ws, func(a, b wireOutcome) int { return cmp.Compare(a.ID, b.ID) })
	doc, err := json.Marshal(ws)
	if err != nil {
		r.cfg.Logger.Error("wharfflow: encoding outcomes", "err", err)
		r.release(runCtx, batch, writeResult{}, reserve)
		return
	}
	q := "SELECT id, token, flow, step, state, attempt, parent_id, children, signals FROM " + r.cfg.Schema +
		".complete_flow_steps($1, $2::jsonb, $3, $4)"
	var wr writeResult
	for attempt := 0; ; attempt++ {
		wr = writeResult{applied: map[int64]int64{}}
		if !emits {
			err = r.scanApplied(ctx, r.pool, q, string(doc), flows, &wr)
		} else {
			err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
				if err := r.scanApplied(ctx, tx, q, string(doc), flows, &wr); err != nil {
					return err
				}
				var msgs []wharf.Message
				for i := range batch {
					if _, ok := wr.applied[batch[i].c.ID]; ok {
						msgs = append(msgs, batch[i].emit...)
					}
				}
				_, err := r.outbox.EnqueueTx(ctx, tx, msgs...)
				return err
			})
		}
		if err == nil || attempt >= 4 {
			break
		}
		r.cfg.Logger.Warn("wharfflow: writing outcomes, will retry", "err", err, "steps", len(batch))
		time.Sleep(time.Duration(50<<attempt) * time.Millisecond)
	}
	if err != nil {
		r.cfg.Logger.Error("wharfflow: writing outcomes failed; the steps run again after their leases", "err", err, "steps", len(batch))
		wr = writeResult{}
	}
	if len(wr.leased) > 0 {
		r.leasedTraces(ctx, batch, wr.leased)
	}
	if len(wr.resumed) > 0 {
		traces := make(map[int64]map[string]string, len(batch))
		for i := range batch {
			traces[batch[i].c.ID] = batch[i].c.Trace
		}
		for i := range wr.resumed {
			wr.resumed[i].Trace = traces[wr.resumed[i].ID]
		}
	}
	r.release(runCtx, batch, wr, reserve)
}

// writeResult is what complete_flow_steps answered.
type writeResult struct {
	// applied are the applied outcomes' ids, with the new token of those
	// that continue on their lease (0 for the others).
	applied map[int64]int64
	// leased are the instances the write leased to the runner: spawned
	// children, and parents at their join step.
	leased []claimed
	// resumed are the awaits of the batch whose signal came first, leased
	// back to the runner with their signals.
	resumed []claimed
	// due is how many steps the write made due for any runner's claim.
	due int64
}

// planLeases decides which spawned children the write asks to lease to the
// runner, marking them in ws, and returns the flows to pass (nil: lease
// nothing, the runner is stopping) and the slots it reserved for them.
//
// A child qualifies when the runner runs its flow and it has no keys (a
// keyed child goes through the claim, which applies its keys). Every
// outcome but a continued Next frees its slot with the write; a done or
// failed one may lease its parent's join in it, the others' slots go to
// children, and beyond those the write reserves free slots (not those of a
// claim in flight). Children left over are inserted runnable, for any
// runner's claim.
func (r *Runner) planLeases(ctx context.Context, ws []wireOutcome) (flows []string, reserve int) {
	freed, joins, want := 0, 0, 0
	for i := range ws {
		if !ws[i].Cont {
			freed++
		}
		switch ws[i].Kind {
		case "done", "fail":
			joins++
		case "spawn":
			for _, ch := range ws[i].Children {
				if r.leasable(ch) {
					want++
				}
			}
		}
	}
	r.mu.Lock()
	if r.closing || ctx.Err() != nil {
		r.mu.Unlock()
		return nil, 0
	}
	budget := freed - joins
	if want > budget {
		reserve = max(0, min(want-budget, r.cfg.MaxInFlight-len(r.inflight)-r.reserved))
		r.reserved += reserve
		budget += reserve
	}
	r.mu.Unlock()
	for i := range ws {
		if ws[i].Kind != "spawn" || budget <= 0 {
			continue
		}
		kids := slices.Clone(ws[i].Children)
		for j := range kids {
			if budget > 0 && r.leasable(kids[j]) {
				kids[j].Lease = true
				budget--
			}
		}
		ws[i].Children = kids
	}
	return r.names, reserve
}

// leasable: a child the write may lease to this runner.
func (r *Runner) leasable(ch wireChild) bool {
	_, ok := r.flows[ch.Flow]
	return ok && ch.ConcurrencyKey == "" && ch.RateKey == ""
}

// leasedTraces gives the instances a write leased their trace context: a
// child its spawning step's (a child has none of its own, its nearest
// ancestor's is its parent's), a join its own, read as a claim's are.
func (r *Runner) leasedTraces(ctx context.Context, batch []result, leased []claimed) {
	if r.cfg.Tracer == nil {
		return
	}
	spawners := map[int64]map[string]string{}
	for i := range batch {
		spawners[batch[i].c.ID] = batch[i].c.Trace
	}
	var joins []claimed
	var at []int
	for i := range leased {
		if t, ok := spawners[leased[i].parent]; ok && leased[i].Children == nil {
			leased[i].Trace = t
			continue
		}
		joins = append(joins, leased[i])
		at = append(at, i)
	}
	if err := r.loadTraces(ctx, joins); err != nil {
		r.cfg.Logger.Warn("wharfflow: reading the leased joins' trace context", "err", err)
		return
	}
	for k, i := range at {
		leased[i].Trace = joins[k].Trace
	}
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// scanApplied reads complete_flow_steps's answer into wr.
func (r *Runner) scanApplied(ctx context.Context, q queryer, sql, doc string, flows []string, wr *writeResult) error {
	rows, err := q.Query(ctx, sql, r.cfg.RunnerID, doc, r.cfg.LeaseTTL, flows)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var token, parent *int64
		var flow, step *string
		var state, children, signals []byte
		var attempt *int
		if err := rows.Scan(&id, &token, &flow, &step, &state, &attempt, &parent, &children, &signals); err != nil {
			return err
		}
		switch {
		case id == 0: // the steps made due
			if token != nil {
				wr.due = *token
			}
		case flow == nil: // an applied outcome
			wr.applied[id] = 0
			if token != nil {
				wr.applied[id] = *token
			}
		default: // an instance leased to the runner
			c := claimed{ID: id, Flow: *flow, State: state}
			if token != nil {
				c.Token = *token
			}
			if step != nil {
				c.Step = *step
			}
			if attempt != nil {
				c.Attempt = *attempt
			}
			if parent != nil {
				c.parent = *parent
			}
			if len(children) > 0 {
				if err := json.Unmarshal(children, &c.Children); err != nil {
					return err
				}
			}
			if len(signals) > 0 {
				if err := json.Unmarshal(signals, &c.Signals); err != nil {
					return err
				}
				wr.resumed = append(wr.resumed, c)
				continue
			}
			wr.leased = append(wr.leased, c)
		}
	}
	return rows.Err()
}

// release frees the batch's slots, runs the next step of those that
// continue on their lease and the instances the write leased to the runner
// (or hands them back when it is stopping), returns the write's reserved
// slots, counts the batch and wakes the claim loop when a claim may find
// something.
func (r *Runner) release(ctx context.Context, batch []result, wr writeResult, reserve int) {
	var backIDs, backTokens []int64
	lateWoken := false
	r.mu.Lock()
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		if s, ok := r.inflight[id]; ok && s.token == res.c.Token {
			s.cancel(nil)
			delete(r.inflight, id)
		}
		if r.late[id] {
			delete(r.late, id)
			r.wakeIDs = append(r.wakeIDs, id)
			lateWoken = true
		}
	}
	stopping := r.closing || ctx.Err() != nil
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		token := wr.applied[id]
		if token == 0 {
			continue
		}
		if stopping {
			backIDs = append(backIDs, id)
			backTokens = append(backTokens, token)
			continue
		}
		r.run(ctx, claimed{ID: id, Flow: res.c.Flow, Step: res.w.Step, State: res.w.State, Token: token, Trace: res.c.Trace,
			leased: res.c.leased}, res.chain+1)
	}
	for _, c := range wr.leased {
		if stopping {
			backIDs = append(backIDs, c.ID)
			backTokens = append(backTokens, c.Token)
			continue
		}
		r.stats.leased.Add(1) // before the step starts, for whoever it tells
		r.run(ctx, c, 0)
	}
	for _, c := range wr.resumed {
		if stopping {
			backIDs = append(backIDs, c.ID)
			backTokens = append(backTokens, c.Token)
			continue
		}
		c.leased = time.Now()
		r.queue(c)
	}
	r.reserved -= reserve
	if !stopping {
		r.startQueued(ctx)
	}
	r.mu.Unlock()
	if lateWoken {
		r.wakeLater()
	}
	if len(backIDs) > 0 {
		if _, err := r.pool.Exec(context.WithoutCancel(ctx), "SELECT "+r.cfg.Schema+".release_flow_leases($1, $2, $3)",
			r.cfg.RunnerID, backIDs, backTokens); err != nil {
			r.cfg.Logger.Warn("wharfflow: handing back steps; they run after their lease", "err", err)
		}
	}
	// A claim may find something when the write made steps due (children
	// it did not lease, joins and keys' next steps, awaits whose signal
	// came first: complete_flow_steps notifies them too, but the
	// listener's round trip is slower than this), when an outcome
	// scheduled its own instance (NextAt, Retry, RateLimited, an Await's
	// deadline: the claim sets the timer), or a slot freed while the claim
	// loop waited for one. Steps continued on their lease, and children
	// and joins leased to the runner, need no claim.
	wake := r.starved.Load() || wr.due > 0
	for i := range batch {
		token, ok := wr.applied[batch[i].c.ID]
		r.stats.observe(batch[i], ok)
		r.cfg.Metrics.observe(batch[i], ok)
		if !ok {
			r.cfg.Logger.Warn("wharfflow: outcome not applied: the step's lease was lost (or the instance cancelled)",
				"instance", batch[i].c.ID, "step", batch[i].c.Step)
			// Its lease still ends: the claim sets the timer for it.
			wake = true
			continue
		}
		switch w := batch[i].w; w.Kind {
		case "next", "retry", "paused":
			wake = wake || token == 0
		case "await":
			wake = wake || w.Deadline != nil
		}
	}
	if wake {
		r.poke()
	}
}

// renewLoop extends the leases of steps running longer than a third of
// LeaseTTL, and cancels the steps whose lease was lost.
func (r *Runner) renewLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.listening.Load() {
			r.heartbeat(ctx)
		}
		r.mu.Lock()
		var ids, tokens []int64
		cutoff := time.Now().Add(-r.cfg.LeaseTTL / 3)
		for id, s := range r.inflight {
			if s.claim.Before(cutoff) {
				ids = append(ids, id)
				tokens = append(tokens, s.token)
			}
		}
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		rows, err := r.pool.Query(ctx, "SELECT * FROM "+r.cfg.Schema+".renew_flow_leases($1, $2, $3, $4)",
			r.cfg.RunnerID, ids, tokens, r.cfg.LeaseTTL)
		if err != nil {
			r.cfg.Logger.Warn("wharfflow: renewing leases", "err", err)
			continue
		}
		kept := map[int64]bool{}
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				kept[id] = true
			}
		}
		rows.Close()
		if rows.Err() != nil {
			continue
		}
		wake := false
		r.mu.Lock()
		for i, id := range ids {
			if s, ok := r.inflight[id]; ok && s.token == tokens[i] && !kept[id] {
				s.cancel(errLeaseLost)
				if s.queued {
					delete(r.inflight, id)
					r.queued = slices.DeleteFunc(r.queued, func(c claimed) bool { return c.ID == id })
					// The runner that took it over may have written its
					// await before the signal committed, and may have heard
					// the notification while it ran nothing of it.
					if r.late[id] {
						delete(r.late, id)
						r.wakeIDs = append(r.wakeIDs, id)
						wake = true
					}
				}
			}
		}
		r.mu.Unlock()
		if wake {
			r.wakeLater()
		}
	}
}

// listen wakes the claim loop on notifications: a start, a step made due,
// or a signal (whose instance it checks, in case the signal committed
// after its await was written).
func (r *Runner) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("wharfflow: listening for notifications", "err", err)
		// Deaf until it listens again: signals stop leasing to the runner
		// (best effort; else once its heartbeat ends).
		if _, err := r.pool.Exec(ctx, "UPDATE "+r.cfg.Schema+".flow_runners SET alive_until = clock_timestamp() WHERE id = $1 AND key = $2",
			r.cfg.RunnerID, r.key.Load()); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: marking the runner deaf", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Runner) listenOnce(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+r.cfg.Schema+"_flows"); err != nil {
		return err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *")
	}()
	// Listening: signals may lease instances to the runner from now on.
	// A runner that cannot register (a role without the right to write
	// flow_runners) still listens: its awaits' signals go through claims.
	before := r.key.Load()
	if err := r.register(ctx, conn); err != nil {
		if ctx.Err() != nil {
			return err
		}
		r.cfg.Logger.Warn("wharfflow: signals will not lease steps to this runner (they go through claims)", "err", err)
	} else {
		r.listening.Store(true)
		defer r.listening.Store(false)
		if before != 0 {
			// Signals may have leased steps to the registration before
			// this one while nobody listened (its row stays alive for a
			// while when the listener drops with the database): read them
			// now rather than after their lease.
			if err := r.unheard(ctx, conn, before); err != nil {
				return err
			}
		}
	}
	// Signals may have come while nobody listened: check every awaiting
	// instance with a pending signal once.
	if _, err := conn.Exec(ctx, "SELECT "+r.cfg.Schema+".wake_flows(NULL)"); err != nil {
		return err
	}
	r.poke()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if strings.HasPrefix(n.Payload, "L") { // instances a signal leased to a runner
			steps, ids, mine, err := parseLeased(n.Payload, r.key.Load())
			if err != nil {
				r.cfg.Logger.Warn("wharfflow: a notification of leased steps", "err", err)
				continue
			}
			if !mine {
				continue
			}
			r.mu.Lock()
			r.leasedSteps = append(r.leasedSteps, steps...)
			r.leasedIDs = append(r.leasedIDs, ids...)
			r.mu.Unlock()
			r.leaseLater()
			continue
		}
		if strings.HasPrefix(n.Payload, "W") { // instances a signal could not resume
			ids, mine, err := parseLate(n.Payload, r.key.Load())
			if err != nil {
				r.cfg.Logger.Warn("wharfflow: a notification of signalled instances", "err", err)
				continue
			}
			wake := false
			r.mu.Lock()
			for _, id := range ids {
				if _, running := r.inflight[id]; running {
					r.late[id] = true
				} else if mine {
					r.wakeIDs = append(r.wakeIDs, id)
					wake = true
				}
			}
			r.mu.Unlock()
			if wake {
				r.wakeLater()
			}
			continue
		}
		r.poke()
	}
}

// unheard queues for leaseLoop the steps signals leased to the runner's
// registration key that still run on that lease (flow_unheard_leases);
// leaseLoop reads them and skips those the runner runs already.
func (r *Runner) unheard(ctx context.Context, conn *pgxpool.Conn, key int64) error {
	rows, err := conn.Query(ctx, "SELECT * FROM "+r.cfg.Schema+".flow_unheard_leases($1, $2)", r.cfg.RunnerID, key)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return err
	}
	r.mu.Lock()
	r.leasedIDs = append(r.leasedIDs, ids...)
	r.mu.Unlock()
	r.leaseLater()
	return nil
}

// aliveFor is how long a heartbeat keeps the runner alive for signals: two
// of renewLoop's ticks.
func (r *Runner) aliveFor() time.Duration { return 2 * r.cfg.LeaseTTL / 3 }

// register writes the runner's flow_runners row (alive, with its lease)
// and learns its key, once its listener listens. Not once Stop began. Each
// registration takes a new key: of two runners given one RunnerID, only the
// last registered hears of the steps signals lease to that id, so a step is
// never run by both.
func (r *Runner) register(ctx context.Context, conn *pgxpool.Conn) error {
	if r.leaving.Load() {
		return nil
	}
	var key int64
	if err := conn.QueryRow(ctx, "INSERT INTO "+r.cfg.Schema+`.flow_runners AS f (id, lease, alive_until)
VALUES ($1, $2, clock_timestamp() + $3)
ON CONFLICT (id) DO UPDATE SET key = DEFAULT, lease = excluded.lease, alive_until = excluded.alive_until RETURNING f.key`,
		r.cfg.RunnerID, r.cfg.LeaseTTL, r.aliveFor()).Scan(&key); err != nil {
		return fmt.Errorf("registering the runner: %w", err)
	}
	r.key.Store(key)
	if r.leaving.Load() {
		// Stop began meanwhile; its removal may have run before this
		// insert committed.
		r.deregister(context.WithoutCancel(ctx))
	}
	return nil
}

// heartbeat keeps the runner's row alive; when the row is gone (another
// runner's sweep removed it after heartbeats that came too late), it
// registers again.
func (r *Runner) heartbeat(ctx context.Context) {
	tag, err := r.pool.Exec(ctx, "UPDATE "+r.cfg.Schema+".flow_runners SET alive_until = clock_timestamp() + $2 WHERE id = $1 AND key = $3",
		r.cfg.RunnerID, r.aliveFor(), r.key.Load())
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: heartbeat", "err", err)
		}
		return
	}
	if tag.RowsAffected() > 0 || r.leaving.Load() {
		return
	}
	// Unless a runner given the same RunnerID registered since (its key
	// is the id's now: see register).
	var key int64
	err = r.pool.QueryRow(ctx, "INSERT INTO "+r.cfg.Schema+`.flow_runners AS f (id, lease, alive_until)
VALUES ($1, $2, clock_timestamp() + $3) ON CONFLICT (id) DO NOTHING RETURNING f.key`,
		r.cfg.RunnerID, r.cfg.LeaseTTL, r.aliveFor()).Scan(&key)
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: heartbeat", "err", err)
		}
		return
	}
	r.key.Store(key)
	if r.leaving.Load() {
		r.deregister(context.WithoutCancel(ctx))
	}
}

// deregister removes the runner's row: signals lease to it no more. Bounded
// by ctx and LeaseTTL: a row left behind ends with its heartbeat.
func (r *Runner) deregister(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL)
	defer cancel()
	if _, err := r.pool.Exec(dctx, "DELETE FROM "+r.cfg.Schema+".flow_runners WHERE id = $1 AND key = $2", r.cfg.RunnerID, r.key.Load()); err != nil {
		r.cfg.Logger.Warn("wharfflow: removing the runner's row; signals may lease to it until its heartbeat ends", "err", err)
	}
}

// parseLeased reads a notification of leased steps (flow_notify_leased):
// "L<key> [<step>,...]", each step an object shaped as flow_leased_steps
// returns it, or the bare id of one too large to carry. One addressed to
// another runner key than key is not mine, and not read further: every
// runner hears every runner's.
func parseLeased(payload string, key int64) (steps []claimed, ids []int64, mine bool, err error) {
	head, list, ok := strings.Cut(payload[1:], " ")
	if !ok {
		return nil, nil, false, fmt.Errorf("no steps in %q", payload)
	}
	to, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return nil, nil, false, fmt.Errorf("runner key in %q: %w", payload, err)
	}
	if to != key {
		return nil, nil, false, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(list), &elems); err != nil {
		return nil, nil, false, fmt.Errorf("leased steps in %q: %w", payload, err)
	}
	for _, e := range elems {
		if len(e) > 0 && e[0] != '{' {
			id, err := strconv.ParseInt(string(e), 10, 64)
			if err != nil {
				return nil, nil, false, fmt.Errorf("instance id %s in %q: %w", e, payload, err)
			}
			ids = append(ids, id)
			continue
		}
		var w struct {
			ID      int64            `json:"id"`
			Token   int64            `json:"token"`
			Flow    string           `json:"flow"`
			Step    string           `json:"step"`
			Attempt int              `json:"attempt"`
			Until   time.Time        `json:"until"`
			State   json.RawMessage  `json:"state"`
			Signals []ReceivedSignal `json:"signals"`
		}
		if err := json.Unmarshal(e, &w); err != nil {
			return nil, nil, false, fmt.Errorf("leased step %s: %w", e, err)
		}
		steps = append(steps, claimed{ID: w.ID, Flow: w.Flow, Step: w.Step, State: w.State, Attempt: w.Attempt,
			Token: w.Token, Until: w.Until, Signals: w.Signals})
	}
	return steps, ids, true, nil
}

// parseLate reads a notification of instances a signal could not resume
// (signal_flows): "W<key> <id>,...". mine: addressed to key, or to 0 (every
// runner). Whatever the address, the listener marks the ids whose steps
// the runner runs, to wake once their write has committed.
func parseLate(payload string, key int64) (ids []int64, mine bool, err error) {
	head, list, ok := strings.Cut(payload[1:], " ")
	if !ok {
		return nil, false, fmt.Errorf("no instance ids in %q", payload)
	}
	to, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return nil, false, fmt.Errorf("runner key in %q: %w", payload, err)
	}
	for f := range strings.SplitSeq(list, ",") {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("instance id %q in %q: %w", f, payload, err)
		}
		ids = append(ids, id)
	}
	return ids, to == 0 || to == key, nil
}

// leaseLoop runs the steps that signals leased to the runner
// (admitLeased): those their notifications carried, and those notified by
// id, which it reads. A loop of its own, like wakeLoop.
func (r *Runner) leaseLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.leaseSig:
		}
		r.mu.Lock()
		steps, ids := r.leasedSteps, r.leasedIDs
		r.leasedSteps, r.leasedIDs = nil, nil
		r.mu.Unlock()
		if len(steps) > 0 {
			if err := r.loadTraces(ctx, steps); err != nil {
				r.cfg.Logger.Warn("wharfflow: reading the steps' trace context", "err", err)
			}
			r.admitLeased(ctx, steps)
		}
		if len(ids) == 0 {
			continue
		}
		rows, _, err := r.queryClaimed(ctx, "SELECT id, flow, step, state, attempt, lease_token, lease_until, signals, children FROM "+
			r.cfg.Schema+".flow_leased_steps($1, $2)", r.cfg.RunnerID, ids)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.cfg.Logger.Warn("wharfflow: reading steps signals leased to the runner", "err", err)
			r.mu.Lock()
			r.leasedIDs = append(ids, r.leasedIDs...)
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			r.leaseLater()
			continue
		}
		r.admitLeased(ctx, rows)
	}
}

// admitLeased runs steps signals leased to the runner, queues them while
// every slot is taken, or hands them back when the runner is stopping.
func (r *Runner) admitLeased(ctx context.Context, rows []claimed) {
	r.mu.Lock()
	if r.closing || ctx.Err() != nil {
		r.mu.Unlock()
		r.handBack(ctx, rows)
		return
	}
	now := time.Now()
	for _, c := range rows {
		if !c.Until.After(now) {
			// Its notification came a lease late: any runner may have
			// claimed it since.
			continue
		}
		if s, ok := r.inflight[c.ID]; ok {
			if s.token >= c.Token {
				continue // notified twice, or claimed again once its lease ended
			}
			// The step that wrote the await, whose write committed (the
			// signal saw it) but is not released yet: release leaves an
			// entry of another token alone.
			s.cancel(nil)
		}
		// The lease began with the signal: renewLoop counts from there.
		c.leased = c.Until.Add(-r.cfg.LeaseTTL)
		r.queue(c)
	}
	r.startQueued(ctx)
	r.mu.Unlock()
}

// queue adds a step a signal leased to the runner to the steps waiting for
// a slot (startQueued starts them). r.mu is held.
func (r *Runner) queue(c claimed) {
	r.stats.signalled.Add(1)
	r.inflight[c.ID] = &running{token: c.Token, claim: c.leased, cancel: func(error) {}, queued: true}
	r.queued = append(r.queued, c)
}

// startQueued starts queued steps while slots are free (not promised to a
// claim or a write in flight). r.mu is held.
func (r *Runner) startQueued(ctx context.Context) {
	for len(r.queued) > 0 && len(r.inflight)-len(r.queued)+r.reserved < r.cfg.MaxInFlight {
		c := r.queued[0]
		r.queued = r.queued[1:]
		delete(r.inflight, c.ID)
		r.run(ctx, c, 0)
	}
}

// wakeLater has wakeLoop wake the instances in wakeIDs.
// leaseLater tells leaseLoop it has steps to admit or read.
func (r *Runner) leaseLater() {
	select {
	case r.leaseSig <- struct{}{}:
	default:
	}
}

func (r *Runner) wakeLater() {
	select {
	case r.wakeSig <- struct{}{}:
	default:
	}
}

// wakeLoop runs wake_flows for the instances notified by signals that
// could not resume them, then wakes the claim loop. Without waiting for
// writes in flight (p_wait false): a runner's own instances are woken once
// their write has committed (late), and any other runner's write in flight
// is woken by that runner. It is a loop of its own, off the claim loop.
func (r *Runner) wakeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wakeSig:
		}
		r.mu.Lock()
		ids := r.wakeIDs
		r.wakeIDs = nil
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		if !r.wakeOnce(ctx, ids) {
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			r.wakeIDs = append(ids, r.wakeIDs...)
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			r.wakeLater()
		}
	}
}

// wakeOnce runs wake_flows for ids (and wakes the claim loop when it made
// steps due); false when it failed.
func (r *Runner) wakeOnce(ctx context.Context, ids []int64) bool {
	var n int
	if err := r.pool.QueryRow(ctx, "SELECT "+r.cfg.Schema+".wake_flows($1, false)", ids).Scan(&n); err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: waking awaiting instances", "err", err)
		}
		return false
	}
	if n > 0 {
		r.poke()
	}
	return true
}

// cleanupLoop deletes instances past their retention, in batches.
func (r *Runner) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := Cleanup(ctx, r.pool, r.cfg.Schema, time.Now().Add(-r.cfg.Retention), 1000); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: deleting expired instances", "err", err)
		}
		r.sweepDeadRunners(ctx)
	}
}

// sweepDeadRunners removes the rows of runners whose heartbeat ended more
// than their lease ago (killed, or cut off), and then checks every awaiting
// instance with a pending signal once (wake_flows(NULL)). A runner wakes the
// instances a late signal found it running once their write has committed;
// one killed between that commit and its wake leaves such an instance
// awaiting a signal it has, and no other runner waited for that write.
func (r *Runner) sweepDeadRunners(ctx context.Context) {
	var dead int
	if err := r.pool.QueryRow(ctx, "WITH d AS (DELETE FROM "+r.cfg.Schema+
		".flow_runners WHERE alive_until < clock_timestamp() - lease RETURNING 1) SELECT count(*) FROM d").Scan(&dead); err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: removing dead runners", "err", err)
		}
		return
	}
	if dead == 0 {
		return
	}
	var n int
	if err := r.pool.QueryRow(ctx, "SELECT "+r.cfg.Schema+".wake_flows(NULL)").Scan(&n); err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: waking awaiting instances after a runner died", "err", err)
		}
		return
	}
	if n > 0 {
		r.poke()
	}
}

// Cleanup deletes done and cancelled top-level instances (with their
// children, signals and history) that ended before before, batch at a time,
// and returns how many top-level instances it deleted.
func Cleanup(ctx context.Context, pool *pgxpool.Pool, schema string, before time.Time, batch int) (int, error) {
	total := 0
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT "+schema+".cleanup_flows($1, $2)", before, batch).Scan(&n); err != nil {
			return total, err
		}
		total += n
		if n < batch {
			return total, nil
		}
	}
}
