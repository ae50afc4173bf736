package wharf

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wharfhq/wharf/wharfmigrate"
)

type laneLease struct {
	lane    int16
	fence   int64
	retries map[int64]retryInfo
}

type laneRelease struct {
	lane  int16
	fence int64
}

type leaseEvent struct {
	acquired  []laneLease
	renewed   []int16
	lost      []int16
	release   []int16 // lanes over this relay's fair share: finish and hand back
	until     time.Time
	uncovered int
}

// leaseLoop keeps this relay's lanes: it heartbeats, renews leases, claims free
// or expired lanes up to a fair share (ceil(lanes / live relays)), asks the
// engine to hand back lanes over the share, and releases lanes the engine has
// finished with. On exit it releases every lane it still holds, unless the
// relay was hard-stopped with deliveries possibly still in flight.
func (r *relay) leaseLoop(ctx context.Context) {
	owned := map[int16]int64{}
	releasing := map[int16]bool{}
	host, _ := os.Hostname()
	ttl := fmt.Sprintf("%d milliseconds", r.cfg.LeaseTTL.Milliseconds())
	tick := time.NewTicker(r.cfg.RebalanceInterval)
	defer tick.Stop()
	errs := 0

	release := func(ctx context.Context, rel laneRelease) {
		if _, err := r.pool.Exec(ctx, r.q.release, rel.lane, r.cfg.RelayID, rel.fence); err != nil {
			r.log.Warn("wharf: releasing lane failed; its lease will expire instead", "lane", rel.lane, "err", err)
		}
		delete(owned, rel.lane)
		delete(releasing, rel.lane)
	}

	for {
		ev, err := r.leaseTick(ctx, host, ttl, owned, releasing)
		if err != nil {
			errs++
			if ctx.Err() == nil && (errs == 1 || errs%10 == 0) {
				r.log.Error("wharf: lease renewal failed; deliveries pause when leases run out", "err", err)
			}
		} else {
			errs = 0
			select {
			case r.leaseEv <- ev:
			case <-ctx.Done():
			}
		}
	wait:
		select {
		case <-tick.C:
		case rel := <-r.releaseCh:
			release(ctx, rel)
			goto wait
		case <-ctx.Done():
			r.leaseShutdown(owned, releasing)
			return
		}
	}
}

func (r *relay) leaseShutdown(owned map[int16]int64, releasing map[int16]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Lanes the engine already finished with are always safe to hand back.
	for {
		select {
		case rel := <-r.releaseCh:
			_, _ = r.pool.Exec(ctx, r.q.release, rel.lane, r.cfg.RelayID, rel.fence)
			delete(owned, rel.lane)
			continue
		default:
		}
		break
	}
	if r.released && len(owned) > 0 {
		lanes := make([]int16, 0, len(owned))
		for l := range owned {
			lanes = append(lanes, l)
		}
		if _, err := r.pool.Exec(ctx, r.q.releaseAll, r.cfg.RelayID, lanes); err != nil {
			r.log.Warn("wharf: releasing lanes at stop failed; they will expire", "err", err)
		}
	}
	if r.released {
		_, _ = r.pool.Exec(ctx, r.q.unregister, r.cfg.RelayID)
	}
}

func (r *relay) leaseTick(ctx context.Context, host, ttl string, owned map[int16]int64, releasing map[int16]bool) (leaseEvent, error) {
	start := time.Now()
	ev := leaseEvent{until: start.Add(r.cfg.LeaseTTL)}
	var live int
	b := &pgx.Batch{}
	b.Queue(r.q.heartbeat, r.cfg.RelayID, host, os.Getpid(), ttl).QueryRow(func(row pgx.Row) error { return row.Scan(&live) })
	renewed := map[int16]int64{}
	b.Queue(r.q.renew, r.cfg.RelayID, ttl).Query(func(rows pgx.Rows) error {
		var lane int16
		var fence int64
		_, err := pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
			renewed[lane] = fence
			return nil
		})
		return err
	})
	b.Queue(r.q.laneOwners, ttl).QueryRow(func(row pgx.Row) error { return row.Scan(&ev.uncovered) })
	if err := r.pool.SendBatch(ctx, b).Close(); err != nil {
		return ev, err
	}
	for lane, fence := range owned {
		if f, ok := renewed[lane]; !ok || f != fence {
			ev.lost = append(ev.lost, lane)
			delete(owned, lane)
			delete(releasing, lane)
		} else {
			ev.renewed = append(ev.renewed, lane)
		}
	}
	for lane, fence := range renewed {
		if _, ok := owned[lane]; !ok {
			// Ours in the table but unknown here (a previous incarnation with
			// the same id): hand it back so it is read from scratch.
			_, _ = r.pool.Exec(ctx, r.q.release, lane, r.cfg.RelayID, fence)
		}
	}
	select {
	case <-r.stopReq:
		return ev, nil // stopping: claim and rebalance nothing
	default:
	}
	share := (wharfmigrate.Lanes + live - 1) / max(live, 1)
	active := len(owned) - len(releasing)
	if active > share {
		var cand []int16
		for lane := range owned {
			if !releasing[lane] {
				cand = append(cand, lane)
			}
		}
		sort.Slice(cand, func(i, j int) bool { return cand[i] > cand[j] })
		for _, lane := range cand[:active-share] {
			releasing[lane] = true
			ev.release = append(ev.release, lane)
		}
	}
	if active < share {
		rows, err := r.pool.Query(ctx, r.q.claim, r.cfg.RelayID, ttl, share-active)
		if err != nil {
			return ev, err
		}
		var got []laneLease
		var lane int16
		var fence int64
		if _, err := pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
			got = append(got, laneLease{lane: lane, fence: fence})
			return nil
		}); err != nil {
			return ev, err
		}
		if len(got) > 0 {
			if err := r.loadRetries(ctx, got); err != nil {
				// We hold the leases now; hand them back rather than run
				// without the attempt counts.
				for _, g := range got {
					_, _ = r.pool.Exec(context.Background(), r.q.release, g.lane, r.cfg.RelayID, g.fence)
				}
				return ev, err
			}
			for _, g := range got {
				owned[g.lane] = g.fence
			}
			ev.acquired = got
			// The lanes just claimed were counted as uncovered above.
			ev.uncovered = max(0, ev.uncovered-len(got))
		}
	}
	return ev, nil
}

func (r *relay) loadRetries(ctx context.Context, got []laneLease) error {
	lanes := make([]int16, len(got))
	idx := map[int16]int{}
	for i, g := range got {
		lanes[i] = g.lane
		idx[g.lane] = i
		got[i].retries = map[int64]retryInfo{}
	}
	rows, err := r.pool.Query(ctx, r.q.loadRetries, lanes)
	if err != nil {
		return err
	}
	var id int64
	var attempts int
	var next time.Time
	var lane int16
	_, err = pgx.ForEachRow(rows, []any{&id, &attempts, &next, &lane}, func() error {
		got[idx[lane]].retries[id] = retryInfo{attempts: attempts, next: next}
		return nil
	})
	return err
}

// listen wakes the engine on every notification from the outbox trigger. It
// uses a connection of its own so it never holds one of the pool's.
func (r *relay) listen(ctx context.Context) {
	channel := wharfmigrate.NotifyChannel(r.cfg.Schema)
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(ctx, `LISTEN "`+channel+`"`); err == nil {
				for {
					if _, err = conn.WaitForNotification(ctx); err != nil {
						break
					}
					select {
					case r.wake <- struct{}{}:
					default:
					}
				}
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("wharf: LISTEN connection failed; polling until it is back", "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}
