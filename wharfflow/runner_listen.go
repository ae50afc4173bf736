package wharfflow

import (
	"context"
	"errors"
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
		r.notified(n.Payload)
	}
}

// notified acts on one notification. Any role may NOTIFY, so each is a
// hint checked against the database: 'L' names steps a signal leased to a
// runner, which leaseLoop reads (flow_leased_steps) before running any;
// 'W' names instances a signal could not resume, which wakeLoop hands to
// wake_flows; 'C' names instances cancelled while the runner ran their
// steps, which cancelLoop stops once the database confirms it; anything
// else makes the claim loop look. The ids kept for
// the loops are bounded (maxPending): past that, a loop does its work for
// every instance once.
func (r *Runner) notified(payload string) {
	switch {
	case strings.HasPrefix(payload, "L"): // instances a signal leased to a runner
		ids, mine, err := parseIDs(payload, r.key.Load())
		if err != nil {
			r.malformed(payload, err)
			return
		}
		if !mine {
			return
		}
		key := r.key.Load()
		r.mu.Lock()
		if len(r.leasedIDs)+len(ids) > maxPending {
			r.leasedIDs, r.unheardAll = nil, true
		} else if !r.unheardAll {
			for _, id := range ids {
				r.leasedIDs = append(r.leasedIDs, leaseRef{key: key, id: id})
			}
		}
		r.mu.Unlock()
		r.leaseLater()
	case strings.HasPrefix(payload, "W"): // instances a signal could not resume
		ids, mine, err := parseIDs(payload, r.key.Load())
		if err != nil {
			r.malformed(payload, err)
			return
		}
		mine = mine || strings.HasPrefix(payload, "W0 ")
		wake := false
		r.mu.Lock()
		for _, id := range ids {
			if _, running := r.inflight[id]; running {
				r.late[id] = true
			} else if mine {
				if len(r.wakeIDs) >= maxPending {
					r.wakeIDs, r.wakeAll = nil, true
				}
				if !r.wakeAll {
					r.wakeIDs = append(r.wakeIDs, id)
				}
				wake = true
			}
		}
		r.mu.Unlock()
		if wake {
			r.wakeLater()
		}
	case strings.HasPrefix(payload, "C"): // instances cancelled while a runner ran them
		ids, mine, err := parseIDs(payload, r.key.Load())
		if err != nil {
			r.malformed(payload, err)
			return
		}
		if !mine {
			return
		}
		r.mu.Lock()
		if len(r.cancelIDs)+len(ids) <= maxPending {
			r.cancelIDs = append(r.cancelIDs, ids...)
		}
		r.mu.Unlock()
		r.cancelLater()
	default:
		r.poke()
	}
}

// malformed logs a notification the runner cannot read: the first at
// Warn (something other than Wharf notifies on the channel), the rest at
// Debug, so that a flood of them costs no log volume.
func (r *Runner) malformed(payload string, err error) {
	if len(payload) > 100 {
		payload = payload[:100] + "..."
	}
	if r.malformedSeen.CompareAndSwap(false, true) {
		r.cfg.Logger.Warn("wharfflow: ignoring a notification it cannot read on the flows' channel (any role may NOTIFY; more are logged at debug level)",
			"payload", payload, "err", err)
		return
	}
	r.cfg.Logger.Debug("wharfflow: ignoring a notification it cannot read", "payload", payload, "err", err)
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
	for _, id := range ids {
		r.leasedIDs = append(r.leasedIDs, leaseRef{key: key, id: id})
	}
	r.mu.Unlock()
	r.leaseLater()
	return nil
}

// parseIDs reads a notification naming instances, "L<key> <id>,..." (steps
// flow_notify_leased leased to the registration key), "C<key> <id>,..."
// (instances cancel_flow cancelled while that runner ran them) or
// "W<key> <id>,..."
// (instances signal_flows could not resume, for the runner registered as
// key, or for every runner with key 0). mine: addressed to key. At most 300
// ids, as the database sends them.
func parseIDs(payload string, key int64) (ids []int64, mine bool, err error) {
	head, list, ok := strings.Cut(payload[1:], " ")
	if !ok {
		return nil, false, errors.New("no instance ids")
	}
	to, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return nil, false, fmt.Errorf("runner key: %w", err)
	}
	if strings.Count(list, ",") >= 300 {
		return nil, false, errors.New("more than 300 ids")
	}
	for f := range strings.SplitSeq(list, ",") {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil || id <= 0 {
			return nil, false, fmt.Errorf("instance id %q", f)
		}
		ids = append(ids, id)
	}
	return ids, to == key, nil
}
