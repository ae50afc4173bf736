package wharfflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
	if errors.Is(err, pgx.ErrNoRows) {
		// Another process registered with this RunnerID: signals lease to
		// the id's steps only through the last registration.
		if r.twinWarned.CompareAndSwap(false, true) {
			r.cfg.Logger.Warn("wharfflow: another runner process registered with this RunnerID; signals lease this id's steps to it alone: give each process its own RunnerID",
				"runner", r.cfg.RunnerID)
		}
		return
	}
	if err != nil {
		if ctx.Err() == nil {
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
