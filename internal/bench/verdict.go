package bench

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The thresholds of the steady-state verdict.
const (
	// MinProducerFraction is the share of the target rate the producers must
	// reach: below it the relay was not offered the load being judged.
	MinProducerFraction = 0.99
	// MaxBacklogSeconds bounds the backlog when the producers stop, in
	// seconds of load at the target rate.
	MaxBacklogSeconds = 2.0
	// GrowthConfidence is the one-sided confidence of the growth test: a
	// step fails when the backlog grows faster than the tolerance with at
	// least this confidence.
	GrowthConfidence = 0.95
	// GrowthToleranceFraction and MinGrowthTolerance set the growth the
	// test tolerates: max(MinGrowthTolerance, GrowthToleranceFraction ×
	// target) msgs/s, i.e. the relay keeping up with 99.9 % of the load. Any
	// real shortfall above that is detected once the window holds enough
	// readings; below it, it is immaterial.
	GrowthToleranceFraction = 0.001
	MinGrowthTolerance      = 10.0
	// P99FloorMS (the default of --p99-floor) and P99Factor bound a step's
	// p99 commit → ack latency by the highest passing step below it:
	// max(floor, P99Factor × its p99).
	P99FloorMS = 50.0
	P99Factor  = 3.0
)

// GrowthTolerance is the backlog growth, in msgs/s, that a run at target
// msgs/s is allowed before it counts as not keeping up.
func GrowthTolerance(target float64) float64 {
	return math.Max(MinGrowthTolerance, GrowthToleranceFraction*target)
}

// P99Bound is the p99 latency bound, in ms, of a step whose highest passing
// lower step had a p99 of lowerP99 ms, with a floor of floorMS.
func P99Bound(lowerP99, floorMS float64) float64 { return math.Max(floorMS, P99Factor*lowerP99) }

// Growth is the backlog's growth over a measurement window, with the
// uncertainty that the backlog's noise and autocorrelation leave.
//
// The readings are averaged in contiguous blocks (about a quarter of a second
// each, at most 40) and the slope is the least-squares fit to the block means:
// averaging removes the short-range jitter of batched commits and
// acknowledgements. What correlation is left between neighbouring blocks (a
// stall that spans several) is measured as the lag-1 autocorrelation r of
// the fit's residuals (corrected for its small-sample bias); the slope's
// variance is inflated by (1+r)/(1-r) and the degrees of freedom come from
// the effective number of blocks, n(1-r)/(1+r). On synthetic 10 s series
// whose noise has correlation times up to 0.7 s, each one-sided 95 % bound
// holds 94-96 % of the time; at 2 s, about 91 % (verdict_test.go).
type Growth struct {
	// Slope is the least-squares growth of the backlog, msgs/s.
	Slope float64 `json:"slope"`
	// StdErr is the slope's standard error, corrected for autocorrelation.
	StdErr float64 `json:"std_err"`
	// Lower and Upper are the one-sided 95 % bounds: the growth is above
	// Lower, and below Upper, each with 95 % confidence.
	Lower float64 `json:"lower_95"`
	Upper float64 `json:"upper_95"`
	// Tolerance is the growth allowed, msgs/s (GrowthTolerance).
	Tolerance float64 `json:"tolerance"`
	// Detectable is the growth the test fails with 95 % probability:
	// Tolerance + 2·t·StdErr. A sustainable verdict means the growth was
	// probably below it.
	Detectable float64 `json:"detectable_95"`
	// PValue is the probability of a slope at least this steep if the true
	// growth were exactly Tolerance; the step fails below 0.05.
	PValue float64 `json:"p_value"`
	// Readings, Blocks, Lag1, EffectiveBlocks and DOF describe the fit.
	Readings        int     `json:"readings"`
	Blocks          int     `json:"blocks"`
	Lag1            float64 `json:"lag1_autocorrelation"`
	EffectiveBlocks float64 `json:"effective_blocks"`
	DOF             float64 `json:"dof"`
	// Window is the span of the readings, seconds.
	Window float64 `json:"window_seconds"`
	// Valid is false when there were too few readings to test anything.
	Valid bool `json:"valid"`
}

// Growing reports whether the backlog grows faster than the tolerance with
// GrowthConfidence (or whether the growth could not be tested at all).
func (g Growth) Growing() bool { return !g.Valid || g.PValue < 1-GrowthConfidence }

// String is the evidence in one line.
func (g Growth) String() string {
	if !g.Valid {
		return fmt.Sprintf("backlog growth not testable: %d readings over %.1f s (need at least 3; raise --duration)", g.Readings, g.Window)
	}
	return fmt.Sprintf("backlog growth %.1f ± %.1f msg/s (one-sided 95 %% bounds %.1f and %.1f); growth above the tolerance of %.1f msg/s: p = %.2g (fails below %.2g); a growth of %.0f msg/s or more fails with 95 %% probability; %d readings in %d blocks, lag-1 autocorrelation %.2f, %.1f effective blocks",
		g.Slope, g.Upper-g.Slope, g.Lower, g.Upper, g.Tolerance, g.PValue, 1-GrowthConfidence, g.Detectable, g.Readings, g.Blocks, g.Lag1, g.EffectiveBlocks)
}

const (
	targetBlockSeconds = 0.25
	maxBlocks          = 40
	minPerBlock        = 4
	maxLag1            = 0.9
)

// TestGrowth fits the backlog readings ys (messages) taken at times xs
// (seconds, increasing) and tests whether the backlog grows faster than
// tolerance msgs/s.
func TestGrowth(xs, ys []float64, tolerance float64) Growth {
	n := min(len(xs), len(ys))
	g := Growth{Tolerance: tolerance, Readings: n}
	if n > 0 {
		g.Window = xs[n-1] - xs[0]
	}
	if n < 3 || g.Window <= 0 {
		return g
	}
	blocks := min(maxBlocks, n/minPerBlock, int(g.Window/targetBlockSeconds))
	if blocks < 5 {
		blocks = min(n, 5) // few readings: each one is its own block
	}
	bx, by := make([]float64, blocks), make([]float64, blocks)
	for b := range blocks {
		lo, hi := b*n/blocks, (b+1)*n/blocks
		for i := lo; i < hi; i++ {
			bx[b] += xs[i]
			by[b] += ys[i]
		}
		bx[b] /= float64(hi - lo)
		by[b] /= float64(hi - lo)
	}
	slope, intercept, sxx := fit(bx, by)
	if sxx == 0 {
		return g
	}
	g.Valid = true
	g.Slope, g.Blocks = slope, blocks
	res := make([]float64, blocks)
	var ss float64
	for b := range blocks {
		res[b] = by[b] - (intercept + slope*bx[b])
		ss += res[b] * res[b]
	}
	var lag float64
	for b := 1; b < blocks; b++ {
		lag += res[b-1] * res[b]
	}
	if ss > 0 {
		// The lag-1 estimate from a short detrended series is biased low by
		// about (1+4r)/n; uncorrected, a stall spanning a few blocks would
		// make the interval too narrow.
		r := lag / ss
		r += (1 + 4*r) / float64(blocks)
		g.Lag1 = math.Min(maxLag1, math.Max(0, r))
	}
	inflation := (1 + g.Lag1) / (1 - g.Lag1)
	g.EffectiveBlocks = float64(blocks) / inflation
	g.DOF = math.Max(1, g.EffectiveBlocks-2)
	dofResid := float64(blocks - 2)
	if dofResid < 1 {
		dofResid = 1
	}
	g.StdErr = math.Sqrt(ss / dofResid / sxx * inflation)
	t := StudentTQuantile(GrowthConfidence, g.DOF)
	g.Lower, g.Upper = slope-t*g.StdErr, slope+t*g.StdErr
	g.Detectable = tolerance + 2*t*g.StdErr
	switch {
	case g.StdErr > 0:
		g.PValue = 1 - StudentTCDF((slope-tolerance)/g.StdErr, g.DOF)
	case slope > tolerance:
		g.PValue = 0
	default:
		g.PValue = 1
	}
	return g
}

// fit is the least-squares line through (xs, ys): slope, intercept and the
// sum of squared deviations of xs (0 when the xs are all equal).
func fit(xs, ys []float64) (slope, intercept, sxx float64) {
	n := float64(len(xs))
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= n
	my /= n
	var sxy float64
	for i := range xs {
		dx := xs[i] - mx
		sxy += dx * (ys[i] - my)
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0, my, 0
	}
	slope = sxy / sxx
	return slope, my - slope*mx, sxx
}

// Slope returns the least-squares slope of ys over xs (units of y per unit
// of x), or 0 when there are fewer than two points or all xs are equal.
func Slope(xs, ys []float64) float64 {
	n := min(len(xs), len(ys))
	if n < 2 {
		return 0
	}
	s, _, _ := fit(xs[:n], ys[:n])
	return s
}

// Evidence is what a steady run's verdict rests on.
type Evidence struct {
	// Target is the rate offered, msgs/s.
	Target float64
	// ProducerRate is the rate the producers reached in the window.
	ProducerRate float64
	// Growth is the backlog's growth test over the window.
	Growth Growth
	// BacklogAtStop is the backlog when the producers stopped.
	BacklogAtStop int64
	// P99 is the run's p99 commit → ack latency in ms, as P99Stat says
	// (the window's p99, or the median of its per-second p99s); 0 when not
	// measured.
	P99     float64
	P99Stat string
	// P99Bound is the bound P99 is judged against, in ms; 0 when there is
	// nothing to judge it against. P99Basis says where the bound comes from.
	P99Bound float64
	P99Basis string
}

// Criterion is one test of the verdict.
type Criterion struct {
	// Name is producer_rate, backlog_growth, backlog_at_stop or p99.
	Name string `json:"name"`
	// Judged is false when the criterion could not be applied (Detail says
	// why); it then does not count against the run.
	Judged bool   `json:"judged"`
	Met    bool   `json:"met"`
	Detail string `json:"detail"`
}

// Judgement is a steady run's verdict with the evidence for each criterion.
type Judgement struct {
	Sustainable bool        `json:"sustainable"`
	Criteria    []Criterion `json:"criteria"`
	// Reason lists the failed criteria first, then the met and the unjudged.
	Reason string `json:"reason"`
}

// Judge decides whether a run at e.Target msgs/s was sustainable: the
// producers reached 99 % of the target, the backlog did not grow faster than
// the tolerance with 95 % confidence over the window, the backlog at the
// producers' stop was at most 2 s of load, and the p99 latency stayed within
// its bound (when there is one).
func Judge(e Evidence) Judgement {
	if e.Target <= 0 {
		return Judgement{Reason: "no target rate"}
	}
	var j Judgement
	add := func(name string, judged, met bool, detail string) {
		j.Criteria = append(j.Criteria, Criterion{Name: name, Judged: judged, Met: met, Detail: detail})
	}
	minRate := MinProducerFraction * e.Target
	add("producer_rate", true, e.ProducerRate >= minRate,
		fmt.Sprintf("producers %.0f msg/s = %.1f %% of the target (need ≥ %.0f %%)", e.ProducerRate, 100*e.ProducerRate/e.Target, 100*MinProducerFraction))
	add("backlog_growth", true, !e.Growth.Growing(), e.Growth.String())
	maxBacklog := MaxBacklogSeconds * e.Target
	add("backlog_at_stop", true, float64(e.BacklogAtStop) <= maxBacklog,
		fmt.Sprintf("backlog at stop %d (need ≤ %.0f, %.0f s of load)", e.BacklogAtStop, maxBacklog, MaxBacklogSeconds))
	p99Stat := e.P99Stat
	if p99Stat == "" {
		p99Stat = "p99"
	}
	switch {
	case e.P99 <= 0:
		add("p99", false, false, "p99 not judged: latency not measured (relay processes)")
	case e.P99Bound <= 0:
		add("p99", false, false, fmt.Sprintf("%s %.1f ms not judged: %s", p99Stat, e.P99, e.P99Basis))
	default:
		add("p99", true, e.P99 <= e.P99Bound, fmt.Sprintf("%s %.1f ms (need ≤ %.1f ms: %s)", p99Stat, e.P99, e.P99Bound, e.P99Basis))
	}
	var failed, met, unjudged []string
	for _, c := range j.Criteria {
		switch {
		case !c.Judged:
			unjudged = append(unjudged, c.Detail)
		case c.Met:
			met = append(met, c.Detail)
		default:
			failed = append(failed, c.Detail)
		}
	}
	j.Sustainable = len(failed) == 0
	var parts []string
	for _, p := range []struct {
		label string
		items []string
	}{{"failed: ", failed}, {"met: ", met}, {"", unjudged}} {
		if len(p.items) > 0 {
			parts = append(parts, p.label+strings.Join(p.items, "; "))
		}
	}
	j.Reason = strings.Join(parts, "; ")
	return j
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
