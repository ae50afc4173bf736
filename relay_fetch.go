package wharf

import (
	"time"

	"github.com/wharfhq/wharf/internal/store"
)

// maybeFetch sends the next read when the previous one is back, there is
// room in the memory budget and either there is work or the poll interval
// has passed.
func (r *relay) maybeFetch(now time.Time) {
	if r.fetch.busy || r.stopping || len(r.lanes) == 0 || now.Before(r.fetch.retry.At) {
		return
	}
	if now.Sub(r.fetch.last) < r.fetchWait() {
		return
	}
	// Only loaded messages count: held ones are positions. Everything
	// loaded is due or at a sink, so a full budget always drains.
	full := r.mem.msgs+r.cfg.FetchBatch > r.cfg.MaxBuffered || r.mem.bytes+r.fetchBytes > r.cfg.MaxBufferedBytes
	if full && len(r.loads) == 0 && len(r.refills) == 0 {
		return
	}
	req := store.FetchRequest{Pos: r.fetch.pos, RefillLimit: r.perKeyCap}
	total := 0
	for _, l := range r.lanes {
		if l.releasing || l.waitZombies {
			continue
		}
		req.Lanes = append(req.Lanes, l.id)
		req.Cursors = append(req.Cursors, l.cursor)
		req.Limits = append(req.Limits, int32(l.limit))
		req.Fences = append(req.Fences, l.fence)
		total += l.limit
	}
	if len(req.Lanes) == 0 {
		return
	}
	if total > r.cfg.FetchBatch {
		// Hot lanes asked for more than a batch: scale every lane down.
		for i := range req.Limits {
			req.Limits[i] = int32(max(1, int(req.Limits[i])*r.cfg.FetchBatch/total))
		}
	}
	// Each lane's share of a fetch's payload bytes (see byteCut).
	perLane := max(1, r.fetchBytes/int64(len(req.Lanes)))
	req.Bytes = make([]int64, len(req.Lanes))
	for i := range req.Bytes {
		req.Bytes[i] = perLane
	}
	if full {
		// Only the loads a key waits for (and late commits, which are
		// never skipped): keys whose next message is a position must not
		// wait for room that only their own progress makes.
		clear(req.Limits)
	}
	// Loads and refills of lanes this request reads; the upper bound of a
	// refill is the cursor now, not when it was asked for: a fetch that
	// completed in between may have advanced it past rows of the key that
	// were dropped as truncated.
	for _, ld := range r.loads {
		if l := r.lanes[ld.Lane]; l != nil && l.fence == ld.Fence && !l.releasing {
			req.Loads = append(req.Loads, ld)
		} else {
			r.dropLoad(ld.Lane, ld.Key)
		}
	}
	for _, rf := range r.refills {
		if l := r.lanes[rf.Lane]; l != nil && l.fence == rf.Fence && !l.releasing {
			rf.To = l.cursor
			req.Refills = append(req.Refills, rf)
		} else {
			r.dropLoad(rf.Lane, rf.Key)
		}
	}
	r.loads, r.refills = nil, nil
	r.loading += len(req.Loads) + len(req.Refills)
	r.fetch.busy = true
	r.fetch.want = false
	r.fetch.last = now
	r.fetchReq <- req
}

// dropLoad forgets a load that will not be sent (its lane changed hands).
func (r *relay) dropLoad(lane int16, key string) {
	if l := r.lanes[lane]; l != nil && key != "" {
		if kq := l.keys[key]; kq != nil {
			kq.loading = false
		}
	}
}

func (r *relay) onFetch(res store.FetchResult) {
	r.fetch.busy = false
	now := r.now()
	if res.Err != nil {
		d := r.fetch.retry.Fail(now)
		r.stats.DBErrors.Add(1)
		if r.outage.dbFailed(now) {
			r.log.Error("wharf: fetch failed; retrying", "err", res.Err, "retry_in", d.Round(time.Millisecond))
		}
		// Send the loads and refills again with the next fetch.
		r.loading -= len(res.Req.Loads) + len(res.Req.Refills)
		r.loads = append(res.Req.Loads, r.loads...)
		r.refills = append(res.Req.Refills, r.refills...)
		return
	}
	r.fetch.retry.OK()
	r.outage.dbOK(r.log, time.Now())
	r.stats.LastDBOK.Store(time.Now().UnixNano()) // for probes: this machine's clock
	r.stats.observeFetch(res.Finished.Sub(res.Started), len(res.Rows))
	if !res.DBNow.IsZero() {
		r.skew = res.DBNow.Sub(res.Started.Add(res.Finished.Sub(res.Started) / 2))
		r.skewLow = res.DBNow.Sub(res.Finished)
	}
	if res.Rewound {
		r.rewind(res, now)
		return
	}
	r.fetch.pos = res.Pos
	r.applyLoads(res, now)
	r.applyRefills(res, now)
	forward := make(map[int16]int, len(res.Req.Lanes))
	for i := range res.Rows {
		row := &res.Rows[i]
		l := r.lanes[row.Lane]
		if l == nil || l.releasing || l.fence != res.FenceOf(row.Lane) {
			continue // the lane changed hands while the fetch ran
		}
		if row.Seq > l.cursor {
			forward[row.Lane]++
		}
		r.insert(l, row, now, false)
	}
	// Behind: the fetch brought a quarter of the rows it asked for or
	// more, or a lane filled its limit twice in a row (its limit doubled
	// in between). Once is not enough: a producer's batch puts several
	// messages of a key, so of one lane, into one commit.
	total := 0
	for _, n := range forward {
		total += n
	}
	want := res.Req.ExpectedRows()
	r.fetch.behind = want > 0 && total > 0 && 4*total >= want
	for i, lane := range res.Req.Lanes {
		l := r.lanes[lane]
		if l == nil || l.fence != res.Req.Fences[i] {
			continue
		}
		lim := int(res.Req.Limits[i])
		got := forward[lane]
		filled := lim > 0 && got >= lim
		if filled && l.filled {
			r.fetch.behind = true
		}
		l.filled = filled
		if got >= lim {
			l.limit = min(2*l.limit, r.cfg.FetchBatch)
		} else {
			l.limit = max(r.baseLimit()/4, min(l.limit, 2*got+16))
		}
		// The cursor moves only now, after every row was inserted, so the
		// straggler rows (seqs <= cursor) were told apart above.
		for j := range res.Rows {
			if res.Rows[j].Lane == lane && res.Rows[j].Seq > l.cursor {
				l.cursor = res.Rows[j].Seq
			}
		}
	}
	r.publishMem()
	r.stats.Held.Store(int64(r.stubs + r.heldUnkeyed()))
	r.fetch.lastEmpty = len(res.Rows) == 0 && !res.More
	if r.fetch.lastEmpty {
		r.fetch.emptyRun++
	} else {
		r.fetch.emptyRun = 0
		r.fetch.want = true
		if r.firstRows.IsZero() {
			r.firstRows = res.Started
		}
	}
}

func (r *relay) heldUnkeyed() int {
	n := 0
	for _, l := range r.lanes {
		n += len(l.held)
	}
	return n
}

// rewind reads every lane again from the start after the database went back
// in time (see store.FetchResult.Rewound). What is at a sink finishes and its
// acknowledgements are written (fenced as always); everything else is read
// again, so nothing committed on the new history is skipped.
func (r *relay) rewind(res store.FetchResult, now time.Time) {
	r.log.Warn("wharf: the database went back in time (failover to a standby that lost commits, or a restore): reading every lane again")
	r.stats.Rewinds.Add(1)
	r.loading -= len(res.Req.Loads) + len(res.Req.Refills)
	r.loads, r.refills = nil, nil
	r.fetch.pos = nil
	for _, l := range r.lanes {
		r.dropBuffered(l)
		l.cursor = 0
		l.limit = r.baseLimit()
	}
	r.fetch.want = true
	_ = now
}
