package wharfflow

import (
	"context"
	"slices"
	"time"
)

// renewLoop extends the leases of steps running longer than a third of
// LeaseTTL, and cancels the steps whose lease was lost. It heartbeats the
// runner's registration on the same tick.
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
		var ids []int64
		cutoff := time.Now().Add(-r.cfg.LeaseTTL / 3)
		tokenOf := map[int64]int64{}
		for id, s := range r.inflight {
			if s.claim.Before(cutoff) {
				ids = append(ids, id)
				tokenOf[id] = s.token
			}
		}
		// The batons reserved to the runner, not started yet.
		for _, bs := range r.batons {
			for _, b := range bs {
				if b.leased.Before(cutoff) {
					ids = append(ids, b.ID)
					tokenOf[b.ID] = b.Token
				}
			}
		}
		// In id order, as every writer locks instances.
		slices.Sort(ids)
		tokens := make([]int64, len(ids))
		for i, id := range ids {
			tokens[i] = tokenOf[id]
		}
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		renewed := time.Now()
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
		r.mu.Lock()
		for i, id := range ids {
			if s, ok := r.inflight[id]; ok && s.token == tokens[i] && !kept[id] {
				s.cancel(errLeaseLost)
			}
		}
		for key, bs := range r.batons {
			bs = slices.DeleteFunc(bs, func(b claimed) bool {
				t, asked := tokenOf[b.ID]
				return asked && t == b.Token && !kept[b.ID]
			})
			for i := range bs {
				if t, asked := tokenOf[bs[i].ID]; asked && t == bs[i].Token {
					bs[i].leased = renewed // renewed from when it was asked
				}
			}
			if len(bs) == 0 {
				delete(r.batons, key)
			} else {
				r.batons[key] = bs
			}
		}
		r.mu.Unlock()
	}
}
