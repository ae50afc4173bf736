package wharf

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A relay is the delivery engine. One goroutine (run) owns every piece of
// state below; the fetcher, completer, sink workers, lease manager and listener
// are goroutines that only talk to it through channels, so there are no locks
// on the hot path. The data flow and the reasons are in docs/architecture.md.
type relay struct {
	cfg   Config
	pool  *pgxpool.Pool
	q     queries
	sink  Sink
	log   *slog.Logger
	st    *pgStore
	drain bool

	fetchReq  chan fetchRequest
	fetchRes  chan fetchResult
	sinkReq   chan *sinkBatch
	sinkRes   chan *sinkBatch
	opsReq    chan []op
	opsRes    chan opsResult
	leaseEv   chan leaseEvent
	releaseCh chan laneRelease
	wake      chan struct{}

	stopReq chan struct{} // graceful stop requested (closed once); never reassigned
	stopMu  sync.Once
	hardCtx context.Context // cancelled on hard stop: aborts sinks and queries
	hardStp context.CancelFunc
	done    chan struct{}
	err     error

	// Engine state, owned by run.
	lanes      map[int16]*laneState
	ready      readyQueue
	timers     timerHeap
	buffered   int
	inflight   int // sink batches in flight
	fetching   bool
	wantFetch  bool
	lastFetch  time.Time
	emptyRun   int // consecutive empty fetches, for the idle backoff
	fetchErrs  int
	lastEmpty  bool
	uncovered  int // lanes nobody live owns, from the lease manager
	leaseSeen  bool
	prevXmax   string
	prevXip    []string
	pendingOps []op
	opsBusy    bool
	opsErrs    int
	opsRetryAt time.Time
	fetchRetry time.Time
	stopping   bool
	released   bool // set before the lease loop is told to end
	delivered  int64
	perKeyCap  int         // most messages a held key keeps in memory
	refills    []refillReq // refills to send with the next fetch
	refilling  int         // refills sent and not yet answered
	firstRows  time.Time   // when a fetch first returned rows (for drain stats)
}

type laneState struct {
	id         int16
	fence      int64
	leaseUntil time.Time
	cursor     int64
	limit      int
	keys       map[string]*keyQ
	retries    map[int64]retryInfo
	n          int // messages in memory for this lane
	inflight   int // messages of this lane at the sink
	pendingOps int // ops of this lane not yet written
	releasing  bool
	dropped    bool
}

type retryInfo struct {
	attempts int
	next     time.Time
}

type keyQ struct {
	key       string
	lane      *laneState
	msgs      []*msg // sorted by id; the head is the next to deliver
	busy      bool   // a run of this key is at the sink, or its head is being dead-lettered
	scheduled bool   // an entry for gen is in the ready queue or the timer heap
	gen       uint64
	// truncFrom, when non-zero, means rows of this key with id >= truncFrom
	// are not in memory (the key was held with too many messages behind it);
	// they are read again with a refill once the key drains.
	truncFrom int64
	refilling bool
}

type msg struct {
	Message
	lane     *laneState
	kq       *keyQ // nil for unkeyed messages
	due      time.Time
	attempts int  // failed attempts so far
	atSink   bool // in a batch handed to the sink
	dead     bool // its dead-letter move is being written
}

// newRelay wires a relay for client c; drain makes it stop once nothing is
// deliverable.
func newRelay(c *Client, sink Sink, drain bool) *relay {
	hardCtx, cancel := context.WithCancel(context.Background())
	r := &relay{
		cfg: c.cfg, pool: c.pool, q: c.q, sink: sink, log: c.cfg.Logger, drain: drain,
		st:        &pgStore{pool: c.pool, q: c.q, owner: c.cfg.RelayID},
		fetchReq:  make(chan fetchRequest),
		fetchRes:  make(chan fetchResult),
		sinkReq:   make(chan *sinkBatch),
		sinkRes:   make(chan *sinkBatch, c.cfg.SinkConcurrency),
		opsReq:    make(chan []op),
		opsRes:    make(chan opsResult),
		leaseEv:   make(chan leaseEvent, 1),
		releaseCh: make(chan laneRelease, 64),
		wake:      make(chan struct{}, 1),
		stopReq:   make(chan struct{}),
		hardCtx:   hardCtx,
		hardStp:   cancel,
		done:      make(chan struct{}),
		lanes:     map[int16]*laneState{},
		prevXmax:  "0",
		perKeyCap: max(10, c.cfg.MaxBuffered/200),
		emptyRun:  64, // no activity seen yet: poll at PollInterval
	}
	return r
}

func (r *relay) requestStop() { r.stopMu.Do(func() { close(r.stopReq) }) }

// start launches the goroutines; they all end before r.done closes.
func (r *relay) start() {
	var wg sync.WaitGroup
	spawn := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	spawn(r.fetcher)
	spawn(r.completer)
	for i := 0; i < r.cfg.SinkConcurrency; i++ {
		spawn(r.sinkWorker)
	}
	leaseCtx, stopLease := context.WithCancel(r.hardCtx)
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); r.leaseLoop(leaseCtx) }()
	if !r.cfg.PollOnly {
		spawn(func() { r.listen(r.hardCtx) })
	}
	go func() {
		r.err = r.run()
		// Leases: hand lanes back only after every sink call has ended, so
		// no other relay delivers a key while this one still might.
		close(r.fetchReq)
		close(r.opsReq)
		close(r.sinkReq)
		// A hard stop may leave sink calls running: then the leases must
		// expire rather than be handed to another relay at once.
		r.released = r.hardCtx.Err() == nil
		stopLease()
		<-leaseDone
		r.hardStp()
		wg.Wait()
		close(r.done)
	}()
}

// run is the engine loop.
func (r *relay) run() error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stopReq := r.stopReq
	for {
		now := time.Now()
		r.fireTimers(now)
		r.maybeDispatch(now)
		r.maybeFlushOps(now)
		r.maybeFetch(now)
		if r.finished() {
			return nil
		}
		timer.Reset(r.nextWake(time.Now()))
		select {
		case res := <-r.fetchRes:
			r.onFetch(res)
		case b := <-r.sinkRes:
			r.onSink(b)
		case res := <-r.opsRes:
			r.onOps(res)
		case ev := <-r.leaseEv:
			r.onLease(ev)
		case <-r.wake:
			r.wantFetch = true
		case <-timer.C:
		case <-stopReq:
			r.beginStop()
			stopReq = nil
		case <-r.hardCtx.Done():
			return r.hardCtx.Err()
		}
	}
}

func (r *relay) beginStop() {
	if r.stopping {
		return
	}
	r.stopping = true
	r.log.Info("wharf: relay stopping: finishing in-flight deliveries", "in_flight_batches", r.inflight)
	// Buffered messages that are not at the sink stay in the outbox; the next
	// owner of each lane reads them again.
	for _, l := range r.lanes {
		r.dropBuffered(l)
	}
	r.ready = r.ready[:0]
	r.timers = r.timers[:0]
}

// finished reports whether run can return: on stop, once nothing is at the
// sink and every acknowledgement is written; in drain mode, once nothing is
// deliverable.
func (r *relay) finished() bool {
	// A fetch in flight must come back before run returns: the fetcher
	// would otherwise block handing over its result.
	idle := r.inflight == 0 && !r.opsBusy && len(r.pendingOps) == 0 && !r.fetching
	if r.stopping {
		return idle
	}
	if !r.drain || !idle || !r.lastEmpty || !r.leaseSeen || r.uncovered > 0 {
		return false
	}
	if len(r.lanes) == 0 {
		return false
	}
	if len(r.ready) > 0 || r.refilling > 0 {
		return false
	}
	if len(r.timers) > 0 && !r.timers[0].at.After(time.Now()) {
		return false
	}
	// A message waiting out a retry backoff is delivery still in progress;
	// only messages scheduled for later (deliver_at) may be left behind.
	for _, e := range r.timers {
		if e.it.retrying() {
			return false
		}
	}
	attrs := []any{"delivered", r.delivered}
	if !r.firstRows.IsZero() && r.delivered > 0 {
		d := time.Since(r.firstRows)
		attrs = append(attrs, "seconds", d.Seconds(), "msgs_per_sec", int64(float64(r.delivered)/d.Seconds()))
	}
	r.log.Info("wharf: drained: nothing deliverable is left", attrs...)
	return true
}

// pollWait is how long to wait after the last fetch before polling again.
// Right after a fetch returned rows, more are likely on their way (producers
// commit between fetches), so the wait starts at 2 ms and doubles with each
// empty fetch up to PollInterval: low latency under load, cheap when idle. A
// relay that has seen no rows yet polls at PollInterval.
func (r *relay) pollWait() time.Duration {
	d := 2 * time.Millisecond
	for i := 1; i < r.emptyRun && d < r.cfg.PollInterval; i++ {
		d *= 2
	}
	return min(d, r.cfg.PollInterval)
}

func (r *relay) nextWake(now time.Time) time.Duration {
	d := r.pollWait() - now.Sub(r.lastFetch)
	if len(r.timers) > 0 {
		if t := r.timers[0].at.Sub(now); t < d {
			d = t
		}
	}
	for _, at := range []time.Time{r.opsRetryAt, r.fetchRetry} {
		if !at.IsZero() && at.Sub(now) < d {
			d = at.Sub(now)
		}
	}
	if r.drain && d > 100*time.Millisecond {
		d = 100 * time.Millisecond
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

// ---- lanes and leases ----

func (r *relay) onLease(ev leaseEvent) {
	r.leaseSeen = true
	r.uncovered = ev.uncovered
	for _, lane := range ev.lost {
		if l := r.lanes[lane]; l != nil {
			r.log.Warn("wharf: lost lane lease; dropping its in-memory work", "lane", lane)
			r.dropLane(l)
		}
	}
	for _, lane := range ev.renewed {
		if l := r.lanes[lane]; l != nil {
			l.leaseUntil = ev.until
		}
	}
	for _, a := range ev.acquired {
		if r.stopping {
			r.releaseCh <- laneRelease{lane: a.lane, fence: a.fence}
			continue
		}
		r.lanes[a.lane] = &laneState{
			id: a.lane, fence: a.fence, leaseUntil: ev.until, keys: map[string]*keyQ{},
			retries: a.retries, limit: r.baseLimit(),
		}
		r.wantFetch = true
	}
	for _, lane := range ev.release {
		if l := r.lanes[lane]; l != nil && !l.releasing {
			l.releasing = true
			r.dropBuffered(l)
			r.maybeRelease(l)
		}
	}
	if len(ev.acquired) > 0 || len(ev.lost) > 0 || len(ev.release) > 0 {
		r.log.Debug("wharf: lanes changed", "owned", len(r.lanes), "acquired", len(ev.acquired), "lost", len(ev.lost), "releasing", len(ev.release))
	}
}

func (r *relay) baseLimit() int {
	n := len(r.lanes) + 1
	lim := r.cfg.FetchBatch / n
	if lim < 16 {
		lim = 16
	}
	return lim
}

// dropBuffered forgets the lane's messages that are neither at the sink nor
// being dead-lettered; they stay in the outbox for whoever reads the lane next.
// Entries already in the ready queue or timer heap are skipped at dispatch
// because the lane is releasing or the relay is stopping.
func (r *relay) dropBuffered(l *laneState) {
	held := l.inflight
	for k, kq := range l.keys {
		if !kq.busy {
			delete(l.keys, k)
			continue
		}
		kept := kq.msgs[:0]
		for _, m := range kq.msgs {
			if m.atSink || m.dead {
				kept = append(kept, m)
				if !m.atSink {
					held++
				}
			}
		}
		clear(kq.msgs[len(kept):])
		kq.msgs = kept
		kq.gen++
		kq.scheduled = false
	}
	r.buffered -= l.n - held
	l.n = held
}

func (r *relay) dropLane(l *laneState) {
	l.dropped = true
	r.buffered -= l.n
	l.n = 0
	delete(r.lanes, l.id)
}

// maybeRelease hands a releasing lane back once nothing of it is at the sink
// or waiting to be written.
func (r *relay) maybeRelease(l *laneState) {
	if !l.releasing || l.dropped || l.inflight > 0 || l.pendingOps > 0 {
		return
	}
	r.dropLane(l)
	r.releaseCh <- laneRelease{lane: l.id, fence: l.fence}
}

// leaseOK reports whether the lane may hand messages to the sink: its lease
// must outlive a safety margin, so a relay that was paused past its lease
// stops delivering before another owner can start.
func (r *relay) leaseOK(l *laneState, now time.Time) bool {
	margin := r.cfg.LeaseTTL / 5
	return !l.dropped && !l.releasing && now.Add(margin).Before(l.leaseUntil)
}

// ---- fetching ----

func (r *relay) maybeFetch(now time.Time) {
	if r.fetching || r.stopping || len(r.lanes) == 0 || now.Before(r.fetchRetry) {
		return
	}
	if !r.wantFetch && now.Sub(r.lastFetch) < r.pollWait() {
		return
	}
	full := r.buffered+r.cfg.FetchBatch > r.cfg.MaxBuffered
	if full && len(r.refills) == 0 {
		return
	}
	for i := range r.refills {
		// The upper bound is the cursor now, not when the refill was asked
		// for: a fetch that completed in between may have advanced it past
		// rows of the key that were dropped as truncated.
		if l := r.lanes[r.refills[i].lane]; l != nil {
			r.refills[i].to = l.cursor
		}
	}
	req := fetchRequest{prevXmax: r.prevXmax, prevXip: r.prevXip, refills: r.refills, refillLimit: r.perKeyCap}
	r.refills = nil
	total := 0
	for _, l := range r.lanes {
		if l.releasing {
			continue
		}
		req.lanes = append(req.lanes, l.id)
		req.cursors = append(req.cursors, l.cursor)
		req.limits = append(req.limits, int32(l.limit))
		req.fences = append(req.fences, l.fence)
		total += l.limit
	}
	if len(req.lanes) == 0 {
		return
	}
	if total > r.cfg.FetchBatch {
		// Hot lanes asked for more than a batch: scale every lane down.
		for i := range req.limits {
			req.limits[i] = int32(max(1, int(req.limits[i])*r.cfg.FetchBatch/total))
		}
	}
	if full {
		// Only the refills (and late commits, which are never skipped).
		clear(req.limits)
	}
	r.fetching = true
	r.wantFetch = false
	r.lastFetch = now
	r.fetchReq <- req
}

func (r *relay) onFetch(res fetchResult) {
	r.fetching = false
	if res.err != nil {
		r.fetchErrs++
		d := backoff(r.fetchErrs, 100*time.Millisecond, 5*time.Second)
		r.fetchRetry = time.Now().Add(d)
		r.log.Error("wharf: fetch failed; retrying", "err", res.err, "retry_in", d.Round(time.Millisecond))
		return
	}
	r.fetchErrs = 0
	r.fetchRetry = time.Time{}
	r.prevXmax, r.prevXip = res.xmax, res.xip
	now := time.Now()
	r.applyRefills(res, now)
	forward := make(map[int16]int, len(res.req.lanes))
	for i := range res.rows {
		row := &res.rows[i]
		l := r.lanes[row.lane]
		if l == nil || l.releasing || l.fence != res.fenceOf(row.lane) {
			continue // the lane changed hands while the fetch ran
		}
		if row.ID > l.cursor {
			forward[row.lane]++
		}
		r.insert(l, row, now)
	}
	for i, lane := range res.req.lanes {
		l := r.lanes[lane]
		if l == nil || l.fence != res.req.fences[i] {
			continue
		}
		lim := int(res.req.limits[i])
		if got := forward[lane]; got >= lim {
			l.limit = min(2*l.limit, r.cfg.FetchBatch)
		} else {
			l.limit = max(r.baseLimit()/4, min(l.limit, 2*got+16))
		}
		// The cursor moves only now, after every row was inserted, so the
		// straggler rows (ids <= cursor) were told apart above.
		for j := range res.rows {
			if res.rows[j].lane == lane && res.rows[j].ID > l.cursor {
				l.cursor = res.rows[j].ID
			}
		}
	}
	r.lastEmpty = len(res.rows) == 0
	if r.lastEmpty {
		r.emptyRun++
	} else {
		r.emptyRun = 0
	}
	if len(res.rows) > 0 {
		r.wantFetch = true
		if r.firstRows.IsZero() {
			r.firstRows = res.started
		}
	}
}

// applyRefills inserts the rows read again for truncated keys. It runs
// before the round's forward rows, so a key whose refill came back short is no
// longer truncated when its newer rows are inserted.
func (r *relay) applyRefills(res fetchResult, now time.Time) {
	r.refilling -= len(res.req.refills)
	byKey := map[refillKey][]*fetchedRow{}
	for i := range res.refillRows {
		row := &res.refillRows[i]
		k := refillKey{row.lane, row.Key}
		byKey[k] = append(byKey[k], row)
	}
	for _, rf := range res.req.refills {
		l := r.lanes[rf.lane]
		if l == nil || l.fence != rf.fence {
			continue
		}
		kq := l.keys[rf.key]
		if kq == nil {
			continue
		}
		kq.refilling = false
		rows := byKey[refillKey{rf.lane, rf.key}]
		r.log.Debug("wharf: refill returned", "lane", rf.lane, "key", rf.key, "rows", len(rows))
		if len(rows) >= res.req.refillLimit {
			kq.truncFrom = rows[len(rows)-1].ID + 1
		} else {
			kq.truncFrom = 0
		}
		for _, row := range rows {
			r.insert(l, row, now)
		}
		r.settle(kq, now)
	}
}

func (r *relay) insert(l *laneState, row *fetchedRow, now time.Time) {
	var kq *keyQ
	if row.Key != "" {
		kq = l.keys[row.Key]
		if kq != nil && kq.truncFrom > 0 && row.ID >= kq.truncFrom {
			return // behind a truncated key: its refill reads this row
		}
	}
	m := &msg{Message: row.Message, lane: l}
	if ri, ok := l.retries[m.ID]; ok {
		m.attempts = ri.attempts
		m.due = ri.next
		delete(l.retries, m.ID)
	}
	if m.DeliverAt.After(m.due) {
		m.due = m.DeliverAt
	}
	l.n++
	r.buffered++
	if m.Key == "" {
		r.schedule(readyItem{m: m}, m.due, now)
		return
	}
	if kq == nil {
		kq = &keyQ{key: m.Key, lane: l}
		l.keys[m.Key] = kq
	}
	m.kq = kq
	n := len(kq.msgs)
	if n == 0 || kq.msgs[n-1].ID < m.ID {
		kq.msgs = append(kq.msgs, m)
	} else {
		// A late commit below ids already buffered: keep id order.
		i := sort.Search(n, func(i int) bool { return kq.msgs[i].ID > m.ID })
		kq.msgs = append(kq.msgs, nil)
		copy(kq.msgs[i+1:], kq.msgs[i:])
		kq.msgs[i] = m
		if i == 0 && !kq.busy {
			kq.gen++
			kq.scheduled = false
		}
	}
	r.kick(kq, now)
}

// kick puts a key whose head may be deliverable into the ready queue, or into
// the timer heap when the head is not due yet.
func (r *relay) kick(kq *keyQ, now time.Time) {
	if kq.busy || kq.scheduled || len(kq.msgs) == 0 {
		return
	}
	if kq.msgs[0].due.After(now) {
		r.trim(kq)
	}
	kq.scheduled = true
	r.schedule(readyItem{kq: kq, gen: kq.gen}, kq.msgs[0].due, now)
}

// trim bounds the memory a held key (its head waits for a retry or its
// deliver_at) can take: messages past perKeyCap are forgotten and the key is
// marked truncated. Without this, one poison key with a steady stream of
// messages would fill MaxBuffered and pause fetching for every key.
func (r *relay) trim(kq *keyQ) {
	if kq.busy || len(kq.msgs) <= r.perKeyCap {
		return
	}
	cut := kq.msgs[r.perKeyCap:]
	for _, m := range cut {
		if m.atSink || m.dead {
			return
		}
	}
	if kq.truncFrom == 0 || cut[0].ID < kq.truncFrom {
		kq.truncFrom = cut[0].ID
	}
	r.log.Debug("wharf: held key truncated", "lane", kq.lane.id, "key", kq.key, "from", kq.truncFrom, "dropped", len(cut))
	n := len(cut)
	clear(cut)
	kq.msgs = kq.msgs[:r.perKeyCap]
	kq.lane.n -= n
	r.buffered -= n
}

// maybeRefill asks for the rows of a truncated key once its queue is short.
func (r *relay) maybeRefill(kq *keyQ) {
	l := kq.lane
	if kq.truncFrom == 0 || kq.refilling || len(kq.msgs) >= r.perKeyCap/2 || l.releasing || l.dropped || r.stopping {
		return
	}
	kq.refilling = true
	r.log.Debug("wharf: refilling truncated key", "lane", l.id, "key", kq.key, "from", kq.truncFrom)
	r.refilling++
	r.refills = append(r.refills, refillReq{lane: l.id, fence: l.fence, key: kq.key, from: kq.truncFrom})
	r.wantFetch = true
}

func (r *relay) schedule(it readyItem, due time.Time, now time.Time) {
	if due.After(now) {
		heap.Push(&r.timers, timerEntry{at: due, it: it})
		return
	}
	r.ready = append(r.ready, it)
}

func (r *relay) fireTimers(now time.Time) {
	for len(r.timers) > 0 && !r.timers[0].at.After(now) {
		e := heap.Pop(&r.timers).(timerEntry)
		r.ready = append(r.ready, e.it)
	}
}

// ---- dispatching ----

const maxRun = 100 // most messages of one key in one sink batch

func (r *relay) maybeDispatch(now time.Time) {
	for r.inflight < r.cfg.SinkConcurrency && len(r.ready) > 0 && !r.stopping {
		b := &sinkBatch{}
		var deferred []readyItem
		for len(r.ready) > 0 && len(b.msgs) < r.cfg.SinkBatch {
			it := r.ready[0]
			r.ready[0] = readyItem{}
			r.ready = r.ready[1:]
			if it.m != nil {
				m := it.m
				if m.lane.dropped || m.lane.releasing {
					continue
				}
				if !r.leaseOK(m.lane, now) {
					deferred = append(deferred, it)
					continue
				}
				r.add(b, m)
				continue
			}
			kq := it.kq
			if it.gen != kq.gen || !kq.scheduled {
				continue // superseded entry
			}
			kq.scheduled = false
			if len(kq.msgs) == 0 || kq.busy {
				continue
			}
			l := kq.msgs[0].lane
			if l.dropped || l.releasing {
				continue
			}
			if !r.leaseOK(l, now) {
				kq.scheduled = true
				deferred = append(deferred, it)
				continue
			}
			if kq.msgs[0].due.After(now) {
				r.kick(kq, now)
				continue
			}
			kq.busy = true
			for i, m := range kq.msgs {
				if i >= maxRun || m.due.After(now) {
					break
				}
				r.add(b, m)
			}
		}
		for _, it := range deferred {
			// Lease about to expire: wait for the renewal, then retry.
			heap.Push(&r.timers, timerEntry{at: now.Add(100 * time.Millisecond), it: it})
		}
		if len(b.msgs) == 0 {
			return
		}
		r.inflight++
		r.sinkReq <- b
	}
}

func (r *relay) add(b *sinkBatch, m *msg) {
	m.atSink = true
	m.Attempt = m.attempts + 1
	m.lane.inflight++
	b.msgs = append(b.msgs, m)
	b.pub = append(b.pub, &m.Message)
}

func (r *relay) onSink(b *sinkBatch) {
	r.inflight--
	now := time.Now()
	failedKeys := map[*keyQ]bool{}
	touched := map[*keyQ]bool{}
	for i, m := range b.msgs {
		m.atSink = false
		l := m.lane
		l.inflight--
		var err error
		if b.errs != nil {
			err = b.errs[i]
		}
		if l.dropped {
			continue
		}
		if m.kq != nil {
			touched[m.kq] = true
		}
		switch {
		case err == nil:
			r.enqueueOp(op{kind: opAck, m: m})
			if m.kq != nil {
				m.kq.remove(m)
			}
		case m.kq != nil && failedKeys[m.kq]:
			// Behind a failed message of its key: not attempted, stays queued.
		default:
			if m.kq != nil {
				failedKeys[m.kq] = true
			}
			r.fail(m, err, now)
		}
	}
	for kq := range touched {
		if len(kq.msgs) > 0 && kq.msgs[0].dead {
			continue // stays busy until the dead-letter move is written
		}
		kq.busy = false
		r.settle(kq, now)
	}
	for _, m := range b.msgs {
		r.maybeRelease(m.lane)
	}
}

// settle forgets an emptied key queue or makes its next message deliverable.
func (r *relay) settle(kq *keyQ, now time.Time) {
	l := kq.lane
	r.maybeRefill(kq)
	if len(kq.msgs) == 0 {
		if l.keys[kq.key] == kq && kq.truncFrom == 0 {
			delete(l.keys, kq.key)
		}
		return
	}
	if !l.releasing && !l.dropped && !r.stopping {
		r.kick(kq, now)
	}
}

func (q *keyQ) remove(m *msg) {
	for i, x := range q.msgs {
		if x == m {
			copy(q.msgs[i:], q.msgs[i+1:])
			q.msgs[len(q.msgs)-1] = nil
			q.msgs = q.msgs[:len(q.msgs)-1]
			return
		}
	}
}

func (r *relay) fail(m *msg, err error, now time.Time) {
	m.attempts++
	if IsPermanent(err) || m.attempts >= r.cfg.MaxAttempts {
		r.log.Warn("wharf: message moves to dead letters", "id", m.ID, "topic", m.Topic, "key", m.Key, "attempts", m.attempts, "err", err)
		m.dead = true
		r.enqueueOp(op{kind: opDead, m: m, err: err.Error(), attempts: m.attempts})
		return
	}
	d, ok := retryDelay(err)
	if !ok {
		d = backoff(m.attempts, r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff)
	}
	m.due = now.Add(d)
	r.log.Info("wharf: delivery failed; will retry", "id", m.ID, "key", m.Key, "attempt", m.attempts, "retry_in", d.Round(time.Millisecond), "err", err)
	r.enqueueOp(op{kind: opRetry, m: m, err: err.Error(), attempts: m.attempts, nextAt: m.due})
	if m.kq == nil && !m.lane.releasing && !r.stopping {
		r.schedule(readyItem{m: m}, m.due, now)
	}
}

// backoff is exponential with equal jitter: half the delay is fixed, half random.
func backoff(attempt int, base, maxD time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	if d > maxD {
		d = maxD
	}
	return d/2 + rand.N(d/2+1)
}

// ---- completion (acks, retries, dead letters) ----

func (r *relay) enqueueOp(o op) {
	o.lane = o.m.lane.id
	o.fence = o.m.lane.fence
	o.m.lane.pendingOps++
	r.pendingOps = append(r.pendingOps, o)
}

func (r *relay) maybeFlushOps(now time.Time) {
	if r.opsBusy || len(r.pendingOps) == 0 || now.Before(r.opsRetryAt) {
		return
	}
	r.opsBusy = true
	ops := r.pendingOps
	r.pendingOps = nil
	r.opsReq <- ops
}

func (r *relay) onOps(res opsResult) {
	r.opsBusy = false
	if res.err != nil {
		r.opsErrs++
		d := backoff(r.opsErrs, 100*time.Millisecond, 5*time.Second)
		r.opsRetryAt = time.Now().Add(d)
		r.log.Error("wharf: writing delivery results failed; retrying", "err", res.err, "retry_in", d.Round(time.Millisecond))
		if r.hardCtx.Err() == nil {
			r.pendingOps = append(res.ops, r.pendingOps...)
		}
		return
	}
	r.opsErrs = 0
	r.opsRetryAt = time.Time{}
	now := time.Now()
	for _, o := range res.ops {
		l := o.m.lane
		l.pendingOps--
		if l.dropped {
			continue
		}
		if !res.valid[o.lane] {
			r.log.Warn("wharf: lane was taken over by another relay; its results were not written", "lane", o.lane)
			r.dropLane(l)
			continue
		}
		switch o.kind {
		case opAck:
			l.n--
			r.buffered--
			r.delivered++
		case opDead:
			l.n--
			r.buffered--
			if kq := o.m.kq; kq != nil {
				kq.remove(o.m)
				kq.busy = false
				r.settle(kq, now)
			}
		}
		r.maybeRelease(l)
	}
}

// ---- shutdown plumbing ----

func (r *relay) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.hardStp()
		<-r.done
		return fmt.Errorf("wharf: relay stopped before in-flight deliveries finished: %w", ctx.Err())
	}
}
