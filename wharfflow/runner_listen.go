package wharfflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listen wakes the claim loop on notifications: a start, a step made due,
// or a signal (whose instance it checks, in case the signal committed
// after its await was written).
func (r *Runner) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("wharfflow: listening for notifications", "err", err)
		// Deaf until it listens again: signals stop leasing to the runner
		// (best effort; else once its heartbeat ends).
		if _, err := r.pool.Exec(ctx, "UPDATE "+r.cfg.Schema+".flow_runners SET alive_until = clock_timestamp() WHERE id = $1 AND key = $2",
			r.cfg.RunnerID, r.key.Load()); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("wharfflow: marking the runner deaf", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Runner) listenOnce(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+r.cfg.Schema+"_flows"); err != nil {
		return err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *")
	}()
	// Listening: signals may lease instances to the runner from now on.
	// A runner that cannot register (a role without the right to write
	// flow_runners) still listens: its awaits' signals go through claims.
	before := r.key.Load()
	if err := r.register(ctx, conn); err != nil {
		if ctx.Err() != nil {
			return err
		}
		r.cfg.Logger.Warn("wharfflow: signals will not lease steps to this runner (they go through claims)", "err", err)
	} else {
		r.listening.Store(true)
		defer r.listening.Store(false)
		if before != 0 {
			// Signals may have leased steps to the registration before
			// this one while nobody listened (its row stays alive for a
			// while when the listener drops with the database): read them
			// now rather than after their lease.
			if err := r.unheard(ctx, conn, before); err != nil {
				return err
			}
		}
	}
	// Signals may have come while nobody listened: check every awaiting
	// instance with a pending signal once.
	if _, err := conn.Exec(ctx, "SELECT "+r.cfg.Schema+".wake_flows(NULL)"); err != nil {
		return err
	}
	r.poke()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if strings.HasPrefix(n.Payload, "L") { // instances a signal leased to a runner
			steps, ids, mine, err := parseLeased(n.Payload, r.key.Load())
			if err != nil {
				r.cfg.Logger.Warn("wharfflow: a notification of leased steps", "err", err)
				continue
			}
			if !mine {
				continue
			}
			r.mu.Lock()
			r.leasedSteps = append(r.leasedSteps, steps...)
			r.leasedIDs = append(r.leasedIDs, ids...)
			r.mu.Unlock()
			r.leaseLater()
			continue
		}
		if strings.HasPrefix(n.Payload, "W") { // instances a signal could not resume
			ids, mine, err := parseLate(n.Payload, r.key.Load())
			if err != nil {
				r.cfg.Logger.Warn("wharfflow: a notification of signalled instances", "err", err)
				continue
			}
			wake := false
			r.mu.Lock()
			for _, id := range ids {
				if _, running := r.inflight[id]; running {
					r.late[id] = true
				} else if mine {
					r.wakeIDs = append(r.wakeIDs, id)
					wake = true
				}
			}
			r.mu.Unlock()
			if wake {
				r.wakeLater()
			}
			continue
		}
		r.poke()
	}
}

// unheard queues for leaseLoop the steps signals leased to the runner's
// registration key that still run on that lease (flow_unheard_leases);
// leaseLoop reads them and skips those the runner runs already.
func (r *Runner) unheard(ctx context.Context, conn *pgxpool.Conn, key int64) error {
	rows, err := conn.Query(ctx, "SELECT * FROM "+r.cfg.Schema+".flow_unheard_leases($1, $2)", r.cfg.RunnerID, key)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return err
	}
	r.mu.Lock()
	r.leasedIDs = append(r.leasedIDs, ids...)
	r.mu.Unlock()
	r.leaseLater()
	return nil
}

// parseLeased reads a notification of leased steps (flow_notify_leased):
// "L<key> [<step>,...]", each step an object shaped as flow_leased_steps
// returns it, or the bare id of one too large to carry. One addressed to
// another runner key than key is not mine, and not read further: every
// runner hears every runner's.
func parseLeased(payload string, key int64) (steps []claimed, ids []int64, mine bool, err error) {
	head, list, ok := strings.Cut(payload[1:], " ")
	if !ok {
		return nil, nil, false, fmt.Errorf("no steps in %q", payload)
	}
	to, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return nil, nil, false, fmt.Errorf("runner key in %q: %w", payload, err)
	}
	if to != key {
		return nil, nil, false, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(list), &elems); err != nil {
		return nil, nil, false, fmt.Errorf("leased steps in %q: %w", payload, err)
	}
	for _, e := range elems {
		if len(e) > 0 && e[0] != '{' {
			id, err := strconv.ParseInt(string(e), 10, 64)
			if err != nil {
				return nil, nil, false, fmt.Errorf("instance id %s in %q: %w", e, payload, err)
			}
			ids = append(ids, id)
			continue
		}
		var w struct {
			ID      int64            `json:"id"`
			Token   int64            `json:"token"`
			Flow    string           `json:"flow"`
			Step    string           `json:"step"`
			Attempt int              `json:"attempt"`
			Until   time.Time        `json:"until"`
			State   json.RawMessage  `json:"state"`
			Signals []ReceivedSignal `json:"signals"`
		}
		if err := json.Unmarshal(e, &w); err != nil {
			return nil, nil, false, fmt.Errorf("leased step %s: %w", e, err)
		}
		steps = append(steps, claimed{ID: w.ID, Flow: w.Flow, Step: w.Step, State: w.State, Attempt: w.Attempt,
			Token: w.Token, Until: w.Until, Signals: w.Signals})
	}
	return steps, ids, true, nil
}

// parseLate reads a notification of instances a signal could not resume
// (signal_flows): "W<key> <id>,...". mine: addressed to key, or to 0 (every
// runner). Whatever the address, the listener marks the ids whose steps
// the runner runs, to wake once their write has committed.
func parseLate(payload string, key int64) (ids []int64, mine bool, err error) {
	head, list, ok := strings.Cut(payload[1:], " ")
	if !ok {
		return nil, false, fmt.Errorf("no instance ids in %q", payload)
	}
	to, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return nil, false, fmt.Errorf("runner key in %q: %w", payload, err)
	}
	for f := range strings.SplitSeq(list, ",") {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("instance id %q in %q: %w", f, payload, err)
		}
		ids = append(ids, id)
	}
	return ids, to == 0 || to == key, nil
}
