package wharfflow

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
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

// queueFor is how long a step a signal leased to the runner waits for a
// free slot (not renewed) before the runner hands it back for any runner:
// a busy runner holds nothing an idle one could run for longer. Slots of a
// runner busy with short steps free within it; one busy with long steps
// hands the steps back.
func (r *Runner) queueFor() time.Duration { return min(r.cfg.LeaseTTL/10, 250*time.Millisecond) }

// admitLeased runs the steps the database confirmed signals leased to the
// runner: not those it runs, queues or ran already (a notification
// repeated, forged, or read before their outcome committed). With no free
// slot it queues them for queueFor (at most maxPending: a burst of signals
// beyond its slots waits its turn there rather than going through the
// database twice, a hand-back and a claim), then hands them back; it hands back at once those it will not run: when it is stopping
// or does not run their flow.
func (r *Runner) admitLeased(ctx context.Context, rows []claimed) {
	read := time.Now()
	var back []claimed
	queued := false
	r.mu.Lock()
	stopping := r.closing || ctx.Err() != nil
	// The queued steps' tokens by id, for the rows read again.
	inQueue := make(map[int64]int64, len(r.queued))
	for _, q := range r.queued {
		inQueue[q.c.ID] = max(inQueue[q.c.ID], q.c.Token)
	}
	for _, c := range rows {
		s, running := r.inflight[c.ID]
		if running && s.token >= c.Token {
			continue // notified twice, or claimed again once its lease ended
		}
		if ran, ok := r.ran[c.ID]; ok && ran.token >= c.Token {
			continue // ran it; its outcome committed after the read began
		}
		if tok, ok := inQueue[c.ID]; ok && tok >= c.Token {
			continue
		}
		if tok, ok := r.confirming[c.ID]; ok && tok >= c.Token {
			continue // a queued step being confirmed (startQueued)
		}
		// The lease began LeaseTTL before its end.
		c.leased = read.Add(c.left - r.cfg.LeaseTTL)
		if stopping || r.flows[c.Flow] == nil {
			back = append(back, c)
			continue
		}
		if !running && r.freeSlots() <= 0 {
			if len(r.queued) >= maxPending {
				back = append(back, c)
				continue
			}
			r.queued = append(r.queued, queuedStep{c: c, until: read.Add(r.queueFor())})
			inQueue[c.ID] = c.Token
			queued = true
			continue
		}
		if running {
			// The step that wrote the await, whose write committed (the
			// signal saw it) but is not released yet: the new step takes
			// its slot (release leaves an entry of another token alone).
			s.cancel(nil)
		}
		r.stats.signalled.Add(1)
		r.run(ctx, c, 0)
	}
	r.reading = 0
	clear(r.ran)
	r.mu.Unlock()
	if queued {
		time.AfterFunc(r.queueFor(), func() { r.expireQueued(ctx) })
	}
	if len(back) > 0 {
		r.handBack(ctx, back)
	}
}

// queuedStep is a step a signal leased to the runner, waiting until until
// for a free slot.
type queuedStep struct {
	c     claimed
	until time.Time
}

// startQueued starts queued steps while slots are free, once the database
// confirms each is still leased to the runner at its token: while it
// waited for a slot its instance may have been cancelled (and Cancel
// returned) or its lease lost. The slots are reserved meanwhile, one
// confirmation at a time. r.mu is held.
func (r *Runner) startQueued(ctx context.Context) {
	n := min(len(r.queued), r.freeSlots())
	if n <= 0 || r.confirming != nil {
		return
	}
	batch := slices.Clone(r.queued[:n])
	r.queued = r.queued[n:]
	r.reserved += n
	r.confirming = make(map[int64]int64, n)
	for _, q := range batch {
		r.confirming[q.c.ID] = q.c.Token
	}
	r.steps.Add(1) // Stop waits for it
	go func() {
		defer r.steps.Done()
		held, err := r.stillLeased(ctx, batch)
		var back []claimed
		r.mu.Lock()
		r.reserved -= n
		r.confirming = nil
		stopping := r.closing || ctx.Err() != nil
		for _, q := range batch {
			switch {
			case err != nil || stopping:
				back = append(back, q.c) // for any runner's claim
			case held[q.c.ID] != q.c.Token:
				// Cancelled, or its lease ended: not the runner's to run.
			default:
				if s, ok := r.inflight[q.c.ID]; ok && s.token >= q.c.Token {
					continue
				}
				r.stats.signalled.Add(1)
				r.run(ctx, q.c, 0)
			}
		}
		if !stopping {
			r.startQueued(ctx)
		}
		r.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: confirming queued signalled steps; handing them back", "err", err)
		}
		r.handBack(ctx, back)
		r.poke()
	}()
}

// stillLeased returns the queued steps still leased to the runner at their
// tokens, running and unexpired (id → token).
func (r *Runner) stillLeased(ctx context.Context, batch []queuedStep) (map[int64]int64, error) {
	ids, tokens := make([]int64, len(batch)), make([]int64, len(batch))
	for i, q := range batch {
		ids[i], tokens[i] = q.c.ID, q.c.Token
	}
	// Each id looked up by the primary key (a subquery the planner cannot
	// flatten), as flow_leased_steps does.
	rows, err := r.pool.Query(ctx, "SELECT i.id, i.lease_token FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token), "+
		"LATERAL (SELECT f.id, f.lease_token, f.lease_owner, f.status, f.run_at FROM "+r.cfg.Schema+
		".flow_instances f WHERE f.id = t.id LIMIT 1) AS i "+
		"WHERE i.lease_token = t.token AND i.lease_owner = $3 AND i.status = 'running' AND i.run_at > clock_timestamp()",
		ids, tokens, r.cfg.RunnerID)
	if err != nil {
		return nil, err
	}
	held := make(map[int64]int64, len(batch))
	var id, token int64
	_, err = pgx.ForEachRow(rows, []any{&id, &token}, func() error {
		held[id] = token
		return nil
	})
	return held, err
}

// expireQueued hands back the queued steps whose wait for a slot is over.
func (r *Runner) expireQueued(ctx context.Context) {
	now := time.Now()
	var back []claimed
	r.mu.Lock()
	r.queued = slices.DeleteFunc(r.queued, func(q queuedStep) bool {
		if q.until.After(now) {
			return false
		}
		back = append(back, q.c)
		return true
	})
	r.mu.Unlock()
	r.handBack(ctx, back)
}

// leaseLater tells leaseLoop it has steps to read.
func (r *Runner) leaseLater() {
	select {
	case r.leaseSig <- struct{}{}:
	default:
	}
}
