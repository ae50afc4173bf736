package wharfflow

import (
	"context"
	"encoding/json"
	"time"
)

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
