package wharfflow

import (
	"context"
	"time"
)

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

// leaseLater tells leaseLoop it has steps to admit or read.
func (r *Runner) leaseLater() {
	select {
	case r.leaseSig <- struct{}{}:
	default:
	}
}
