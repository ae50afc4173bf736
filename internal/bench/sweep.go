package bench

import (
	"context"
	"fmt"
	"math"
)

// Step roles.
const (
	RoleReference = "reference"
	RoleBisect    = "bisect"
	RoleConfirm   = "confirm"
)

// maxConfirmRounds bounds how often a sweep bisects again below a winner
// that failed a repeat; after that it steps down by SweepStepDown, confirming
// each step, until one holds.
const maxConfirmRounds = 3

// SweepStepDown is the factor a sweep lowers its winner by after
// maxConfirmRounds winners failed a repeat.
const SweepStepDown = 0.9

// SweepPrecision ends the bisection once the lowest failing rate is within
// this fraction above the highest passing one.
const SweepPrecision = 0.05

// sweep finds the highest sustainable rate between MinRate and MaxRate:
//
//  1. a reference run at MinRate (the latency reference of the runs above it;
//     if it fails, nothing higher is tried);
//  2. at most SweepSteps bisection runs between the highest passing and the
//     lowest failing rate, at their geometric mean (rates span decades; what
//     matters is the relative error), until they are within SweepPrecision;
//  3. Confirm repeats of the winner; if one fails, the winner becomes the
//     upper bound and the bisection resumes below it from the highest rate
//     that passed every run (at most maxConfirmRounds times; then the next
//     winner is 10 % below the failed one, and so on down, never below
//     the highest rate that passed every run).
//
// All runs share one outbox; each starts from it emptied, vacuumed,
// reindexed and checkpointed, so the order of the runs does not leak into
// their figures.
func (e *env) sweep(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	lim, err := e.loadLimits(ctx, schema)
	if err != nil {
		return nil, err
	}
	var steps []Step
	run := func(rate int, role string) (*Result, error) {
		sp := steadySpec{schema: schema, rate: float64(rate), drainAll: true,
			label: fmt.Sprintf("sweep %d: %d/s, %s", len(steps)+1, rate, role), perSecond: true}
		sp.p99Bound, sp.p99Basis = p99BoundFor(steps, rate, ms(o.P99Floor))
		r, err := e.runSteady(ctx, sp)
		if err != nil {
			return nil, fmt.Errorf("sweep run %d (%d msg/s): %w", len(steps)+1, rate, err)
		}
		st := Step{Rate: rate, Role: role, ProducerRate: r.ProducerRate, ProcessingRate: r.ProcessingRate,
			BacklogAtStop: r.BacklogAtStop, LatencyMS: r.LatencyMS, P99BoundMS: sp.p99Bound, Sustainable: r.Sustainable,
			Criteria: r.Criteria, VerdictReason: r.VerdictReason, DrainSeconds: r.DrainSeconds, Deadlocks: r.Deadlocks}
		if r.BacklogGrowth != nil {
			st.Growth = *r.BacklogGrowth
		}
		if r.Start != nil {
			st.Start = *r.Start
		}
		steps = append(steps, st)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "sweep %d: %d msg/s %s: %s\n", len(steps), rate, verdictWord(r.Sustainable), r.VerdictReason)
		}
		return r, nil
	}

	ref, err := run(o.MinRate, RoleReference)
	if err != nil {
		return nil, err
	}
	if !ref.Sustainable {
		return e.sweepResult(nil, 0, steps, lim,
			fmt.Sprintf("no rate was sustainable: the lowest, %d msg/s, failed (lower --min-rate)", o.MinRate)), nil
	}
	lo, hi := o.MinRate, o.MaxRate
	bisect := func() error {
		for range o.SweepSteps {
			rate := roundRate(int(math.Sqrt(float64(lo) * float64(hi))))
			if rate <= lo || rate >= hi || float64(hi) <= float64(lo)*(1+SweepPrecision) {
				return nil
			}
			r, err := run(rate, RoleBisect)
			if err != nil {
				return err
			}
			if r.Sustainable {
				lo = rate
			} else {
				hi = rate
			}
		}
		return nil
	}
	if err := bisect(); err != nil {
		return nil, err
	}
	candidate := lo
	for round := 1; ; round++ {
		var last *Result
		held := true
		for range o.Confirm {
			r, err := run(candidate, RoleConfirm)
			if err != nil {
				return nil, err
			}
			last = r
			if !r.Sustainable {
				held = false
				break
			}
		}
		if held {
			runs, detectable := 0, 0.0
			for _, s := range steps {
				if s.Rate == candidate {
					runs++
					detectable = math.Max(detectable, s.Growth.Detectable)
				}
			}
			above := "none was tried above it"
			if f := lowestFailAbove(steps, candidate); f > 0 {
				above = fmt.Sprintf("the next rate tried above it, %d msg/s, was not sustainable", f)
			}
			reason := fmt.Sprintf("highest sustainable rate %d msg/s, confirmed: all %d runs at it were sustainable (%d repeats); %s. Each run's growth test fails a backlog growing by %.0f msg/s or more with at least 95 %% probability, so a rate whose backlog grew that fast would pass all %d runs with probability below %.0e",
				candidate, runs, o.Confirm, above, detectable, runs, math.Pow(1-GrowthConfidence, float64(runs)))
			res := e.sweepResult(last, candidate, steps, lim, reason)
			res.ConfirmedRuns = runs
			return res, nil
		}
		// The winner failed a repeat: it bounds the search from above now,
		// and the search resumes below it from the highest rate that passed
		// every run: bisecting for maxConfirmRounds rounds, then stepping
		// down by SweepStepDown (not below that rate) and confirming each
		// step, so that a noisy boundary still ends in a confirmed rate.
		hi, lo = candidate, highestPassBelow(steps, candidate)
		if lo == 0 {
			return e.sweepResult(nil, 0, steps, lim,
				fmt.Sprintf("no rate was confirmed: %d msg/s failed a repeat, and every rate below it failed at least one run", candidate)), nil
		}
		if round < maxConfirmRounds {
			if err := bisect(); err != nil {
				return nil, err
			}
			candidate = lo
		} else {
			candidate = stepDown(steps, candidate, lo)
		}
	}
}

func (e *env) sweepResult(best *Result, rate int, steps []Step, lim *Limits, reason string) *Result {
	res := best
	if res == nil {
		res = &Result{Relays: e.o.Relays}
	}
	res.TargetRate = float64(rate)
	res.Sustainable = best != nil
	res.VerdictReason = reason
	res.Steps = steps
	if lim != nil {
		if best != nil {
			lim.fractions(float64(rate), 0)
		}
		res.Limits = lim
		limitNotes(res, e.o)
	}
	if e.wal() {
		res.note("sweep: the figures other than steps come from the last confirming run; every run starts from a drained WAL outbox: its slot advanced to the WAL position, the relays' tables vacuumed, a CHECKPOINT")
	} else {
		res.note("sweep: the figures other than steps come from the last confirming run; every run starts from an emptied, vacuumed, reindexed and checkpointed outbox")
	}
	return res
}

// p99BoundFor is the latency bound of a run at rate: from the highest
// passing run below it, on the same statistic (the median of the per-second
// p99s).
func p99BoundFor(steps []Step, rate int, floorMS float64) (float64, string) {
	var ref *Step
	for i := range steps {
		s := &steps[i]
		if s.Sustainable && s.Rate < rate && s.LatencyMS != nil && s.LatencyMS.Seconds > 0 && (ref == nil || s.Rate >= ref.Rate) {
			ref = s
		}
	}
	if ref == nil {
		return 0, "no lower rate to compare with"
	}
	p := ref.LatencyMS.P99PerSecond
	return P99Bound(p, floorMS), fmt.Sprintf("max(%.0f ms, %.0f × %.1f ms, the same median at %d msg/s)", floorMS, P99Factor, p, ref.Rate)
}

// stepDown is the next winner to confirm below a failed one: SweepStepDown
// of it, lower again while a run at that rate already failed (a confirmed
// rate is one at which every run passed), and never below lo, the highest
// rate that passed every run.
func stepDown(steps []Step, failed, lo int) int {
	next := roundRate(int(SweepStepDown * float64(failed)))
	for next > lo && failedAt(steps, next) {
		next = roundRate(int(SweepStepDown * float64(next)))
	}
	return max(lo, next)
}

func failedAt(steps []Step, rate int) bool {
	for _, s := range steps {
		if s.Rate == rate && !s.Sustainable {
			return true
		}
	}
	return false
}

// highestPassBelow is the highest rate below rate that passed every run at
// it, or 0.
func highestPassBelow(steps []Step, rate int) int {
	failed := map[int]bool{}
	for _, s := range steps {
		if !s.Sustainable {
			failed[s.Rate] = true
		}
	}
	best := 0
	for _, s := range steps {
		if s.Rate < rate && !failed[s.Rate] && s.Rate > best {
			best = s.Rate
		}
	}
	return best
}

// lowestFailAbove is the lowest rate above rate that failed, or 0.
func lowestFailAbove(steps []Step, rate int) int {
	best := 0
	for _, s := range steps {
		if !s.Sustainable && s.Rate > rate && (best == 0 || s.Rate < best) {
			best = s.Rate
		}
	}
	return best
}

// roundRate rounds rates above 1000 msg/s to a hundred.
func roundRate(rate int) int {
	if rate > 1000 {
		return int(math.Round(float64(rate)/100) * 100)
	}
	return rate
}

func verdictWord(ok bool) string {
	if ok {
		return "sustainable"
	}
	return "NOT sustainable"
}
