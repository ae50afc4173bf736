package bench

import (
	"fmt"
	"math"
	"strings"
)

// Slope returns the least-squares slope of ys over xs (units of y per unit
// of x), or 0 when there are fewer than two points or all xs are equal.
func Slope(xs, ys []float64) float64 {
	n := min(len(xs), len(ys))
	if n < 2 {
		return 0
	}
	var mx, my float64
	for i := range n {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxy, sxx float64
	for i := range n {
		dx := xs[i] - mx
		sxy += dx * (ys[i] - my)
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}

// Verdict applies DESIGN.md §6: a steady run at target msgs/s is sustainable
// when the producer reached at least 99 % of the target, the backlog's
// least-squares growth slope after warm-up is at most max(1, 1 % of the
// target) msgs/s, and the backlog when the producer stopped is at most two
// seconds' worth of the target. The reason names every criterion with its
// measured value, failed ones first.
func Verdict(target, producerRate, slope float64, backlogAtStop int64) (bool, string) {
	if target <= 0 {
		return false, "no target rate"
	}
	minRate := 0.99 * target
	maxSlope := math.Max(1, 0.01*target)
	maxBacklog := 2 * target
	var failed, passed []string
	check := func(ok bool, s string) {
		if ok {
			passed = append(passed, s)
		} else {
			failed = append(failed, s)
		}
	}
	check(producerRate >= minRate, fmt.Sprintf("producer %.0f msg/s vs >= %.0f (99 %% of target)", producerRate, minRate))
	check(slope <= maxSlope, fmt.Sprintf("backlog slope %.1f msg/s vs <= %.1f", slope, maxSlope))
	check(float64(backlogAtStop) <= maxBacklog, fmt.Sprintf("backlog at stop %d vs <= %.0f (2 s of load)", backlogAtStop, maxBacklog))
	if len(failed) > 0 {
		return false, "failed: " + strings.Join(failed, "; ") + prefixed("; met: ", passed)
	}
	return true, "met: " + strings.Join(passed, "; ")
}

func prefixed(prefix string, parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return prefix + strings.Join(parts, "; ")
}
