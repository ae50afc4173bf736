package wharf

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/wharfhq/wharf/internal/backoff"
	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/internal/tablestore"
	"github.com/wharfhq/wharf/internal/walstore"
)

// A relay is the delivery engine. One goroutine (run) owns every piece of
// state below; the fetcher, completer, sink workers, lease manager and listener
// are goroutines that only talk to it through channels, so there are no locks
// on the hot path. The data flow and the reasons are in docs/architecture.md;
// the engine state (which event changes which field) in its "Engine state"
// section.
//
// Files: relay.go (state, loop, stop), relay_lanes.go (leases), relay_fetch.go
// (reading), relay_keys.go (per-key queues and held messages),
// relay_dispatch.go (batches to sinks and their results), relay_complete.go
// (result writes), relay_workers.go (the goroutines and the timer heap).
type relay struct {
	cfg   Config
	st    store.Store
	log   *slog.Logger
	stats *Stats
	drain bool
	sinks []*sinkSlot
	route func(topic string) int // index into sinks; nil with one sink

	fetchReq  chan store.FetchRequest
	fetchRes  chan store.FetchResult
	sinkRes   chan *sinkBatch
	opsReq    chan []store.Op
	opsRes    chan store.OpsResult
	leaseEv   chan leaseEvent
	releaseCh chan store.LaneRelease
	wake      chan struct{}

	stopReq chan struct{} // graceful stop requested (closed once); never reassigned
	stopMu  sync.Once
	hardCtx context.Context  // cancelled on hard stop: aborts sinks and queries
	epoch   time.Time        // monotonic reference of the sink calls' lease checks
	now     func() time.Time // the clock (Config.clock)
	hardStp context.CancelFunc
	done    chan struct{}
	err     error
	fatal   error // set by the engine to end the relay with an error

	// Engine state, owned by run.
	lanes     map[int16]*laneState
	ready     []readyItem
	timers    timerHeap
	mem       memUse // loaded messages (with their payloads)
	stubs     int    // held messages kept as positions only
	fetch     fetchState
	ops       opsState
	loads     []store.LoadReq   // loads to send with the next fetch
	refills   []store.RefillReq // refills to send with the next fetch
	loading   int               // loads and refills sent and not yet answered
	leaseSeen bool
	uncovered int // lanes nobody live owns, from the lease manager
	stopping  bool
	delivered int64
	firstRows time.Time     // when a fetch first returned rows (for drain stats)
	skew      time.Duration // database clock - this process's, at the round trip's midpoint
	skewLow   time.Duration // the least it can be: the database read its clock before the reply
	zombies   map[int16]int // messages still at a sink of lanes this relay lost
	failLog   failLog
	outage    outageLog // database failures and lease losses, for one line each way

	perKeyCap  int   // most loaded messages of one key; the rest are positions
	maxStubs   int   // most positions held in all; beyond, a key is truncated
	fetchBytes int64 // payload bytes one fetch may bring
}

type memUse struct {
	msgs  int
	bytes int64
}

type fetchState struct {
	busy      bool
	want      bool
	last      time.Time
	emptyRun  int // consecutive empty fetches, for the idle backoff
	lastEmpty bool
	behind    bool // the last fetch showed a backlog (see onFetch): read again at once
	retry     backoff.State
	pos       store.Pos
}

type opsState struct {
	pending []store.Op
	spare   []store.Op // the last written batch's slice, emptied, for the next batch
	busy    bool
	retry   backoff.State
	acks    int       // acknowledgements among pending
	since   time.Time // when pending last became non-empty
}

// opsLinger is how long results without an acknowledgement among them
// (retry records, dead-letter moves) wait for more to share their write.
// A failing message's retries come back from the sink one at a time, between
// the bursts of acknowledgements each fetch brings; written at once, each
// took a transaction (and a WAL flush) of its own: with 1 % poison messages,
// 60 % more write transactions at 25k msg/s. The message is held for its
// backoff anyway, and a dead letter's key waits this much longer at most.
const opsLinger = 10 * time.Millisecond

// failLog turns per-message failures into one warning per interval: an
// outage fails thousands of messages, and keys may be personal data.
type failLog struct {
	since time.Time // last warning
	n     int       // failures since
}

// newRelay wires a relay for client c; drain makes it stop once nothing is
// deliverable; wal makes it read an outbox in WAL mode, from the logical
// replication slot named after the schema.
func newRelay(c *Client, sinks []Sink, route func(string) int, drain, wal bool) *relay {
	hardCtx, cancel := context.WithCancel(context.Background())
	total := 0
	r := &relay{
		cfg: c.cfg, log: c.cfg.Logger, stats: c.stats, drain: drain, route: route,
		now:        c.cfg.clock,
		fetchReq:   make(chan store.FetchRequest),
		fetchRes:   make(chan store.FetchResult),
		opsReq:     make(chan []store.Op),
		opsRes:     make(chan store.OpsResult),
		leaseEv:    make(chan leaseEvent, 1),
		releaseCh:  make(chan store.LaneRelease, 64),
		wake:       make(chan struct{}, 1),
		stopReq:    make(chan struct{}),
		hardCtx:    hardCtx,
		epoch:      c.cfg.clock(),
		hardStp:    cancel,
		done:       make(chan struct{}),
		lanes:      map[int16]*laneState{},
		zombies:    map[int16]int{},
		perKeyCap:  min(2*maxRun, max(10, c.cfg.MaxBuffered/20)),
		maxStubs:   max(100_000, 50*c.cfg.MaxBuffered),
		fetchBytes: max(1, c.cfg.MaxBufferedBytes/4),
	}
	table := tablestore.New(tablestore.Config{Pool: c.pool, Schema: c.cfg.Schema, RelayID: c.cfg.RelayID, Logger: c.cfg.Logger, Now: c.cfg.clock})
	r.st = table
	if wal {
		// One stream per slot: the relay holds every lane or none.
		r.st = walstore.New(walstore.Config{
			Table: table, Pool: c.pool, Schema: c.cfg.Schema, RelayID: c.cfg.RelayID,
			Logger: c.cfg.Logger, Now: c.cfg.clock, Budget: c.cfg.MaxBufferedBytes, SpillAfter: c.cfg.walSpillAfter,
			Gauges: walstore.Gauges{HeldBytes: &c.stats.WALHeldBytes, LagBytes: &c.stats.WALLagBytes, Lag: &c.stats.WALLag,
				SlotGone: &c.stats.WALSlotGone},
		})
		r.cfg.Exclusive = true
	}
	names := make([]string, len(sinks))
	for i, s := range sinks {
		names[i] = sinkName(s)
	}
	for i, st := range c.stats.setSinks(names) {
		r.sinks = append(r.sinks, &sinkSlot{sink: sinks[i], req: make(chan *sinkBatch), stats: st})
		total += c.cfg.SinkConcurrency
	}
	r.sinkRes = make(chan *sinkBatch, total)
	r.fetch.emptyRun = 64 // no activity seen yet: poll at PollInterval
	return r
}

func (r *relay) requestStop() { r.stopMu.Do(func() { close(r.stopReq) }) }

// start launches the goroutines; they all end before r.done closes.
func (r *relay) start() {
	var wg, sinkWG sync.WaitGroup
	spawn := func(wg *sync.WaitGroup, f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	spawn(&wg, r.fetcher)
	spawn(&wg, r.completer)
	for _, s := range r.sinks {
		for i := 0; i < r.cfg.SinkConcurrency; i++ {
			spawn(&sinkWG, func() { r.sinkWorker(s) })
		}
	}
	leaseCtx, stopLease := context.WithCancel(context.Background())
	leaseDone := make(chan struct{})
	released := make(chan bool, 1)
	go func() { defer close(leaseDone); r.leaseLoop(leaseCtx, released) }()
	if !r.cfg.PollOnly {
		spawn(&wg, func() {
			r.st.Listen(r.hardCtx, func() {
				select {
				case r.wake <- struct{}{}:
				default:
				}
			})
		})
	}
	go func() {
		r.err = r.run()
		close(r.fetchReq)
		close(r.opsReq)
		for _, s := range r.sinks {
			close(s.req)
		}
		graceful := r.hardCtx.Err() == nil && r.fatal == nil
		if graceful {
			// Every sink call has returned and every result is written:
			// hand the lanes back so other relays take over at once.
			released <- true
			stopLease()
			<-leaseDone
			r.hardStp()
		} else {
			// Sink calls may still run: stop renewing at once, and hand
			// the lanes back only once every call has returned.
			released <- false
			stopLease()
			<-leaseDone
		}
		sinkWG.Wait()
		if !graceful {
			r.releaseAfterHardStop()
		}
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
		now := r.now()
		r.stats.LastLoop.Store(now.UnixNano())
		r.checkLeases(now)
		r.fireTimers(now)
		r.maybeDispatch(now)
		r.maybeFlushOps(now)
		r.maybeFetch(now)
		if r.fatal != nil {
			r.hardStp()
			return r.fatal
		}
		if r.finished() {
			return nil
		}
		timer.Reset(r.nextWake(r.now()))
		if checkInvariants {
			r.checkInvariants()
		}
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
			r.fetch.want = true
		case <-timer.C:
		case <-stopReq:
			r.beginStop()
			stopReq = nil
		case <-r.hardCtx.Done():
			return nil // a stop the caller asked for (StopAndCancel, Start's ctx)
		}
	}
}

func (r *relay) beginStop() {
	if r.stopping {
		return
	}
	r.stopping = true
	r.log.Info("wharf: relay stopping: finishing in-flight deliveries", "in_flight_batches", r.inflight())
	// Buffered messages that are not at the sink stay in the outbox; the next
	// owner of each lane reads them again.
	for _, l := range r.lanes {
		r.dropBuffered(l)
	}
	r.ready = r.ready[:0]
	r.timers = r.timers[:0]
	r.loads, r.refills = nil, nil
}

func (r *relay) inflight() int {
	n := 0
	for _, s := range r.sinks {
		n += s.inflight
	}
	return n
}

// finished reports whether run can return: on stop, once nothing is at the
// sink and every acknowledgement is written; in drain mode, once nothing is
// deliverable.
func (r *relay) finished() bool {
	// A fetch in flight must come back before run returns: the fetcher
	// would otherwise block handing over its result.
	idle := r.inflight() == 0 && !r.ops.busy && len(r.ops.pending) == 0 && !r.fetch.busy
	if r.stopping {
		return idle
	}
	if !r.drain || !idle || !r.fetch.lastEmpty || !r.leaseSeen || r.uncovered > 0 || len(r.lanes) == 0 {
		return false
	}
	if len(r.ready) > 0 || r.loading > 0 || len(r.loads) > 0 || len(r.refills) > 0 {
		return false
	}
	now := r.now()
	// A message waiting out a retry backoff, or deferred until its lane's
	// lease is renewed, is delivery still in progress; only messages
	// scheduled for later (deliver_at) may be left behind.
	for _, e := range r.timers {
		if !e.at.After(now) || e.it.pending() {
			return false
		}
	}
	for _, l := range r.lanes {
		if l.waitZombies {
			return false
		}
	}
	attrs := []any{"delivered", r.delivered}
	if !r.firstRows.IsZero() && r.delivered > 0 {
		d := r.now().Sub(r.firstRows)
		attrs = append(attrs, "seconds", d.Seconds(), "msgs_per_sec", int64(float64(r.delivered)/d.Seconds()))
	}
	r.log.Info("wharf: drained: nothing deliverable is left", attrs...)
	return true
}

// pollWait is how long to wait after the last fetch started before fetching
// again while no rows are expected (see fetchWait). Right after a fetch
// returned rows, more are likely on their way (producers commit between
// fetches), so the wait starts at FetchInterval and doubles with each empty
// fetch up to PollInterval: low latency under load, cheap when idle. A relay
// that has seen no rows yet polls at PollInterval.
func (r *relay) pollWait() time.Duration {
	d := r.cfg.FetchInterval
	for i := 1; i < r.fetch.emptyRun && d < r.cfg.PollInterval; i++ {
		d *= 2
	}
	return min(d, r.cfg.PollInterval)
}

// fetchWait is how long after the last fetch started the next one may start.
// When rows are expected (the last fetch returned some, a notification or a
// lane came) it is FetchInterval, or nothing when the relay is behind;
// otherwise the idle poll's wait.
func (r *relay) fetchWait() time.Duration {
	switch {
	case !r.fetch.want:
		return r.pollWait()
	case r.fetch.behind:
		return 0
	default:
		return r.cfg.FetchInterval
	}
}

func (r *relay) nextWake(now time.Time) time.Duration {
	d := r.fetchWait() - now.Sub(r.fetch.last)
	if len(r.timers) > 0 {
		d = min(d, r.timers[0].at.Sub(now))
	}
	if r.opsLingering() {
		d = min(d, r.ops.since.Add(opsLinger).Sub(now))
	}
	for _, at := range []time.Time{r.ops.retry.At, r.fetch.retry.At, r.leaseCheckAt()} {
		if !at.IsZero() {
			d = min(d, at.Sub(now))
		}
	}
	if r.drain {
		d = min(d, 100*time.Millisecond)
	}
	return max(d, time.Millisecond)
}

// toLocal converts a time of the database clock to the moment of this
// process's clock by which the database's has certainly reached it (with the
// least offset the last read allows): a message is never due early, by up to
// half a round trip as the midpoint would allow.
func (r *relay) toLocal(t time.Time) time.Time { return t.Add(-r.skewLow) }

// toDB converts a time of this process's clock to the database clock.
func (r *relay) toDB(t time.Time) time.Time { return t.Add(r.skew) }

// ---- shutdown plumbing ----

func (r *relay) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.hardStp()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			// A sink that ignores its context: return; the relay ends in
			// the background and its leases expire.
		}
		return fmt.Errorf("wharf: relay stopped before in-flight deliveries finished: %w", ctx.Err())
	}
}
