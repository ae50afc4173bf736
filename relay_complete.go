package wharf

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf/internal/store"
)

func (r *relay) enqueueOp(o store.Op) {
	l := o.Ref.(*msg).lane
	o.Lane = l.id
	o.Fence = l.fence
	l.pendingOps++
	if len(r.ops.pending) == 0 {
		r.ops.since = r.now()
	}
	if o.Kind == store.OpAck {
		r.ops.acks++
	}
	r.ops.pending = append(r.ops.pending, o)
}

// opsLingering reports whether the pending results wait for company (see
// opsLinger): none is an acknowledgement, the completer is free and the
// relay is not stopping.
func (r *relay) opsLingering() bool {
	return len(r.ops.pending) > 0 && r.ops.acks == 0 && !r.ops.busy && !r.stopping
}

func (r *relay) maybeFlushOps(now time.Time) {
	if r.ops.busy || len(r.ops.pending) == 0 || now.Before(r.ops.retry.At) {
		return
	}
	if r.opsLingering() && now.Sub(r.ops.since) < opsLinger {
		return
	}
	r.ops.busy = true
	r.ops.acks = 0
	ops := r.ops.pending
	r.ops.pending, r.ops.spare = r.ops.spare, nil
	r.opsReq <- ops
}

func (r *relay) onOps(res store.OpsResult) {
	r.ops.busy = false
	now := r.now()
	if res.Err != nil {
		d := r.ops.retry.Fail(now)
		r.stats.DBErrors.Add(1)
		if r.outage.dbFailed(now) {
			r.log.Error("wharf: writing delivery results failed; retrying", "err", res.Err, "retry_in", d.Round(time.Millisecond))
		}
		if r.hardCtx.Err() == nil {
			r.ops.pending = append(res.Ops, r.ops.pending...)
			r.ops.acks = 0
			for _, o := range r.ops.pending {
				if o.Kind == store.OpAck {
					r.ops.acks++
				}
			}
		}
		return
	}
	if res.Isolated {
		r.log.Warn("wharf: a batch of delivery results was refused and written again in parts", "results", len(res.Ops))
	}
	r.ops.retry.OK()
	r.outage.dbOK(r.log, time.Now())
	acks := 0
	var lost []int
	for _, o := range res.Ops {
		m := o.Ref.(*msg)
		l := m.lane
		l.pendingOps--
		if l.dropped {
			continue
		}
		if !res.Valid[o.Lane] {
			lost = append(lost, int(o.Lane))
			r.dropLane(l)
			continue
		}
		switch o.Kind {
		case store.OpAck:
			acks++
			r.unload(m)
			r.delivered++
			r.stats.Delivered.Add(1)
			r.stats.Topic(m.Topic).Delivered.Add(1)
			r.stats.observeLatency(now.Add(r.skew).Sub(m.CreatedAt))
		case store.OpDead:
			r.unload(m)
			r.stats.DeadLettered.Add(1)
			r.stats.Topic(m.Topic).DeadLettered.Add(1)
			if kq := m.kq; kq != nil {
				kq.remove(m)
				kq.deadPending--
				r.settle(kq, now)
			} else {
				delete(l.unkeyed, m.Seq)
			}
		}
		r.maybeRelease(l)
	}
	r.lanesLost(lost, "another relay took them over: their delivery results were not written")
	if acks > 0 {
		r.stats.observeRemoval(acks)
	}
	r.publishMem()
	// The written slice carries the next batch: a batch grown op by op
	// copied every op about twice.
	clear(res.Ops)
	r.ops.spare = res.Ops[:0]
}

// errorText is what is stored as a message's last error: at most 4 KiB,
// valid UTF-8 cut at a rune boundary, no NUL bytes (PostgreSQL text refuses
// both, and one refused result must not hold back the others).
func errorText(err error) string {
	s := err.Error()
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", `\0`)
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	const limit = 4096
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// oneLine shortens s to n bytes on one line, for logs.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
