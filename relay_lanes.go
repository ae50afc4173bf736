package wharf

import (
	"context"
	"time"

	"github.com/wharfhq/wharf/internal/laneset"
	"github.com/wharfhq/wharf/internal/store"
)

type laneState struct {
	id         int16
	fence      int64
	leaseUntil time.Time // local clock, conservative (see lease.go)
	cursor     int64
	limit      int
	filled     bool                      // the last fetch brought the lane's whole limit
	keys       map[string]*keyQ          // by ordering key
	unkeyed    map[int64]*msg            // loaded unkeyed messages by seq
	held       map[int64]*heldMsg        // unkeyed messages kept as positions
	retries    map[int64]store.RetryInfo // attempts of messages not loaded
	mem        memUse                    // loaded messages of this lane
	inflight   int                       // messages of this lane at a sink
	pendingOps int                       // results of this lane not yet written
	batches    map[*sinkBatch]struct{}
	releasing  bool
	dropped    bool
	// waitZombies: this relay lost the lane earlier and batches of that
	// time are still at a sink; the lane is not read until they return, so
	// one relay never runs two batches of a key at once.
	waitZombies bool
}

func (r *relay) onLease(ev leaseEvent) {
	r.leaseSeen = true
	r.stats.Uncovered.Store(int64(ev.uncovered))
	r.stats.LastDBOK.Store(time.Now().UnixNano())
	defer r.refreshOldestDue()
	r.uncovered = ev.uncovered
	if ev.lostID {
		r.fatal = ErrRelayIDInUse
		r.log.Error("wharf: another relay took over this relay id; stopping", "relay_id", r.cfg.RelayID)
		return
	}
	r.outage.dbOK(r.log, time.Now())
	var lost []int
	for _, lane := range ev.lost {
		if l := r.lanes[lane]; l != nil {
			lost = append(lost, int(lane))
			r.dropLane(l)
		}
	}
	r.lanesLost(lost, "the lease round found them taken or expired")
	for _, lane := range ev.renewed {
		if l := r.lanes[lane]; l != nil {
			l.leaseUntil = ev.until
			for b := range l.batches {
				b.ctx.setUntil(r.leaseEnd(b))
			}
		}
	}
	r.stats.LeaseRenewals.Add(int64(len(ev.renewed)))
	for _, a := range ev.acquired {
		if r.stopping {
			r.releaseCh <- store.LaneRelease{Lane: a.Lane, Fence: a.Fence}
			continue
		}
		l := &laneState{
			id: a.Lane, fence: a.Fence, leaseUntil: ev.until, keys: map[string]*keyQ{},
			unkeyed: map[int64]*msg{}, held: map[int64]*heldMsg{}, batches: map[*sinkBatch]struct{}{},
			retries: a.Retries, limit: r.baseLimit(),
			waitZombies: r.zombies[a.Lane] > 0,
		}
		if l.retries == nil {
			l.retries = map[int64]store.RetryInfo{}
		}
		r.lanes[a.Lane] = l
		r.fetch.want = true
	}
	if len(ev.acquired) > 0 {
		r.outage.lanesBack(r.log, time.Now(), len(r.lanes))
	}
	for _, lane := range ev.release {
		if l := r.lanes[lane]; l != nil && !l.releasing {
			l.releasing = true
			r.dropBuffered(l)
			r.maybeRelease(l)
		}
	}
	r.stats.LanesOwned.Store(int64(len(r.lanes)))
	if len(ev.acquired) > 0 || len(ev.lost) > 0 || len(ev.release) > 0 {
		r.log.Debug("wharf: lanes changed", "owned", len(r.lanes), "acquired", len(ev.acquired), "lost", len(ev.lost), "releasing", len(ev.release))
	}
}

// refreshOldestDue publishes the creation time of the oldest message this
// relay holds that is due or retrying (scheduled ones excluded).
func (r *relay) refreshOldestDue() {
	var oldest time.Time
	see := func(t time.Time) {
		if !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
			oldest = t
		}
	}
	now := r.now()
	for _, l := range r.lanes {
		for _, kq := range l.keys {
			if len(kq.msgs) > 0 && (!kq.msgs[0].due.After(now) || kq.msgs[0].attempts > 0) {
				see(dueSince(&kq.msgs[0].Message))
			} else if kq.holdRetry {
				see(kq.heldCreated)
			}
		}
		for _, m := range l.unkeyed {
			see(dueSince(&m.Message))
		}
		for _, h := range l.held {
			if h.retry {
				see(h.created)
			}
		}
	}
	if oldest.IsZero() {
		r.stats.OldestDue.Store(0)
		return
	}
	r.stats.OldestDue.Store(r.toLocal(oldest).UnixNano())
}

func (r *relay) baseLimit() int {
	return max(16, r.cfg.FetchBatch/(len(r.lanes)+1))
}

// dropBuffered forgets the lane's messages that are neither at the sink nor
// being dead-lettered; they stay in the outbox for whoever reads the lane next.
// Entries already in the ready queue or timer heap are skipped at dispatch
// because their generation or lane no longer matches.
func (r *relay) dropBuffered(l *laneState) {
	for k, kq := range l.keys {
		kq.gen++
		kq.scheduled = false
		kq.loading = false
		r.stubs -= len(kq.stubs)
		kq.stubs = nil
		kq.truncFrom = 0
		kept := kq.msgs[:0]
		for _, m := range kq.msgs {
			if m.atSink || m.dead {
				kept = append(kept, m)
				continue
			}
			r.unload(m)
		}
		clear(kq.msgs[len(kept):])
		kq.msgs = kept
		if len(kq.msgs) == 0 {
			delete(l.keys, k)
		}
	}
	for seq, m := range l.unkeyed {
		if !m.atSink && !m.dead {
			r.unload(m)
			delete(l.unkeyed, seq)
		}
	}
	clear(l.held)
	r.publishMem()
}

// lanesLost counts and logs lanes this relay lost (already dropped), in one
// line for all of them: a relay paused past its leases loses every lane at
// once. Whichever way a loss is found (a lease round, or a fenced result
// write refused), it is reported the same way.
func (r *relay) lanesLost(lanes []int, how string) {
	if len(lanes) == 0 {
		return
	}
	r.stats.LeaseLosses.Add(int64(len(lanes)))
	r.log.Warn("wharf: lost lane leases; dropping their in-memory work (another relay may deliver those messages again)", "lanes", laneset.Ranges(lanes), "count", len(lanes), "how", how)
	r.outage.lanesLost(time.Now())
}

func (r *relay) dropLane(l *laneState) {
	l.dropped = true
	r.mem.msgs -= l.mem.msgs
	r.mem.bytes -= l.mem.bytes
	l.mem = memUse{}
	for _, kq := range l.keys {
		r.stubs -= len(kq.stubs)
	}
	if l.inflight > 0 {
		r.zombies[l.id] += l.inflight
		for b := range l.batches {
			b.fence()
		}
	}
	delete(r.lanes, l.id)
	r.stats.LanesOwned.Store(int64(len(r.lanes)))
	r.publishMem()
}

// zombieReturned counts down the messages of a lost lane that were at a sink.
func (r *relay) zombieReturned(lane int16) {
	r.zombies[lane]--
	if r.zombies[lane] > 0 {
		return
	}
	delete(r.zombies, lane)
	if l := r.lanes[lane]; l != nil && l.waitZombies {
		l.waitZombies = false
		r.fetch.want = true
	}
}

// maybeRelease hands a releasing lane back once nothing of it is at the sink
// or waiting to be written.
func (r *relay) maybeRelease(l *laneState) {
	if !l.releasing || l.dropped || l.inflight > 0 || l.pendingOps > 0 {
		return
	}
	r.dropLane(l)
	r.releaseCh <- store.LaneRelease{Lane: l.id, Fence: l.fence}
}

// leaseMargin is how long before its lease ends a lane stops handing messages
// to sinks, and its batches at a sink are cancelled: a relay that was paused
// or cut off from the database stops delivering before another owner starts.
func (r *relay) leaseMargin() time.Duration { return r.cfg.LeaseTTL / 5 }

// leaseOK reports whether the lane may hand messages to the sink.
func (r *relay) leaseOK(l *laneState, now time.Time) bool {
	return !l.dropped && !l.releasing && now.Add(r.leaseMargin()).Before(l.leaseUntil)
}

// checkLeases cancels the sink calls of lanes whose lease is about to end
// without a renewal: the publish context of a batch ends with the lease of
// its lanes.
func (r *relay) checkLeases(now time.Time) {
	for _, l := range r.lanes {
		if len(l.batches) == 0 || now.Add(r.leaseMargin()).Before(l.leaseUntil) {
			continue
		}
		for b := range l.batches {
			b.fence()
		}
	}
}

// leaseCheckAt is when checkLeases must run next.
func (r *relay) leaseCheckAt() time.Time {
	var at time.Time
	for _, l := range r.lanes {
		if len(l.batches) == 0 {
			continue
		}
		if t := l.leaseUntil.Add(-r.leaseMargin()); at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at
}

// releaseAfterHardStop hands the lanes back once every sink call of a hard
// stop has returned, if their leases have not run out by then (the lease
// loop stopped renewing at the hard stop).
func (r *relay) releaseAfterHardStop() {
	// Often the database is what failed: do not wait long for it, the
	// leases expire anyway.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var lanes []int16
	now := r.now()
	for id, l := range r.lanes {
		if now.Add(r.leaseMargin()).Before(l.leaseUntil) {
			lanes = append(lanes, id)
		}
	}
	if len(lanes) > 0 {
		if err := r.st.ReleaseAll(ctx, lanes); err != nil {
			r.log.Warn("wharf: releasing lanes after a hard stop failed; they will expire", "err", err)
		}
	}
	_ = r.st.Unregister(ctx)
}
