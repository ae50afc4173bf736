package wharfflow

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
)

// errCancelled is the cause of a step's context when its instance was
// cancelled while it ran.
var errCancelled = errors.New("wharfflow: the instance was cancelled")

// cancelLoop stops the steps whose instances were cancelled while they
// ran or waited in the runner's queue for a slot, as 'C' notifications
// name them (cancel_flow), once the database
// confirms each is cancelled and was leased to the runner at the token it
// runs: a notification is a hint, which any role may send. Without it a
// runner learns of a cancel at its next renewal of the step's lease.
func (r *Runner) cancelLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cancelSig:
		}
		r.mu.Lock()
		ids := r.cancelIDs
		r.cancelIDs = nil
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		cancelled, err := r.readCancelled(ctx, ids)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.cfg.Logger.Warn("wharfflow: reading cancelled instances; their steps stop at their next renewal", "err", err)
			continue
		}
		r.mu.Lock()
		for id, token := range cancelled {
			if s, ok := r.inflight[id]; ok && s.token == token {
				s.cancel(errCancelled)
			}
		}
		// Signalled steps waiting for a slot (admitLeased) do not start:
		// their instances were cancelled (no key slot to give up: a signal
		// leases only steps without keys).
		r.queued = slices.DeleteFunc(r.queued, func(q queuedStep) bool {
			token, ok := cancelled[q.c.ID]
			return ok && token == q.c.Token
		})
		r.mu.Unlock()
	}
}

// readCancelled returns, of ids, the cancelled instances whose steps ran on
// leases of the runner's, with their tokens.
func (r *Runner) readCancelled(ctx context.Context, ids []int64) (map[int64]int64, error) {
	rows, err := r.pool.Query(ctx, "SELECT id, lease_token FROM "+r.cfg.Schema+
		".flow_instances WHERE id = ANY ($1) AND status = 'cancelled' AND lease_owner = $2", ids, r.cfg.RunnerID)
	if err != nil {
		return nil, err
	}
	out := map[int64]int64{}
	var id, token int64
	_, err = pgx.ForEachRow(rows, []any{&id, &token}, func() error {
		out[id] = token
		return nil
	})
	return out, err
}

// cancelLater tells cancelLoop it has instances to check.
func (r *Runner) cancelLater() {
	select {
	case r.cancelSig <- struct{}{}:
	default:
	}
}
