package wharf

import (
	"container/heap"
	"errors"
	"time"

	"github.com/wharfhq/wharf/internal/backoff"
	"github.com/wharfhq/wharf/internal/store"
)

const maxRun = 100 // most messages of one key in one sink batch

// sinkSlot is one sink with its own workers and in-flight count, so a slow
// or stuck sink (one route of a Router) never takes the workers of another.
type sinkSlot struct {
	sink     Sink
	req      chan *sinkBatch
	inflight int // batches at this sink
	stats    *SinkStats
	lastLen  int // messages in the last batch sent: the next one's capacity
}

type sinkBatch struct {
	slot  *sinkSlot
	msgs  []*msg
	pub   []*Message
	errs  []error
	lanes []*laneState
	ctx   *batchCtx
	sent  time.Time
	took  time.Duration
	// fenced is set (by the engine only) when the batch's context was
	// cancelled because one of its lanes' lease ended: what the sink did not
	// deliver is not held against the messages.
	fenced bool
}

// fence cancels the batch's publish context because a lease ended.
func (b *sinkBatch) fence() {
	b.fenced = true
	b.ctx.cancel(errLeaseEnded)
}

// leaseEnd is when the batch must stop publishing: the earliest lease of its
// lanes, less the margin.
func (r *relay) leaseEnd(b *sinkBatch) time.Time {
	var end time.Time
	for _, l := range b.lanes {
		if end.IsZero() || l.leaseUntil.Before(end) {
			end = l.leaseUntil
		}
	}
	return end.Add(-r.leaseMargin())
}

func (r *relay) sinkOf(topic string) int {
	if r.route == nil {
		return 0
	}
	return r.route(topic)
}

// maybeDispatch turns ready keys and messages into batches, at most one new
// batch per sink with a free worker per pass.
func (r *relay) maybeDispatch(now time.Time) {
	if r.stopping {
		return
	}
	for {
		building := make([]*sinkBatch, len(r.sinks))
		var deferred []readyItem
		keep := r.ready[:0]
		progress := false
		for _, it := range r.ready {
			switch {
			case it.m != nil:
				m := it.m
				l := m.lane
				if l.dropped || l.releasing || l.unkeyed[m.Seq] != m || m.atSink || m.dead {
					continue
				}
				if !r.leaseOK(l, now) {
					deferred = append(deferred, it)
					continue
				}
				b := r.batchFor(building, r.sinkOf(m.Topic))
				if b == nil {
					keep = append(keep, it)
					continue
				}
				r.add(b, m)
				progress = true
			case it.kq != nil:
				kq := it.kq
				if it.gen != kq.gen || !kq.scheduled {
					continue // superseded entry
				}
				l := kq.lane
				if l.dropped || l.releasing {
					continue
				}
				kq.scheduled = false
				if kq.running || kq.deadPending > 0 || len(kq.msgs) == 0 || kq.minStub() < kq.msgs[0].Seq || kq.msgs[0].due.After(now) {
					r.kick(kq, now)
					continue
				}
				if !r.leaseOK(l, now) {
					kq.scheduled = true
					deferred = append(deferred, it)
					continue
				}
				s := r.sinkOf(kq.msgs[0].Topic)
				b := r.batchFor(building, s)
				if b == nil {
					kq.scheduled = true
					keep = append(keep, it)
					continue
				}
				kq.running = true
				stop := kq.minStub()
				for i, m := range kq.msgs {
					if i >= maxRun || m.due.After(now) || m.Seq >= stop || m.atSink || m.dead || r.sinkOf(m.Topic) != s {
						break
					}
					r.add(b, m)
				}
				progress = true
			}
		}
		clear(r.ready[len(keep):])
		r.ready = keep
		for _, it := range deferred {
			// Lease about to expire: wait for the renewal, then retry.
			it.deferred = true
			heap.Push(&r.timers, timerEntry{at: now.Add(100 * time.Millisecond), it: it})
		}
		sent := false
		for _, b := range building {
			if b != nil && len(b.msgs) > 0 {
				r.send(b, now)
				sent = true
			}
		}
		if !sent || !progress || len(r.ready) == 0 {
			return
		}
	}
}

// batchFor returns the batch being built for sink s, or nil when the sink
// has no free worker or the batch is full.
func (r *relay) batchFor(building []*sinkBatch, s int) *sinkBatch {
	b := building[s]
	if b == nil {
		slot := r.sinks[s]
		if slot.inflight >= r.cfg.SinkConcurrency {
			return nil
		}
		n := min(r.cfg.SinkBatch, max(16, slot.lastLen))
		b = &sinkBatch{slot: slot, msgs: make([]*msg, 0, n), pub: make([]*Message, 0, n)}
		building[s] = b
	}
	if len(b.msgs) >= r.cfg.SinkBatch {
		return nil
	}
	return b
}

func (r *relay) add(b *sinkBatch, m *msg) {
	m.atSink = true
	m.Attempt = m.attempts + 1
	m.lane.inflight++
	b.msgs = append(b.msgs, m)
	b.pub = append(b.pub, &m.Message)
}

func (r *relay) send(b *sinkBatch, now time.Time) {
	for _, m := range b.msgs {
		l := m.lane
		if _, ok := l.batches[b]; !ok {
			l.batches[b] = struct{}{}
			b.lanes = append(b.lanes, l)
		}
	}
	b.ctx = newBatchCtx(r.hardCtx, r.now, r.epoch, r.leaseEnd(b))
	b.sent = now
	b.slot.lastLen = len(b.msgs)
	b.slot.inflight++
	r.stats.InFlight.Add(int64(len(b.msgs)))
	b.slot.req <- b
}

func markFailed(failed map[*keyQ]bool, kq *keyQ) map[*keyQ]bool {
	if failed == nil {
		failed = map[*keyQ]bool{}
	}
	failed[kq] = true
	return failed
}

func (r *relay) onSink(b *sinkBatch) {
	b.slot.inflight--
	if b.ctx.leaseEnded() {
		b.fenced = true // the sink saw the lease end before the engine did
	}
	b.ctx.cancel(nil)
	for _, l := range b.lanes {
		delete(l.batches, b)
	}
	r.stats.InFlight.Add(-int64(len(b.msgs)))
	r.stats.observePublish(b.took)
	b.slot.stats.Publishes.Add(1)
	b.slot.stats.PublishSeconds.observe(b.took.Seconds())
	now := r.now()
	// failed: keys with a message not taken (nil until one is); touched:
	// every key of the batch once, marked on the key (no map per batch).
	var failed map[*keyQ]bool
	var touched []*keyQ
	for i, m := range b.msgs {
		m.atSink = false
		l := m.lane
		l.inflight--
		var err error
		if b.errs != nil {
			err = b.errs[i]
		}
		if l.dropped {
			r.zombieReturned(l.id)
			continue
		}
		kq := m.kq
		if kq != nil && !kq.touched {
			kq.touched = true
			touched = append(touched, kq)
		}
		ok := err == nil || errors.Is(err, ErrDuplicate)
		switch {
		case ok && kq != nil && failed[kq]:
			// The destination took it after an earlier message of its key
			// failed: it is sent again after that one, so the
			// destination's last copy of the key is in order.
			r.stats.Resent.Add(1)
		case ok:
			if err != nil {
				r.stats.Duplicates.Add(1)
				r.log.Debug("wharf: the destination already held this message id (a redelivery)", "id", m.ID)
			}
			r.enqueueOp(store.Op{Kind: store.OpAck, Ref: m, At: m.at, Seq: m.Seq, Nonce: m.nonce, Attempts: m.attempts})
			if kq != nil {
				kq.remove(m)
			} else {
				delete(l.unkeyed, m.Seq)
			}
		case errors.Is(err, ErrNotAttempted) || b.fenced:
			// Not tried, or cut short because the lease ended: no attempt.
			if kq != nil {
				failed = markFailed(failed, kq)
			} else {
				r.ready = append(r.ready, readyItem{m: m})
			}
		default:
			if kq != nil {
				failed = markFailed(failed, kq)
			}
			r.fail(m, err, now)
		}
	}
	for _, kq := range touched {
		kq.touched = false
		kq.running = false
		r.settle(kq, now)
	}
	for _, l := range b.lanes {
		r.maybeRelease(l)
	}
}

func (r *relay) fail(m *msg, err error, now time.Time) {
	m.attempts++
	r.stats.FailedAttempts.Add(1)
	r.stats.Topic(m.Topic).FailedAttempts.Add(1)
	r.noteFailure(m, err, now)
	text := errorText(err)
	if IsPermanent(err) || m.attempts >= r.cfg.MaxAttempts {
		r.log.Warn("wharf: message moves to dead letters", "id", m.ID, "topic", m.Topic, "attempts", m.attempts, "err", text)
		m.dead = true
		if m.kq != nil {
			m.kq.deadPending++
		}
		r.enqueueOp(store.Op{Kind: store.OpDead, Ref: m, Seq: m.Seq, Nonce: m.nonce, Err: text, Attempts: m.attempts})
		return
	}
	d, ok := retryDelay(err)
	if !ok {
		d = backoff.Delay(m.attempts, r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff)
	}
	m.due = now.Add(d)
	r.log.Debug("wharf: delivery failed; will retry", "id", m.ID, "attempt", m.attempts, "retry_in", d.Round(time.Millisecond), "err", text)
	r.enqueueOp(store.Op{Kind: store.OpRetry, Ref: m, Seq: m.Seq, Nonce: m.nonce, Err: text, Attempts: m.attempts, NextAt: r.toDB(m.due)})
	if m.kq == nil {
		l := m.lane
		delete(l.unkeyed, m.Seq)
		r.unload(m)
		if !l.releasing && !r.stopping {
			r.insertUnkeyed(l, m, now)
		}
	}
}

// noteFailure logs failed deliveries as at most one warning per 10 seconds:
// an outage fails thousands of messages, and keys may be personal data.
func (r *relay) noteFailure(m *msg, err error, now time.Time) {
	f := &r.failLog
	f.n++
	if !f.since.IsZero() && now.Sub(f.since) < 10*time.Second {
		return
	}
	r.log.Warn("wharf: deliveries failing; they are retried with backoff", "failures", f.n, "last_id", m.ID, "last_topic", m.Topic, "last_err", oneLine(err.Error(), 300))
	f.n, f.since = 0, now
}
