package wharfflow

import (
	"context"
	"time"
)

// leaseLoop runs the steps the runner's lease notifications name, once the
// database confirmed that each is leased to the runner (flow_leased_steps):
// a notification is a hint, which any role may send. A loop of its own,
// like wakeLoop.
func (r *Runner) leaseLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.leaseSig:
		}
		r.mu.Lock()
		ids, all := r.leasedIDs, r.unheardAll
		r.leasedIDs, r.unheardAll = nil, false
		if len(ids) == 0 && !all {
			r.mu.Unlock()
			continue
		}
		r.ranSeq++
		r.reading = r.ranSeq
		r.mu.Unlock()
		rows, err := r.readLeased(ctx, ids, all)
		if err != nil {
			r.mu.Lock()
			r.reading = 0
			clear(r.ran)
			r.leasedIDs = append(ids, r.leasedIDs...)
			r.unheardAll = r.unheardAll || all
			r.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			r.cfg.Logger.Warn("wharfflow: reading steps signals leased to the runner", "err", err)
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

// readLeased reads the steps of ids leased to the runner's registration
// they name, or with all every step signals leased to its registration
// (flow_unheard_leases).
func (r *Runner) readLeased(ctx context.Context, ids []leaseRef, all bool) ([]claimed, error) {
	s := r.cfg.Schema
	if all {
		rows, _, err := r.queryClaimed(ctx, "SELECT "+claimColumns+" FROM "+s+".flow_leased_steps($1, $2, ARRAY(SELECT "+s+
			".flow_unheard_leases($1, $2)))", r.cfg.RunnerID, r.key.Load())
		return rows, err
	}
	byKey := map[int64][]int64{}
	for _, ref := range ids {
		byKey[ref.key] = append(byKey[ref.key], ref.id)
	}
	var out []claimed
	for key, ids := range byKey {
		rows, _, err := r.queryClaimed(ctx, "SELECT "+claimColumns+" FROM "+s+".flow_leased_steps($1, $2, $3)", r.cfg.RunnerID, key, ids)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// admitLeased runs the steps the database confirmed signals leased to the
// runner: not those it runs or ran already (a notification repeated,
// forged, or read before their outcome committed), and it hands back those
// it will not run: when it is stopping, has no free slot (a busy runner
// holds nothing an idle one could run) or does not run their flow.
func (r *Runner) admitLeased(ctx context.Context, rows []claimed) {
	read := time.Now()
	var back []claimed
	r.mu.Lock()
	stopping := r.closing || ctx.Err() != nil
	for _, c := range rows {
		s, running := r.inflight[c.ID]
		if running && s.token >= c.Token {
			continue // notified twice, or claimed again once its lease ended
		}
		if ran, ok := r.ran[c.ID]; ok && ran.token >= c.Token {
			continue // ran it; its outcome committed after the read began
		}
		if stopping || r.flows[c.Flow] == nil || (!running && r.freeSlots() <= 0) {
			back = append(back, c)
			continue
		}
		if running {
			// The step that wrote the await, whose write committed (the
			// signal saw it) but is not released yet: the new step takes
			// its slot (release leaves an entry of another token alone).
			s.cancel(nil)
		}
		// The lease began LeaseTTL before its end.
		c.leased = read.Add(c.left - r.cfg.LeaseTTL)
		r.stats.signalled.Add(1)
		r.run(ctx, c, 0)
	}
	r.reading = 0
	clear(r.ran)
	r.mu.Unlock()
	if len(back) > 0 {
		r.handBack(ctx, back)
	}
}

// leaseLater tells leaseLoop it has steps to read.
func (r *Runner) leaseLater() {
	select {
	case r.leaseSig <- struct{}{}:
	default:
	}
}
