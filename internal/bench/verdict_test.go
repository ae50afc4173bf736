package bench

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// These tests feed the verdict synthetic backlog series shaped like an
// in-process run's readings (one every 20 ms over a 10 s window): no
// database is involved.

const (
	synthRate     = 50000.0 // msgs/s offered
	synthStep     = 0.02    // seconds between readings
	synthReadings = 500     // 10 s
)

// synthBacklog returns readings of a backlog made of trend(t) plus the noise
// of batched work: an independent part (where in its poll cycle the relay
// is, up to 30 ms of load) and a slowly wandering part (an AR(1) process with
// a correlation time of about 200 ms and a spread of 1 % of a second's load).
func synthBacklog(seed uint64, trend func(t float64) float64) (xs, ys []float64) {
	return synthBacklogPhi(seed, 0.9, trend)
}

// synthBacklogPhi is synthBacklog with the wandering part's lag-1
// autocorrelation per reading phi (correlation time 20 ms / (1 - phi)).
func synthBacklogPhi(seed uint64, phi float64, trend func(t float64) float64) (xs, ys []float64) {
	r := rand.New(rand.NewPCG(seed, 42))
	wander := 0.0
	sd := 0.01 * synthRate * math.Sqrt(1-phi*phi)
	for i := range synthReadings {
		t := 5 + float64(i)*synthStep // the window starts after a 5 s warm-up
		wander = phi*wander + r.NormFloat64()*sd
		y := trend(t-5) + r.Float64()*0.03*synthRate + wander
		xs, ys = append(xs, t), append(ys, math.Max(0, y))
	}
	return xs, ys
}

func TestGrowthFailsASlowlyGrowingBacklog(t *testing.T) {
	tol := GrowthTolerance(synthRate)
	for seed := range uint64(200) {
		// +0.5 % of the rate per second for the whole window: 250 msg/s,
		// 2,500 messages after 10 s, far below the 2 s backlog limit.
		xs, ys := synthBacklog(seed, func(t float64) float64 { return 0.005 * synthRate * t })
		g := TestGrowth(xs, ys, tol)
		require.True(t, g.Valid)
		require.True(t, g.Growing(), "seed %d: %s", seed, g)
		require.Greater(t, g.Lower, tol, "seed %d", seed)
		require.InDelta(t, 250, g.Slope, 120, "seed %d", seed)
	}
}

func TestGrowthPassesANoisyFlatBacklog(t *testing.T) {
	tol := GrowthTolerance(synthRate)
	for seed := range uint64(200) {
		xs, ys := synthBacklog(seed, func(float64) float64 { return 0 })
		g := TestGrowth(xs, ys, tol)
		require.False(t, g.Growing(), "seed %d: %s", seed, g)
		require.Less(t, g.Lower, tol)
	}
}

// TestGrowthBoundsAreCalibrated checks that each one-sided 95 % bound misses
// the true growth (0) about 5 % of the time, also when the noise wanders
// slowly: were the autocorrelation ignored, slow noise would pass for growth.
// Noise that wanders over a fifth of the window (2 s) is at the edge of what
// a 10 s window can tell from growth: the bounds then miss about 9 % of the
// time.
func TestGrowthBoundsAreCalibrated(t *testing.T) {
	const runs = 1000
	for _, c := range []struct{ phi, miss float64 }{{0.5, 0.05}, {0.9, 0.05}, {0.97, 0.05}, {0.99, 0.09}} { // correlation time 40 ms to 2 s
		phi := c.phi
		var above, below int
		for seed := range uint64(runs) {
			xs, ys := synthBacklogPhi(seed+10000, phi, func(float64) float64 { return 0 })
			g := TestGrowth(xs, ys, GrowthTolerance(synthRate))
			if g.Lower > 0 {
				above++
			}
			if g.Upper < 0 {
				below++
			}
		}
		for _, miss := range []int{above, below} {
			require.InDelta(t, c.miss, float64(miss)/runs, 0.025, "phi %.2f: %d and %d of %d intervals miss", phi, above, below, runs)
		}
	}
}

func TestGrowthPassesASpikeThatDrains(t *testing.T) {
	tol := GrowthTolerance(synthRate)
	// A one-second stall (a checkpoint, a GC pause) piles up a second of
	// load; the relay then works it off in two seconds.
	spike := func(at float64) func(float64) float64 {
		return func(t float64) float64 {
			switch {
			case t < at || t >= at+3:
				return 0
			case t < at+1:
				return synthRate * (t - at)
			default:
				return synthRate * (1 - (t-at-1)/2)
			}
		}
	}
	for _, at := range []float64{0.5, 2, 3.5, 5} {
		for seed := range uint64(50) {
			xs, ys := synthBacklog(seed, spike(at))
			g := TestGrowth(xs, ys, tol)
			require.False(t, g.Growing(), "spike at %.1f s, seed %d: %s", at, seed, g)
			j := Judge(Evidence{Target: synthRate, ProducerRate: synthRate, Growth: g, BacklogAtStop: int64(ys[len(ys)-1])})
			require.True(t, j.Sustainable, j.Reason)
		}
	}
}

func TestGrowthWithoutNoise(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	flat := make([]float64, len(xs))
	g := TestGrowth(xs, flat, 10)
	require.True(t, g.Valid)
	require.False(t, g.Growing(), g.String())
	rising := make([]float64, len(xs))
	for i, x := range xs {
		rising[i] = 11 * x // just above the tolerance, exactly
	}
	g = TestGrowth(xs, rising, 10)
	require.True(t, g.Growing(), g.String())
	require.InDelta(t, 11, g.Slope, 1e-9)
	require.Zero(t, g.StdErr)
}

func TestGrowthNeedsReadings(t *testing.T) {
	for _, c := range [][2][]float64{{nil, nil}, {{1, 2}, {0, 5}}, {{1, 1, 1}, {0, 5, 9}}} {
		g := TestGrowth(c[0], c[1], 10)
		require.False(t, g.Valid)
		require.True(t, g.Growing(), "an untestable window is not evidence of a sustainable rate")
		require.Contains(t, g.String(), "not testable")
	}
}

func TestStudentT(t *testing.T) {
	// Reference values from statistical tables.
	for _, c := range []struct{ dof, q95 float64 }{{1, 6.3138}, {2, 2.9200}, {5, 2.0150}, {10, 1.8125}, {30, 1.6973}, {1e6, 1.6449}} {
		require.InDelta(t, c.q95, StudentTQuantile(0.95, c.dof), 5e-4, "dof %v", c.dof)
		require.InDelta(t, 0.95, StudentTCDF(c.q95, c.dof), 1e-4)
		require.InDelta(t, 0.05, StudentTCDF(-c.q95, c.dof), 1e-4)
	}
	require.InDelta(t, 0.5, StudentTCDF(0, 3.7), 1e-12)
	require.InDelta(t, -StudentTQuantile(0.9, 4.5), StudentTQuantile(0.1, 4.5), 1e-9)
	require.True(t, math.IsNaN(StudentTQuantile(1, 3)))
}

// Poison messages (--poison-percent 1) each stay in the backlog for their
// attempts and backoffs before they are dead-lettered, and so do the
// messages of their key behind them: a steady stream of them keeps a few
// more messages in the backlog, a constant number after the first hold, and
// the backlog does not grow.
func TestGrowthPassesPoisonHolds(t *testing.T) {
	tol := GrowthTolerance(synthRate)
	const (
		every  = 100  // every 100th message is poison
		hold   = 0.15 // seconds: 3 attempts with 50 ms backoffs, and the fetches between them
		behind = 20   // messages of the poison key that wait behind it
	)
	arrival := every / synthRate // seconds between poison messages
	poisonHeld := func(t float64) float64 {
		// poison messages enqueued in (t-hold, t], and what waits behind each.
		n := math.Floor(t/arrival) - math.Floor(math.Max(0, t-hold)/arrival)
		return n * (1 + behind)
	}
	for seed := range uint64(100) {
		xs, ys := synthBacklog(seed, poisonHeld)
		g := TestGrowth(xs, ys, tol)
		require.False(t, g.Growing(), "seed %d: %s", seed, g)
		j := Judge(Evidence{Target: synthRate, ProducerRate: synthRate, Growth: g, BacklogAtStop: int64(ys[len(ys)-1])})
		require.True(t, j.Sustainable, "seed %d: %s", seed, j.Reason)
	}
}

func TestJudge(t *testing.T) {
	flat := Growth{Valid: true, Slope: 3, StdErr: 5, Lower: -5, Upper: 11, Tolerance: 10, PValue: 0.9, Blocks: 20, Readings: 500}
	growing := Growth{Valid: true, Slope: 500, StdErr: 20, Lower: 465, Upper: 535, Tolerance: 10, PValue: 1e-9, Blocks: 20, Readings: 500}

	j := Judge(Evidence{Target: 10000, ProducerRate: 9950, Growth: flat, BacklogAtStop: 15000, P99: 12, P99Bound: 50, P99Basis: "floor"})
	require.True(t, j.Sustainable, j.Reason)
	require.True(t, strings.HasPrefix(j.Reason, "met: "), j.Reason)
	require.Len(t, j.Criteria, 4)

	// The case a 1 %-of-the-rate limit let through: +500 msg/s at 50,000.
	j = Judge(Evidence{Target: 50000, ProducerRate: 50000, Growth: growing, BacklogAtStop: 5000})
	require.False(t, j.Sustainable)
	require.True(t, strings.HasPrefix(j.Reason, "failed: backlog growth 500.0"), j.Reason)

	j = Judge(Evidence{Target: 10000, ProducerRate: 9850, Growth: flat})
	require.False(t, j.Sustainable)
	require.Contains(t, j.Reason, "failed: producers 9850 msg/s")

	require.True(t, Judge(Evidence{Target: 10000, ProducerRate: 9900, Growth: flat, BacklogAtStop: 20000}).Sustainable, "limits are inclusive")
	j = Judge(Evidence{Target: 10000, ProducerRate: 10000, Growth: flat, BacklogAtStop: 20001})
	require.False(t, j.Sustainable)
	require.Contains(t, j.Reason, "backlog at stop 20001")

	// p99: judged against its bound when there is one, listed otherwise.
	j = Judge(Evidence{Target: 10000, ProducerRate: 10000, Growth: flat, P99: 61, P99Bound: P99Bound(20, P99FloorMS), P99Basis: "3 × 20.0 ms"})
	require.False(t, j.Sustainable)
	require.Contains(t, j.Reason, "failed: p99 61.0 ms (need ≤ 60.0 ms")
	j = Judge(Evidence{Target: 10000, ProducerRate: 10000, Growth: flat, P99: 61, P99Basis: "no lower step to compare with"})
	require.True(t, j.Sustainable, j.Reason)
	require.Contains(t, j.Reason, "p99 61.0 ms not judged: no lower step")
	// The statistic judged is named in the evidence.
	j = Judge(Evidence{Target: 10000, ProducerRate: 10000, Growth: flat, P99: 12, P99Stat: "median of the window's 10 per-second p99s (whole window: p99 140.0 ms)", P99Bound: 50, P99Basis: "floor"})
	require.True(t, j.Sustainable, j.Reason)
	require.Contains(t, j.Reason, "median of the window's 10 per-second p99s (whole window: p99 140.0 ms) 12.0 ms (need ≤ 50.0 ms")

	require.False(t, Judge(Evidence{Target: 10000, ProducerRate: 10000, Growth: Growth{Readings: 2}}).Sustainable)
	require.False(t, Judge(Evidence{}).Sustainable)
	require.Equal(t, 50.0, P99Bound(10, P99FloorMS))
	require.Equal(t, 90.0, P99Bound(30, P99FloorMS))
	require.Equal(t, 10.0, GrowthTolerance(1000))
	require.Equal(t, 80.0, GrowthTolerance(80000))
}
