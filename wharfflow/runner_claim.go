package wharfflow

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"
)

// claimed is a step leased to the runner, as claim_flow_steps returns its
// rows (and flow_leased_steps, and complete_flow_steps the instances it
// leases).
type claimed struct {
	ID       int64
	Flow     string
	Step     string
	State    []byte
	Attempt  int
	Token    int64
	Signals  []ReceivedSignal
	Children []ChildResult
	Trace    map[string]string // the start's trace context, with a Tracer
	parent   int64             // the instance's parent (0: a top-level instance)
	// ckey and rkey are the instance's concurrency and rate keys: an
	// outcome that ends a step of ckey frees a slot of it.
	ckey, rkey string
	// left is how long the lease lasted when the database returned the row
	// (its own clock): the runner counts down from when it read it.
	left time.Duration
	// leased is when the lease this step runs on began, on the runner's
	// clock; zero for a claim (the claim's start, taken when the step
	// starts).
	leased time.Time
	// child: a child its spawn's write leased to the runner.
	child bool
	// baton: started as a baton before the write that makes it running
	// (passBaton).
	baton bool
}

// claimLoop claims as many due steps as there are free slots, runs them,
// and sleeps until a notification, an outcome written, or the next due
// time.
func (r *Runner) claimLoop(ctx context.Context) {
	defer func() {
		r.mu.Lock()
		r.closing = true
		var back []claimed
		for _, bs := range r.batons {
			back = append(back, bs...)
		}
		clear(r.batons)
		for _, q := range r.queued {
			back = append(back, q.c)
		}
		r.queued = nil
		r.mu.Unlock()
		r.handBack(ctx, back)
		r.steps.Wait()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoffDelay := 100 * time.Millisecond
	for ctx.Err() == nil {
		r.mu.Lock()
		r.startQueued(ctx) // steps signals leased to the runner come first
		free := r.freeSlots()
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
			began := time.Now()
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
				if next >= 0 {
					sleep = min(max(next, time.Millisecond), r.cfg.LeaseTTL)
				}
			}
			r.stats.claimed.Add(int64(len(rows)))
			r.mu.Lock()
			for _, c := range rows {
				// The lease began no earlier than the claim: renewals count
				// from there, whatever the clocks say.
				c.leased = began
				r.run(ctx, c, 0)
			}
			r.reserved -= ask
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

// handBack releases the leases of steps the runner will not run (it is
// stopping, has no slot or no definition for them): they are due at once,
// for any runner's claim.
func (r *Runner) handBack(ctx context.Context, rows []claimed) {
	if len(rows) == 0 {
		return
	}
	rows = slices.Clone(rows)
	// In id order, as every writer locks instances.
	slices.SortFunc(rows, func(a, b claimed) int { return cmp.Compare(a.ID, b.ID) })
	ids, tokens := make([]int64, len(rows)), make([]int64, len(rows))
	for i, c := range rows {
		ids[i], tokens[i] = c.ID, c.Token
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	if _, err := r.pool.Exec(hctx, "SELECT "+r.cfg.Schema+".release_flow_leases($1, $2, $3)", r.cfg.RunnerID, ids, tokens); err != nil {
		r.cfg.Logger.Warn("wharfflow: handing back steps; they run after their lease", "err", err)
		return
	}
	r.stats.handedBack.Add(int64(len(rows)))
}

// claimColumns are the columns of claim_flow_steps's and
// flow_leased_steps's rows, as scanClaimed reads them.
const claimColumns = "id, flow, step, state, attempt, lease_token, wait, signals, children, parent_id, concurrency_key, rate_key"

// claim leases up to n due steps. When it got fewer, next is how long until
// the next row falls due (-1: none is scheduled; a notification or an
// outcome written wakes the runner).
func (r *Runner) claim(ctx context.Context, n int) (out []claimed, next time.Duration, err error) {
	return r.queryClaimed(ctx, "SELECT "+claimColumns+" FROM "+r.cfg.Schema+".claim_flow_steps($1, $2, $3, $4)",
		r.cfg.RunnerID, r.names, n, r.cfg.LeaseTTL)
}

// queryClaimed reads rows shaped as claim_flow_steps returns them (and
// flow_leased_steps), with their trace context. next is the id-0 row's
// wait (-1 when there is none, or it is NULL).
func (r *Runner) queryClaimed(ctx context.Context, sql string, args ...any) (out []claimed, next time.Duration, err error) {
	next = -1
	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, next, err
	}
	defer rows.Close()
	for rows.Next() {
		var c claimed
		var sigs, children []byte
		var wait *float64
		var ckey, rkey *string
		var parent *int64
		if err := rows.Scan(&c.ID, &c.Flow, &c.Step, &c.State, &c.Attempt, &c.Token, &wait, &sigs, &children,
			&parent, &ckey, &rkey); err != nil {
			return nil, next, err
		}
		if c.ID == 0 { // the next due time
			if wait != nil {
				next = max(seconds(*wait), 0)
			}
			continue
		}
		if err := c.decode(wait, sigs, children, parent, ckey, rkey); err != nil {
			return nil, next, err
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, next, err
	}
	if err := r.loadTraces(ctx, out); err != nil {
		// The steps are leased: run them, untraced, rather than wait for
		// their leases to end.
		r.cfg.Logger.Warn("wharfflow: reading the steps' trace context", "err", err)
	}
	return out, next, nil
}

// decode fills in the columns a claimed row carries besides its step.
func (c *claimed) decode(wait *float64, sigs, children []byte, parent *int64, ckey, rkey *string) error {
	if wait != nil {
		c.left = seconds(*wait)
	}
	if len(sigs) > 0 {
		if err := json.Unmarshal(sigs, &c.Signals); err != nil {
			return err
		}
	}
	if len(children) > 0 {
		if err := json.Unmarshal(children, &c.Children); err != nil {
			return err
		}
	}
	if parent != nil {
		c.parent = *parent
	}
	if ckey != nil {
		c.ckey = *ckey
	}
	if rkey != nil {
		c.rkey = *rkey
	}
	return nil
}

// seconds is a database figure of seconds as a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
