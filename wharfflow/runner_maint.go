package wharfflow

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cleanupLoop deletes instances past their retention, in batches, repairs
// lost joins and removes dead runners' rows, every CleanupInterval.
func (r *Runner) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.maintain(ctx)
	}
}

// maintain runs the cleanup loop's work once.
func (r *Runner) maintain(ctx context.Context) {
	// The cut-off is the database's now: runners' clocks need not agree.
	for {
		var n int
		if err := r.pool.QueryRow(ctx, "SELECT "+r.cfg.Schema+".cleanup_flows(clock_timestamp() - $1::interval, 1000)",
			r.cfg.Retention).Scan(&n); err != nil {
			if ctx.Err() == nil {
				r.cfg.Logger.Warn("wharfflow: deleting expired instances", "err", err)
			}
			break
		}
		if n < 1000 {
			break
		}
	}
	var n int
	if err := r.pool.QueryRow(ctx, "SELECT "+r.cfg.Schema+".repair_flow_joins(1000)").Scan(&n); err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: repairing lost joins", "err", err)
		}
	} else if n > 0 {
		r.cfg.Logger.Warn("wharfflow: parents waited for children that had all ended; their joins run now", "parents", n)
		r.poke()
	}
	r.sweepDeadRunners(ctx)
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
