package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/wharfhq/wharf"
)

// steadySpec is one steady run.
type steadySpec struct {
	schema string
	rate   float64
	label  string
	// p99Bound is the latency bound in ms (0: not judged) and p99Basis
	// where it comes from.
	p99Bound float64
	p99Basis string
	// perSecond judges the median of the window's per-second p99s instead
	// of the window's p99 (the sweep: its bound comes from another run's
	// median, and a stall of a second must not decide a verdict).
	perSecond bool
	// drainAll waits for the relays to empty the outbox whatever the
	// verdict, so that the next run starts from an empty outbox (sweep).
	drainAll bool
}

// trackerHook, when set (by tests), is given each steady run's tracker.
var trackerHook func(*tracker)

// drainAllWait bounds how long a sweep waits for the relays to work off an
// unsustainable step's backlog before it empties the outbox itself (a
// variable for the tests).
var drainAllWait = 2 * time.Minute

// steadyMode is --mode steady: the insert limit first when asked for, then
// one steady run.
func (e *env) steadyMode(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	lim, err := e.loadLimits(ctx, schema)
	if err != nil {
		return nil, err
	}
	res, err := e.steady(ctx, e.rateSpec(schema, "steady"))
	if err != nil {
		return nil, err
	}
	if lim != nil {
		lim.fractions(res.ProducerRate, 0)
		res.Limits = lim
		limitNotes(res, o)
	}
	return res, nil
}

// loadLimits measures the limits a steady run or a sweep compares with when
// --limits is given (nil otherwise): the insert limit, and for an outbox in
// WAL mode the emit limit as well.
func (e *env) loadLimits(ctx context.Context, schema string) (*Limits, error) {
	if !e.o.Limits {
		return nil, nil
	}
	rate, err := e.insertLimit(ctx, schema)
	if err != nil {
		return nil, err
	}
	lim := &Limits{InsertRate: rate}
	if e.wal() {
		if lim.EmitRate, lim.EmitWALBytesPerMsg, err = e.emitLimit(ctx, schema); err != nil {
			return nil, err
		}
		lim.EmitPrefix = emitPrefix(schema)
	}
	return lim, nil
}

// rateSpec is the steady run of --rate, judged against --max-p99 when given;
// label names the mode in the progress line.
func (e *env) rateSpec(schema, label string) steadySpec {
	o := e.o
	sp := steadySpec{schema: schema, rate: float64(o.Rate), label: fmt.Sprintf("%s %d/s", label, o.Rate),
		p99Basis: "no lower rate to compare with (--max-p99 sets a bound)"}
	if o.MaxP99 > 0 {
		sp.p99Bound, sp.p99Basis = float64(o.MaxP99)/float64(time.Millisecond), "--max-p99"
	}
	return sp
}

// steady runs the producers at sp.rate for Warmup+Duration with the relays
// running, from a prepared outbox, and judges whether the rate is
// sustainable.
func (e *env) steady(ctx context.Context, sp steadySpec) (*Result, error) {
	o := e.o
	schema := sp.schema
	startState, err := e.prepare(ctx, schema)
	if err != nil {
		return nil, err
	}
	res := &Result{TargetRate: sp.rate, Relays: o.Relays, Start: &startState}
	pool, err := e.producerPool(ctx)
	if err != nil {
		return nil, err
	}
	poolClosed := false
	defer func() {
		if !poolClosed {
			pool.Close()
		}
	}()
	client, err := wharf.NewClient(nil, &wharf.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return nil, err
	}
	var backlogSeqs []int64
	var prefillRate float64
	if o.Backlog > 0 {
		if backlogSeqs, prefillRate, err = e.prefillBacklog(ctx, schema); err != nil {
			return nil, err
		}
	}
	backlog := int64(len(backlogSeqs))
	if e.wal() {
		if e.walStart, err = e.insertLSN(ctx); err != nil {
			return nil, err
		}
	}

	warmup := o.Warmup
	start := time.Now()
	tr := e.newTracker(start, warmup)
	tr.windowEnd = warmup + o.Duration
	tr.prefilled(backlogSeqs)
	if trackerHook != nil {
		trackerHook(tr)
	}
	var ptr *tracker
	if o.InProcess {
		ptr = tr
	}
	p := &producers{o: o, newWriter: wharfWriter(o, pool, client, ptr), measureFrom: start.Add(warmup)}
	r, err := e.startRelays(ctx, schema, tr, true)
	if err != nil {
		return nil, err
	}
	var sw *watch
	if ip, ok := r.(*inProcessRelay); ok {
		// The soak's readings of what the relay holds (WAL mode).
		m := ip.client.Metrics()
		e.heldBytes = m.WALHeldBytes.Load
		defer func() { e.heldBytes = nil }()
		sw = startWatch(ctx, start.Add(warmup), m, e.ctl, schema)
		defer func() {
			if sw != nil {
				_, _ = sw.finish()
			}
		}()
	}
	relaysStopped := false
	defer func() {
		if !relaysStopped {
			_ = e.stopRelays(r, res)
		}
	}()
	exited := r.exited()

	sm := newSampler(e, schema, start, tr, o.InProcess, sp.label)
	defer sm.stop()
	sm.produced = &p.produced
	sm.prefilled = backlog
	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	stopAt := start.Add(warmup + o.Duration)
	prodDone := make(chan error, 1)
	go func() { prodDone <- p.run(prodCtx, start, sp.rate, stopAt) }()
	defer func() {
		cancelProd()
		select {
		case <-prodDone:
		case <-time.After(30 * time.Second):
		}
	}()

	var warmC <-chan time.Time
	if warmup > 0 {
		wt := time.NewTimer(time.Until(start.Add(warmup)))
		defer wt.Stop()
		warmC = wt.C
	}
	// With the relay in this process the backlog costs nothing to read, so
	// the growth test gets a reading every 20 ms; relay processes' backlog is
	// read at each sample (a query), and so is a soak's (its run is long
	// enough for that to give the test hundreds of readings).
	var fineC <-chan time.Time
	if o.InProcess && o.Mode != ModeSoak { // a soak reads at each sample: 20 ms readings would grow its memory
		fine := time.NewTicker(20 * time.Millisecond)
		defer fine.Stop()
		fineC = fine.C
	}
	warmAt := -1.0 // seconds since start when the window began
	var warmProcessed int64
	var warm Sample // the window's first reading
	if warmup == 0 {
		sm.recording = true
		warmAt = 0
		warm = Sample{Produced: backlog, Backlog: backlog, Phase: "measure"}
	}
	phase := func() string {
		if sm.recording {
			return "measure"
		}
		return "warmup"
	}
	if err := sm.sample(ctx, phase()); err != nil {
		return nil, err
	}
	for producing := true; producing; {
		select {
		case <-fineC:
			if sm.recording {
				if _, _, err := sm.measure(ctx, "measure", false); err != nil {
					return nil, err
				}
			}
		case <-sm.C():
			if err := sm.sample(ctx, phase()); err != nil {
				return nil, err
			}
		case <-warmC:
			// The warm-up's end is the first reading of the window.
			sm.recording = true
			w, _, err := sm.measure(ctx, "measure", false)
			if err != nil {
				return nil, err
			}
			warmAt, warmProcessed, warm = w.Seconds, w.Processed, w
		case err := <-prodDone:
			prodDone <- nil // for the deferred wait
			if err != nil {
				return nil, fmt.Errorf("producer failed: %w", err)
			}
			producing = false
		case err := <-exited:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	stop, _, err := sm.measure(ctx, "measure", false) // the window's last reading
	if err != nil {
		return nil, err
	}
	if sw != nil {
		bounds := sw.stats.FetchSeconds.Bounds
		readings, err := sw.finish()
		sw = nil
		if err != nil {
			return nil, err
		}
		res.SlowSeconds, res.SlowSecondsTotal = slowSeconds(tr.secondsAcked(), float64(sp.rate), readings, bounds)
	}
	sm.recording = false
	if err := sm.sample(ctx, "measure"); err != nil {
		return nil, err
	}
	if warmAt < 0 { // the producers stopped before the warm-up ended
		warmAt, warmProcessed, warm = stop.Seconds, stop.Processed, stop
	}
	if o.Backlog > 0 {
		res.Overload = overload(backlog, prefillRate, warm, stop, sm.readY, tr, o.InProcess)
	}
	// The rates are over the planned window: producers start no batch after
	// stopAt, so what they fell behind is missing from the count, while a
	// last commit that returned a little late does not stretch the window.
	// The producers count from measureFrom on their own clock; the relay's
	// progress from the warm-up reading, which a busy database can delay:
	// each rate over its own window.
	if window := stopAt.Sub(p.measureFrom).Seconds(); window > 0 {
		res.ProducerRate = float64(p.inWindow.Load()) / window
	}
	if window := stopAt.Sub(start).Seconds() - warmAt; window > 0 {
		res.ProcessingRate = float64(stop.Processed-warmProcessed) / window
	}
	res.Messages = stop.Produced
	if e.wal() {
		// The relay has drained the outbox once the slot is confirmed
		// past the WAL the producers wrote.
		if e.walTarget, err = e.insertLSN(ctx); err != nil {
			return nil, err
		}
	}
	growth := TestGrowth(sm.readX, sm.readY, GrowthTolerance(sp.rate))
	res.BacklogGrowth = &growth
	res.BacklogSlope = growth.Slope
	res.BacklogAtStop = stop.Backlog

	// Tail: let the relays deliver what is left, so that the latency covers
	// every message, and time how long catching up takes.
	res.DrainSeconds = -1
	wait := o.TailWait
	if sp.drainAll {
		wait = max(wait, drainAllWait)
	}
	emptied, err := e.tail(ctx, sm, tr, backlog, p, r, wait, sp.drainAll, res)
	if err != nil {
		return nil, err
	}
	sm.progressDone()
	relaysStopped = true
	if err := e.stopRelays(r, res); err != nil {
		return nil, err
	}
	pool.Close()
	poolClosed = true
	switch {
	case sp.drainAll && !emptied && e.wal():
		// The relay could not work the backlog off in time: skip the rest
		// of the slot so that the next run starts from nothing.
		skipped, err := e.advanceSlot(ctx, schema)
		if err != nil {
			return nil, err
		}
		res.note("the relay had not confirmed the slot past the producers' WAL %s after they stopped (%d messages not acknowledged); the bench advanced the slot to the WAL position now, skipping %d bytes of WAL", wait, max(0, p.produced.Load()-tr.acked.Load()), skipped)
	case sp.drainAll && !emptied:
		// The relays could not work the backlog off in time: empty the
		// outbox so that the next run starts from nothing.
		if _, err := e.ctl.Exec(ctx, "DELETE FROM "+schema+".outbox"); err != nil {
			return nil, err
		}
		res.note("the relays had not emptied the outbox %s after the producers stopped; the bench deleted the rest", wait)
	}
	res.Samples = sm.samples
	if o.InProcess {
		res.Delivered = tr.acked.Load() - res.PoisonDeadLettered
		res.LatencyMS, res.Redelivered = tr.summary()
		if res.Overload != nil {
			res.Overload.BacklogProcessed = tr.backlogAcked.Load()
		}
		res.LatencyNote = "commit → sink ack: the producer records the time its Commit returned per message position, the in-process relay's probe sink the time the sink acknowledged; messages acknowledged during the warm-up are excluded"
		if res.PoisonDeadLettered > 0 {
			res.LatencyNote += "; dead-lettered poison messages are not counted (the messages of their keys that waited behind them are)"
		}
		if missing := res.Messages - tr.acked.Load(); missing > 0 {
			res.LatencyNote += fmt.Sprintf("; %d messages not acknowledged by the end are not counted", missing)
		}
	} else {
		res.LatencyNote = "n/a (relay processes cannot report acknowledgement times; run --relays 1 --in-process for latency)"
	}
	ev := Evidence{Target: sp.rate, ProducerRate: res.ProducerRate, Growth: growth, BacklogAtStop: res.BacklogAtStop,
		P99Bound: sp.p99Bound, P99Basis: sp.p99Basis}
	if lat := res.LatencyMS; lat != nil {
		ev.P99, ev.P99Stat = lat.P99, "p99"
		if sp.perSecond && lat.Seconds > 0 {
			ev.P99 = lat.P99PerSecond
			ev.P99Stat = fmt.Sprintf("median of the window's %d per-second p99s (whole window: p99 %.1f ms, max %.1f ms)", lat.Seconds, lat.P99, lat.Max)
		}
	}
	j := Judge(ev)
	res.Sustainable, res.VerdictReason, res.Criteria = j.Sustainable, j.Reason, j.Criteria
	if e.wal() {
		res.note("outbox in WAL mode: each enqueue call is one transactional logical decoding message; one relay, in this process, streams them from the replication slot %s. Every steady run starts from a drained outbox: the slot advanced to the WAL position (start.slot_lag_bytes is what it skipped, the earlier phases' WAL), VACUUM (ANALYZE) of the relays' tables (the outbox table stays empty), CHECKPOINT and a %s pause", schema, settle)
		res.note("the latency tracker keeps one entry per message enqueued and not yet acknowledged (WAL seqs are positions, not dense ids), registered before the producer's Commit; an acknowledgement that finds no entry counts as a redelivery; outbox_remaining is always 0 (no rows): messages minus delivered is what was not acknowledged")
	} else {
		res.note("every steady run starts from an empty outbox: the relays of the previous run emptied it, then VACUUM (ANALYZE) of the outbox and the relays' tables, REINDEX TABLE of the outbox (VACUUM leaves indexes at their high-water size, which slows the runs that follow a large backlog), CHECKPOINT and a %s pause", settle)
	}
	res.note("verdict: sustainable when the producers reached %.0f %% of the target, the backlog did not grow faster than max(%.0f msg/s, %.1f %% of the target) with %.0f %% confidence over the window (least-squares slope of block means, autocorrelation-corrected standard error, one-sided Student t test), the backlog at the producers' stop was at most %.0f s of load, and p99 commit → ack was at most --max-p99 when given (steady) or, in a sweep, the median of the window's per-second p99s at most max(%.0f ms, %.0f × the same median at the highest passing lower rate) where there is one",
		100*MinProducerFraction, MinGrowthTolerance, 100*GrowthToleranceFraction, 100*GrowthConfidence, MaxBacklogSeconds, ms(e.o.P99Floor), P99Factor)
	res.note("backlog is produced minus acknowledged (in-process relay, read every 20 ms) or the outbox's row count (relay processes, read at each sample)")
	res.note("producer_rate is the messages of the batches due after the warm-up, committed, over the planned window (batch i is due at start + i*batch/rate; no batch starts after the planned stop, so a producer that fell behind comes short)")
	res.note("drain_seconds is the time from the producers' stop until the relays caught up (-1: not within --tail-wait)")
	res.note("wal_bytes_per_msg and commits_per_msg cover the inserts and the relays' work together")
	if startState.Note != "" {
		res.note("%s", startState.Note)
	}
	if o.Backlog > 0 {
		overloadNote(res, o)
	}
	if err := e.finish(ctx, res, schema, before, res.Messages); err != nil {
		return nil, err
	}
	if !o.InProcess {
		res.Delivered = res.Messages - res.OutboxRemaining
	}
	return res, nil
}

// tail waits up to wait for the relays to deliver what the producers
// enqueued (and, with untilEmpty, for the outbox to be empty), sampling
// meanwhile. It reports whether the outbox is known to be empty.
func (e *env) tail(ctx context.Context, sm *sampler, tr *tracker, prefilled int64, p *producers, r relays, wait time.Duration, untilEmpty bool, res *Result) (bool, error) {
	if wait <= 0 {
		return false, nil
	}
	o := e.o
	stopT := time.Now()
	tailEnd := time.NewTimer(wait)
	defer tailEnd.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	caughtUp, empty := false, false
	for !empty && (!caughtUp || untilEmpty) {
		select {
		case <-sm.C():
			if err := sm.sample(ctx, "tail"); err != nil {
				return false, err
			}
		case <-poll.C:
			var err error
			if !caughtUp && o.InProcess {
				caughtUp = tr.acked.Load() >= prefilled+p.produced.Load()
				if !caughtUp {
					continue
				}
			}
			if empty, err = e.drained(ctx, sm.schema); err != nil {
				return false, err
			}
			if empty && !caughtUp {
				caughtUp = true
			}
			if caughtUp && res.DrainSeconds < 0 {
				res.DrainSeconds = time.Since(stopT).Seconds()
			}
		case <-tailEnd.C:
			return false, sm.sample(ctx, "tail")
		case err := <-r.exited():
			return false, err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return empty, sm.sample(ctx, "tail")
}
