package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests need no database: they check the presentation, the sampler's
// merging and the sweep's search on made-up figures.

func TestTickLabelsAreDistinct(t *testing.T) {
	for _, maxV := range []float64{0.003, 0.2, 0.7, 1.3, 4.9, 5, 37, 180, 2500, 17500, 83200, 180000, 1.2e6} {
		for _, n := range []int{4, 8} {
			vals, step := ticks(maxV, n)
			require.GreaterOrEqual(t, vals[len(vals)-1], maxV*(1-1e-9), "the last tick covers the data")
			require.LessOrEqual(t, len(vals), n+2)
			seen := map[string]bool{}
			for _, v := range vals {
				l := tickLabel(v, step, vals[len(vals)-1])
				require.False(t, seen[l], "max %v: label %q repeated in %v", maxV, l, vals)
				seen[l] = true
			}
		}
	}
	require.Equal(t, "0.5k", tickLabel(500, 500, 2500))
	require.Equal(t, "1.0k", tickLabel(1000, 500, 2500))
	require.Equal(t, "20k", tickLabel(20000, 20000, 100000))
	require.Equal(t, "1.2M", tickLabel(1.2e6, 2e5, 1.2e6))
	require.Equal(t, "0.25", tickLabel(0.25, 0.05, 0.25))
}

func TestChartBreaksAtGaps(t *testing.T) {
	xs := []float64{0.1, 0.2, 0.3, 0.4, 5.1, 5.2, 5.3}
	ys := []float64{1, 2, 3, 4, 5, 6, 7}
	svg := string(lineChart("t", "u", xs, []series{{"a", "#000", ys}}))
	require.Equal(t, 2, strings.Count(svg, "<polyline"), "one line per sampled phase")
	// X labels: every one distinct.
	labels := regexp.MustCompile(`>([0-9.]+)s<`).FindAllStringSubmatch(svg, -1)
	seen := map[string]bool{}
	for _, l := range labels {
		require.False(t, seen[l[1]], "x label %s repeated", l[1])
		seen[l[1]] = true
	}
	require.GreaterOrEqual(t, len(labels), 4)
}

func TestApplicableSettings(t *testing.T) {
	o, err := Options{Mode: ModeDrain, DatabaseURL: "x"}.withDefaults()
	require.NoError(t, err)
	names := func(m Mode) string {
		o.Mode = m
		var out []string
		for _, s := range o.settings().Applicable() {
			out = append(out, s.Name)
		}
		return " " + strings.Join(out, " ") + " "
	}
	drain := names(ModeDrain)
	require.Contains(t, drain, " messages ")
	for _, n := range []string{"rate", "duration", "warmup", "producers", "min-rate", "tail-wait"} {
		require.NotContains(t, drain, " "+n+" ")
	}
	steady := names(ModeSteady)
	for _, n := range []string{"rate", "duration", "warmup", "producers", "producer-batch", "tail-wait"} {
		require.Contains(t, steady, " "+n+" ")
	}
	require.NotContains(t, steady, " messages ")
	require.NotContains(t, steady, " min-rate ")
	sweep := names(ModeSweep)
	for _, n := range []string{"min-rate", "max-rate", "sweep-steps", "confirm"} {
		require.Contains(t, sweep, " "+n+" ")
	}
	require.NotContains(t, sweep, " rate ")
	baseline := names(ModeBaseline)
	require.Contains(t, baseline, " duration ")
	require.NotContains(t, baseline, " warmup ")
	require.NotContains(t, baseline, " limits ", "baseline always measures the limits")
}

func TestSamplerMergesWhenTheSeriesGrowsLong(t *testing.T) {
	e := &env{o: Options{}}
	s := newSampler(e, "", time.Now(), nil, false, "test")
	defer s.stop()
	s.noRelay = true
	first := s.interval
	// 1,000 msg/s for 30 s, a sample every 100 ms.
	for i := 1; i <= 300; i++ {
		x := Sample{Seconds: float64(i) / 10, Produced: int64(i) * 100, Phase: "measure"}
		if len(s.samples) == 0 {
			s.prev = s.origin()
		}
		x.ProducedRate = float64(x.Produced-s.prev.Produced) / (x.Seconds - s.prev.Seconds)
		s.push(x, nil)
		s.prev = x
		if len(s.samples) > maxSamples {
			s.coarsen()
		}
	}
	require.LessOrEqual(t, len(s.samples), maxSamples)
	require.Greater(t, len(s.samples), maxSamples/2)
	require.Equal(t, 2*first, s.interval, "merging doubles the interval")
	for i, x := range s.samples {
		require.InDelta(t, 1000, x.ProducedRate, 1e-6, "sample %d", i)
		if i > 0 {
			require.Greater(t, x.Seconds, s.samples[i-1].Seconds)
		}
	}
	require.InDelta(t, 30, s.last().Seconds, 1e-9)
	require.EqualValues(t, 30000, s.last().Produced)
}

// fakeSteady judges a run at rate sustainable when rate <= limit, except
// the runs listed in flaky (by call number, from 1), which fail.
func fakeSteady(limit int, flaky ...int) (func(context.Context, steadySpec) (*Result, error), *[]steadySpec) {
	return fakeSteadyFunc(func(sp steadySpec, call int) bool {
		return int(sp.rate) <= limit && !slices.Contains(flaky, call)
	})
}

// fakeSteadyFunc judges each run with pass, given the run and its call
// number (from 1).
func fakeSteadyFunc(pass func(sp steadySpec, call int) bool) (func(context.Context, steadySpec) (*Result, error), *[]steadySpec) {
	var calls []steadySpec
	return func(_ context.Context, sp steadySpec) (*Result, error) {
		calls = append(calls, sp)
		ok := pass(sp, len(calls))
		g := Growth{Valid: true, Tolerance: GrowthTolerance(sp.rate), Detectable: 100, PValue: 0.9}
		if !ok {
			g.PValue, g.Slope = 1e-6, 1000
		}
		j := Judge(Evidence{Target: sp.rate, ProducerRate: sp.rate, Growth: g, P99: 5, P99Bound: sp.p99Bound, P99Basis: sp.p99Basis})
		return &Result{TargetRate: sp.rate, Sustainable: j.Sustainable, VerdictReason: j.Reason, Criteria: j.Criteria,
			BacklogGrowth: &g, LatencyMS: &Latency{P99: 5, P99PerSecond: 5, Seconds: 10}, Start: &StartState{}}, nil
	}, &calls
}

func TestSweepBisectsAndConfirms(t *testing.T) {
	run, calls := fakeSteady(37000)
	r := runSweep(t, run)
	// Reference, bisection at geometric means of [10k, 100k] until the
	// bracket 36.5k-37.8k is within 5 % (six of the eight runs allowed), two
	// repeats of the winner.
	require.Equal(t, "10000 31600 56200 42100 36500 39200 37800 36500 36500", rateList(*calls))
	require.True(t, r.Sustainable)
	require.Equal(t, 36500.0, r.TargetRate)
	require.Equal(t, 3, r.ConfirmedRuns)
	require.Contains(t, r.VerdictReason, "the next rate tried above it, 37800 msg/s, was not sustainable")
	// Every run above the reference is judged on latency against the highest
	// passing run below it.
	require.Empty(t, (*calls)[0].p99Bound)
	require.Equal(t, P99FloorMS, (*calls)[1].p99Bound)
	require.Contains(t, (*calls)[1].p99Basis, "the same median at 10000 msg/s")
	require.Contains(t, (*calls)[4].p99Basis, "the same median at 31600 msg/s")
	var sum strings.Builder
	require.NoError(t, WriteSummary(&sum, r))
	require.Contains(t, sum.String(), "36500")
	require.Contains(t, sum.String(), "FAIL: backlog_growth")
}

func TestSweepStepsDownWhenARepeatFails(t *testing.T) {
	// Call 8 is the first repeat of 36,500: it fails, so 36,500 becomes the
	// upper bound and the bisection resumes from 31,600, the highest rate
	// that passed every run: 34,000 and 35,200 pass, and 35,200 is confirmed.
	run, calls := fakeSteady(37000, 8)
	r := runSweep(t, run)
	require.Equal(t, "10000 31600 56200 42100 36500 39200 37800 36500 34000 35200 35200 35200", rateList(*calls))
	require.Equal(t, 35200.0, r.TargetRate)
	require.Equal(t, 3, r.ConfirmedRuns)
	require.Contains(t, r.VerdictReason, "the next rate tried above it, 36500 msg/s, was not sustainable")
}

func TestSweepWhenNothingIsSustainable(t *testing.T) {
	run, calls := fakeSteady(5000)
	r := runSweep(t, run)
	require.Len(t, *calls, 1, "nothing above a failed reference is tried")
	require.False(t, r.Sustainable)
	require.Zero(t, r.TargetRate)
	require.Contains(t, r.VerdictReason, "lower --min-rate")
	var sum strings.Builder
	require.NoError(t, WriteSummary(&sum, r))
	require.Contains(t, sum.String(), "none")
}

func TestSweepStepsDownUntilARepeatHolds(t *testing.T) {
	// A noisy boundary: single runs pass up to 37,000, repeats only up to
	// 30,000. Three rounds of bisection below a failed winner (36,500,
	// 35,200, 34,000) find nothing that holds; then the sweep steps down 10 %
	// at a time from the last failed winner (31,600 fails, 28,400 holds)
	// instead of giving up or falling back to the reference.
	run, calls := fakeSteadyFunc(func(sp steadySpec, _ int) bool {
		if strings.Contains(sp.label, RoleConfirm) {
			return sp.rate <= 30000
		}
		return sp.rate <= 37000
	})
	r := runSweep(t, run)
	require.Equal(t, "10000 31600 56200 42100 36500 39200 37800 36500 34000 35200 35200 34000 31600 28400 28400", rateList(*calls))
	require.True(t, r.Sustainable)
	require.Equal(t, 28400.0, r.TargetRate)
	require.Equal(t, 2, r.ConfirmedRuns)
	require.Contains(t, r.VerdictReason, "the next rate tried above it, 31600 msg/s, was not sustainable")
}

func TestSweepStepDownSkipsRatesThatFailed(t *testing.T) {
	// 30,000 failed a bisection run; a later step down from 33,300 (10 %
	// below: 30,000) skips it, since a confirmed rate must have passed every
	// run at it, and confirms 27,000.
	steps := []Step{{Rate: 10000, Sustainable: true}, {Rate: 30000}, {Rate: 33300}}
	require.Equal(t, 27000, stepDown(steps, 33300, 10000))
	require.Equal(t, 29700, stepDown(steps, 33000, 10000), "29,700 never ran")
	require.Equal(t, 10000, stepDown(steps, 10500, 10000), "never below the highest rate that passed every run")
}

func TestSweepGivesUpWhenNoRepeatHolds(t *testing.T) {
	// Every repeat fails: the sweep bisects below the failed winner
	// maxConfirmRounds times, steps down to the reference, and reports that
	// no rate was confirmed once the reference fails its repeat too.
	run, calls := fakeSteadyFunc(func(sp steadySpec, _ int) bool {
		return sp.rate <= 37000 && !strings.Contains(sp.label, RoleConfirm)
	})
	r := runSweep(t, run)
	require.False(t, r.Sustainable)
	require.Zero(t, r.TargetRate)
	require.Contains(t, r.VerdictReason, "no rate was confirmed")
	last := (*calls)[len(*calls)-1]
	require.Equal(t, 10000.0, last.rate, "the last repeat is the reference's")
	require.Contains(t, last.label, RoleConfirm)
	for i, c := range *calls {
		if strings.Contains(c.label, RoleConfirm) && i > 0 {
			prev := (*calls)[i-1]
			require.False(t, strings.Contains(prev.label, RoleConfirm) && prev.rate == c.rate, "a failed repeat is not repeated: %v", rates(*calls))
		}
	}
	require.Less(t, len(*calls), 30)
}

// runSweep runs a sweep of 10,000 to 100,000 msg/s (eight bisection steps,
// two repeats, a 50 ms p99 floor) over the fake steady runs of run.
func runSweep(t *testing.T, run func(context.Context, steadySpec) (*Result, error)) *Result {
	t.Helper()
	e := &env{o: Options{MinRate: 10000, MaxRate: 100000, SweepSteps: 8, Confirm: 2, P99Floor: 50 * time.Millisecond}, runSteady: run}
	r, err := e.sweep(context.Background(), "s")
	require.NoError(t, err)
	return r
}

// rateList is the rates of the runs, in order, space-separated.
func rateList(calls []steadySpec) string {
	var out []string
	for _, c := range calls {
		out = append(out, fmt.Sprint(c.rate))
	}
	return strings.Join(out, " ")
}

func rates(calls []steadySpec) []float64 {
	var out []float64
	for _, c := range calls {
		out = append(out, c.rate)
	}
	return out
}
