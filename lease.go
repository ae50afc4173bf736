package wharf

import (
	"context"
	"sort"
	"time"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

type leaseEvent struct {
	acquired  []store.LaneLease
	renewed   []int16
	lost      []int16
	release   []int16 // lanes over this relay's fair share: finish and hand back
	until     time.Time
	uncovered int
	lostID    bool
}

// leaseLoop keeps this relay's lanes: it heartbeats, renews leases, claims free
// or expired lanes up to a fair share (ceil(lanes / live relays); with
// Exclusive, every lane or none), asks the engine to hand back lanes over the
// share, and releases lanes the engine has finished with. When ctx ends it
// reads from released whether the engine stopped gracefully: then it releases
// every lane it still holds; after a hard stop it leaves that to the engine,
// which waits for the sink calls.
func (r *relay) leaseLoop(ctx context.Context, released <-chan bool) {
	owned := map[int16]int64{}
	releasing := map[int16]bool{}
	stray := 0 // Exclusive: rounds in a row this standby saw lanes nobody holds
	tick := time.NewTicker(r.cfg.RebalanceInterval)
	defer tick.Stop()
	errs := 0

	// A release is part of stopping, not cancelled by it: the engine hands
	// lanes back as a graceful stop finishes them, and a release cut short
	// by the stop left the lane held until its lease ran out.
	release := func(ctx context.Context, rel store.LaneRelease) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(r.cfg.LeaseTTL/3, r.cfg.RebalanceInterval))
		defer cancel()
		if err := r.st.Release(ctx, rel); err != nil {
			r.log.Warn("wharf: releasing lane failed; its lease will expire instead", "lane", rel.Lane, "err", err)
		}
		delete(owned, rel.Lane)
		delete(releasing, rel.Lane)
	}

	for {
		// A round that stalls must not outlive the leases it renews. A stop
		// does not cancel a round in flight: a cancelled statement can still
		// commit on the server after the client gave up on it, and a
		// heartbeat or claim committing after leaseShutdown would register
		// a stopped relay again, holding lanes, for a whole LeaseTTL.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(r.cfg.LeaseTTL/3, r.cfg.RebalanceInterval))
		ev, err := r.leaseTick(tctx, owned, releasing, &stray)
		cancel()
		if err != nil {
			errs++
			r.stats.DBErrors.Add(1)
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
			r.leaseShutdown(owned, <-released)
			return
		}
	}
}

func (r *relay) leaseShutdown(owned map[int16]int64, graceful bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Lanes the engine already finished with are always safe to hand back.
	for {
		select {
		case rel := <-r.releaseCh:
			_ = r.st.Release(ctx, rel)
			delete(owned, rel.Lane)
			continue
		default:
		}
		break
	}
	if !graceful {
		return
	}
	if len(owned) > 0 {
		lanes := make([]int16, 0, len(owned))
		for l := range owned {
			lanes = append(lanes, l)
		}
		if err := r.st.ReleaseAll(ctx, lanes); err != nil {
			r.log.Warn("wharf: releasing lanes at stop failed; they will expire", "err", err)
		}
	}
	_ = r.st.Unregister(ctx)
}

func (r *relay) leaseTick(ctx context.Context, owned map[int16]int64, releasing map[int16]bool, stray *int) (leaseEvent, error) {
	// The lease ends at least LeaseTTL after this moment, measured before
	// the round trip on the monotonic clock: the local view never outlives
	// the database's.
	start := r.now()
	ev := leaseEvent{until: start.Add(r.cfg.LeaseTTL)}
	lr, err := r.st.LeaseRound(ctx, r.cfg.LeaseTTL)
	if err != nil {
		return ev, err
	}
	ev.uncovered = lr.Uncovered
	if lr.LostID {
		ev.lostID = true
		return ev, nil
	}
	for lane, fence := range owned {
		if f, ok := lr.Renewed[lane]; ok && f == fence {
			ev.renewed = append(ev.renewed, lane)
		} else {
			ev.lost = append(ev.lost, lane)
			delete(owned, lane)
			delete(releasing, lane)
		}
	}
	for lane, fence := range lr.Renewed {
		if _, ok := owned[lane]; !ok {
			// Ours in the table but unknown here (a previous incarnation with
			// the same id): hand it back so it is read from scratch.
			_ = r.st.Release(ctx, store.LaneRelease{Lane: lane, Fence: fence})
		}
	}
	select {
	case <-r.stopReq:
		return ev, nil // stopping: claim and rebalance nothing
	default:
	}
	share := (wharfmigrate.Lanes + lr.Live - 1) / max(lr.Live, 1)
	active := len(owned) - len(releasing)
	alone := false
	if r.cfg.Exclusive {
		// Lanes a live relay other than this one holds.
		others := wharfmigrate.Lanes - len(lr.Renewed) - lr.Uncovered
		switch {
		case others == 0:
			share, alone = wharfmigrate.Lanes, true
			*stray = 0
		case active == 0:
			// Stand by. Lanes nobody holds while another relay holds some
			// are that relay's to take in its next round; if they are
			// still free a round later, it does not run with Exclusive (a
			// rolling change of the setting): cover them rather than
			// leave them undelivered.
			share = 0
			if lr.Uncovered > 0 {
				*stray++
			} else {
				*stray = 0
			}
			if *stray > 1 {
				share = lr.Uncovered
			}
		default:
			// Another relay holds lanes too: keep ours, cover the lanes
			// nobody holds, and hand none back.
			share = active + lr.Uncovered
			*stray = 0
		}
	}
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
		var got []store.LaneLease
		var err error
		if alone {
			got, err = r.st.ClaimAlone(ctx)
		} else {
			got, err = r.st.Claim(ctx, share-active)
		}
		if err != nil {
			return ev, err
		}
		if len(got) > 0 {
			lanes := make([]int16, len(got))
			for i, g := range got {
				lanes[i] = g.Lane
			}
			retries, err := r.st.LoadRetries(ctx, lanes)
			if err != nil {
				// We hold the leases now; hand them back rather than run
				// without the attempt counts.
				for _, g := range got {
					_ = r.st.Release(context.Background(), store.LaneRelease{Lane: g.Lane, Fence: g.Fence})
				}
				return ev, err
			}
			for i := range got {
				got[i].Retries = retries[got[i].Lane]
				owned[got[i].Lane] = got[i].Fence
			}
			ev.acquired = got
			// The lanes just claimed were counted as uncovered above.
			ev.uncovered = max(0, ev.uncovered-len(got))
		}
	}
	return ev, nil
}
