package wharfflow

import (
	"context"
	"time"
)

// wakeLater has wakeLoop wake the instances in wakeIDs.
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
		ids, all := r.wakeIDs, r.wakeAll
		r.wakeIDs, r.wakeAll = nil, false
		r.mu.Unlock()
		if len(ids) == 0 && !all {
			continue
		}
		if all {
			ids = nil // every awaiting instance with a pending signal
		}
		if !r.wakeOnce(ctx, ids) {
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			r.wakeIDs = append(ids, r.wakeIDs...)
			r.wakeAll = r.wakeAll || all
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

// wakeOnce runs wake_flows for ids, or for every awaiting instance with a
// pending signal when ids is nil (and wakes the claim loop when it made
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
