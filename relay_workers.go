package wharf

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/wharfhq/wharf/internal/store"
)

// ---- goroutines around the engine ----

// dbTimeout bounds one round trip to the database: a connection that stalls
// (packets swallowed, no reset) fails the round trip instead of hanging the
// relay; the engine retries it on another connection.
func (r *relay) dbTimeout() time.Duration { return max(5*time.Second, r.cfg.LeaseTTL) }

func (r *relay) fetcher() {
	for req := range r.fetchReq {
		ctx, cancel := context.WithTimeout(r.hardCtx, r.dbTimeout())
		res := r.st.Fetch(ctx, req)
		cancel()
		// run returns without reading this only on a hard stop, which
		// cancels hardCtx: never block on it then.
		select {
		case r.fetchRes <- res:
		case <-r.hardCtx.Done():
			return
		}
	}
}

func (r *relay) completer() {
	for ops := range r.opsReq {
		ctx, cancel := context.WithTimeout(r.hardCtx, r.dbTimeout())
		start := time.Now()
		res := r.st.WriteResults(ctx, ops)
		r.stats.ResultWriteSeconds.observe(time.Since(start).Seconds())
		cancel()
		select {
		case r.opsRes <- res:
		case <-r.hardCtx.Done():
			return
		}
	}
}

func (r *relay) sinkWorker(s *sinkSlot) {
	for b := range s.req {
		start := time.Now()
		if t := r.cfg.Tracer; t != nil {
			ctx, done := t.Publish(b.ctx, s.stats.Name, b.pub)
			b.errs = r.publish(ctx, s.sink, b)
			done(b.errs)
		} else {
			b.errs = r.publish(b.ctx, s.sink, b)
		}
		b.took = time.Since(start)
		r.sinkRes <- b // buffered for every worker: never blocks
	}
}

// publish calls the sink and normalises what it returns: a panic or a result
// slice of the wrong length fails the whole batch rather than the relay.
func (r *relay) publish(ctx context.Context, sink Sink, b *sinkBatch) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			errs = FailAll(len(b.pub), fmt.Errorf("wharf: sink panicked: %v\n%s", p, debug.Stack()))
		}
	}()
	errs = sink.Publish(ctx, b.pub)
	if errs != nil && len(errs) != len(b.pub) {
		errs = FailAll(len(b.pub), fmt.Errorf("wharf: sink returned %d results for %d messages", len(errs), len(b.pub)))
	}
	failed := 0
	for _, e := range errs {
		if e != nil && !errors.Is(e, ErrDuplicate) {
			failed++
		}
	}
	if failed > 0 {
		r.stats.SinkErrors.Add(1)
		b.slot.stats.FailedMessages.Add(int64(failed))
	}
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

// ---- readiness structures ----

// readyItem is a key whose head may be delivered, one loaded unkeyed
// message, or one held unkeyed message to load when due.
type readyItem struct {
	kq   *keyQ
	gen  uint64
	m    *msg
	lane *laneState
	held *heldMsg
	// deferred: put back because its lane's lease was about to end.
	deferred bool
}

// pending reports whether the item is delivery still in progress (a retry
// backoff, a lease deferral) rather than a message scheduled for later.
func (it readyItem) pending() bool {
	switch {
	case it.deferred:
		return true
	case it.m != nil:
		return it.m.attempts > 0 && !it.m.lane.dropped
	case it.held != nil:
		return it.held.retry && !it.lane.dropped && it.lane.held[it.held.seq] == it.held
	case it.kq != nil:
		return it.gen == it.kq.gen && it.kq.holdRetry && !it.kq.lane.dropped
	}
	return false
}

type timerEntry struct {
	at time.Time
	it readyItem
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = timerEntry{}
	*h = old[:n-1]
	return e
}

func (r *relay) schedule(it readyItem, due time.Time, now time.Time) {
	if due.After(now) {
		heap.Push(&r.timers, timerEntry{at: due, it: it})
		return
	}
	r.ready = append(r.ready, it)
}

// fireTimers moves due entries to the ready queue; a held unkeyed message
// that is due is loaded first.
func (r *relay) fireTimers(now time.Time) {
	for len(r.timers) > 0 && !r.timers[0].at.After(now) {
		e := heap.Pop(&r.timers).(timerEntry)
		if h := e.it.held; h != nil {
			l := e.it.lane
			if l.dropped || l.releasing || l.held[h.seq] != h {
				continue
			}
			r.loads = append(r.loads, store.LoadReq{Lane: l.id, Fence: l.fence, Seqs: []int64{h.seq}})
			r.fetch.want = true
			continue
		}
		e.it.deferred = false
		r.ready = append(r.ready, e.it)
	}
}
