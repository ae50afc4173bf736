package bench

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The keyed workload: every parent ends, no concurrency key ever runs more
// steps at once than its limit, and the same children run without keys
// after it, for the ratio. One runner, and a lease of 1s, keep it short on
// 7793f45: there two runners' claims deadlock (seconds lost to each), and
// rows waiting on a key whose wake was lost wait for the running step's
// lease (30s by default; one drain in a few) – the bench reports both (the
// runner log, the longest gap), the test does not judge them.
func TestFlowKeyed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := RunFlow(ctx, FlowOptions{DatabaseURL: databaseURL, Workloads: []string{"keyed"}, Instances: 20, Runners: 1,
		Paced: -1, StepTimeMin: time.Millisecond, StepTimeMax: 3 * time.Millisecond, LeaseTTL: time.Second})
	require.NoError(t, err)
	require.Len(t, rs, 2)
	k, u := rs[0], rs[1]
	require.Equal(t, "keyed", k.Workload)
	require.Equal(t, "keyed-unkeyed", u.Workload)
	for _, r := range rs {
		require.False(t, r.Incomplete, r.Workload)
		require.Equal(t, 20, r.Instances)
		require.Equal(t, 1, r.Runners)
		require.Equal(t, 5, r.StepsPerFlow)
		// Every fan and child committed before the last join ran; the
		// joins' outcomes may be in flight when the drain ends.
		require.GreaterOrEqual(t, r.Steps, int64(20*4), r.Workload)
		require.LessOrEqual(t, r.Steps, int64(20*5), r.Workload)
		require.NotNil(t, r.Keyed, r.Workload)
		require.Equal(t, 3, r.Keyed.ChildrenPerParent)
		require.Positive(t, r.Keyed.ChildStepsPerSec, r.Workload)
		require.Positive(t, r.Keyed.ChildWindowStepsPerSec, r.Workload)
		require.Positive(t, r.Keyed.MaxRunning, r.Workload)
		require.GreaterOrEqual(t, r.Keyed.StepTimeMeanMs, 1.0)
		require.LessOrEqual(t, r.Keyed.StepTimeMeanMs, 3.0)
		require.GreaterOrEqual(t, r.Keyed.StepTimeMeasuredMs, 1.0)
		require.Positive(t, r.Keyed.LongestGapMs, r.Workload)
	}
	kf := k.Keyed
	require.Equal(t, 4, kf.Keys)
	require.Equal(t, 2, kf.Limit)
	require.Len(t, kf.MaxRunningByKey, 4)
	require.Positive(t, kf.MaxRunningPerKey)
	require.LessOrEqual(t, kf.MaxRunningPerKey, kf.Limit, "a key ran more steps at once than its limit: %v", kf.MaxRunningByKey)
	require.LessOrEqual(t, kf.MaxRunning, kf.Keys*kf.Limit)
	require.InDelta(t, 8/(kf.StepTimeMeanMs/1000), kf.IdealStepsPerSec, 1e-6)
	require.InDelta(t, kf.ChildStepsPerSec/kf.IdealStepsPerSec, kf.OfIdeal, 1e-9)
	require.InDelta(t, kf.ChildStepsPerSec/(8/(kf.StepTimeMeasuredMs/1000)), kf.OfMeasuredIdeal, 1e-9)
	// A key's slots can be busy at most all of its window.
	require.Positive(t, kf.SlotsBusy)
	require.LessOrEqual(t, kf.SlotsBusy, 1.0)
	require.Zero(t, u.Keyed.SlotsBusy)
	require.Equal(t, u.Keyed.ChildStepsPerSec, kf.UnkeyedStepsPerSec)
	require.InDelta(t, kf.ChildStepsPerSec/u.Keyed.ChildStepsPerSec, kf.OfUnkeyed, 1e-9)
	// The same seed draws the same step times for both.
	require.Equal(t, kf.StepTimeMeanMs, u.Keyed.StepTimeMeanMs)
	require.Zero(t, u.Keyed.Keys)
	require.Empty(t, u.Keyed.MaxRunningByKey)

	var out bytes.Buffer
	require.NoError(t, WriteFlowSummary(&out, rs))
	require.Contains(t, out.String(), "keyed: most running at once: ")
	require.Contains(t, out.String(), ", limit 2, within the limit (by key ")
	require.Contains(t, out.String(), "longest gap between two children's starts ")
	require.Regexp(t, `keyed: children \d+ steps/s \(\d+/s over the children.s window; .*limit-bound ideal \d+/s \(4 keys × 2 ÷ [0-9.]+ ms\): [0-9.]+ of it \([0-9.]+ at the measured step time\); key slots busy [0-9.]+ of each key.s window; without keys \d+/s`, out.String())
	require.Contains(t, out.String(), "keyed-unkeyed: runner log: ")
}

// The ratelimited workload under two runners: every step of the instances
// for RateFor at the rate ran, and the figures are those of their starts.
func TestFlowRateLimited(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := RunFlow(ctx, FlowOptions{DatabaseURL: databaseURL, Workloads: []string{"ratelimited"}, Runners: 2,
		RateLimit: 200, RateBurst: 10, RateFor: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rs, 1)
	r := rs[0]
	require.False(t, r.Incomplete)
	// 200/s × 0.2 s + 10 = 50 steps: 17 instances of 3 steps.
	require.Equal(t, 17, r.Instances)
	require.Equal(t, 2, r.Runners)
	require.Zero(t, r.Samples, "no paced phase")
	f := r.Rate
	require.NotNil(t, f)
	require.Equal(t, 17*3, f.Starts)
	require.Equal(t, 200.0, f.PerSecond)
	require.Equal(t, 10.0, f.Burst)
	require.Positive(t, f.AchievedPerSecond)
	require.LessOrEqual(t, f.MaxIn100ms, f.MaxIn1s)
	require.LessOrEqual(t, f.MaxIn1s, f.Starts)
	require.Equal(t, float64(f.MaxIn1s)-210, f.Overshoot1s)
	require.Equal(t, float64(f.MaxIn100ms)-30, f.Overshoot100ms)
	// Every step was leased by a claim: counted there too.
	require.Equal(t, f.Starts, f.ClaimGrants)
	require.LessOrEqual(t, f.ClaimMaxIn100ms, f.ClaimMaxIn1s)
	require.Equal(t, float64(f.ClaimMaxIn1s)-210, f.ClaimOvershoot1s)
	var out bytes.Buffer
	require.NoError(t, WriteFlowSummary(&out, rs))
	require.Contains(t, out.String(), "ratelimited: ")
	require.Contains(t, out.String(), "steps started/s after the first burst (bucket 200/s, burst 10)")
	require.Contains(t, out.String(), "ratelimited: at the claims (51 steps leased, each counted when its claim was sent): most in any 1 s ")
}

func TestMaxInWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		ts := make([]time.Time, len(ms))
		for i, m := range ms {
			ts[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return ts
	}
	require.Zero(t, maxInWindow(nil, time.Second))
	require.Equal(t, 1, maxInWindow(at(0), time.Second))
	// [t, t+w) is half-open: 0 and 100 are not in one 100 ms window.
	require.Equal(t, 1, maxInWindow(at(0, 100, 200), 100*time.Millisecond))
	require.Equal(t, 3, maxInWindow(at(0, 5, 99, 150, 300), 100*time.Millisecond))
	require.Equal(t, 5, maxInWindow(at(0, 500, 900, 950, 999, 1500), time.Second))
}

// rateFigures: a bucket of 10/s with a burst of 2 holds when the starts
// come every 100 ms after a burst of two; two more starts within a second
// are an overshoot of one.
func TestRateFigures(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var ts []time.Time
	ts = append(ts, t0, t0)
	for i := 1; i <= 30; i++ {
		ts = append(ts, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	f := rateFigures(ts, 10, 2)
	require.Equal(t, 32, f.Starts)
	require.InDelta(t, 10, f.AchievedPerSecond, 1e-9)
	require.InDelta(t, 1, f.OfConfigured, 1e-9)
	require.Equal(t, 11, f.MaxIn1s) // [t0, t0+1s): the burst and nine after it
	require.Equal(t, -1.0, f.Overshoot1s)
	require.Equal(t, 2, f.MaxIn100ms)
	require.Equal(t, -1.0, f.Overshoot100ms)

	f = rateFigures(append(ts, t0.Add(550*time.Millisecond), t0.Add(560*time.Millisecond)), 10, 2)
	require.Equal(t, 13, f.MaxIn1s)
	require.Equal(t, 1.0, f.Overshoot1s)
	require.Equal(t, 3, f.MaxIn100ms)
	require.Equal(t, 0.0, f.Overshoot100ms)
}

// The runners' logger counts deadlocks, in the message or any attribute
// (an error's text carries the SQLSTATE), and warnings and errors by
// message; what the inner handler's level lets through still reaches it.
func TestCountingLogger(t *testing.T) {
	var buf bytes.Buffer
	inner := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	log, counts := newCountingLogger(inner)
	log.Warn("wharfflow: claiming steps", "err", errors.New("ERROR: deadlock detected (SQLSTATE 40P01)"))
	log.Warn("wharfflow: claiming steps", "err", errors.New("ERROR: canceling statement due to statement timeout (SQLSTATE 57014)"))
	log.With("err", "deadlock detected").Error("wharfflow: writing outcomes failed")
	log.Info("wharfflow: something", "code", "40P01")
	log.Info("wharfflow: quiet")
	l := counts.snapshot()
	require.Equal(t, int64(3), l.Deadlocks)
	require.Equal(t, int64(2), l.Warnings)
	require.Equal(t, int64(1), l.Errors)
	require.Equal(t, map[string]int64{"wharfflow: claiming steps": 2, "wharfflow: writing outcomes failed": 1}, l.Messages)
	require.Contains(t, buf.String(), "SQLSTATE 40P01")
	require.NotContains(t, buf.String(), "quiet")

	var out bytes.Buffer
	require.NoError(t, writeRunnerLog(&out, FlowResult{Workload: "keyed", RunnerLog: l}))
	require.Equal(t, `keyed: runner log: 3 deadlock detected (server counted 0), 2 warnings, 1 errors: "wharfflow: claiming steps" ×2; "wharfflow: writing outcomes failed" ×1`+"\n", out.String())
}

func TestParseStepTime(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi time.Duration
		err    string
	}{
		{in: "2ms-10ms", lo: 2 * time.Millisecond, hi: 10 * time.Millisecond},
		{in: "5ms", lo: 5 * time.Millisecond, hi: 5 * time.Millisecond},
		{in: "0", lo: 0, hi: 0},
		{in: " 1ms - 1ms ", lo: time.Millisecond, hi: time.Millisecond},
		{in: "10ms-2ms", err: "the minimum 10ms is above the maximum 2ms"},
		{in: "fast", err: "use MIN-MAX"},
		{in: "2ms-", err: "use MIN-MAX"},
		{in: "-2ms", err: "use MIN-MAX"},
	} {
		lo, hi, err := ParseStepTime(c.in)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.in)
			require.ErrorContains(t, err, "--step-time", c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.lo, lo, c.in)
		require.Equal(t, c.hi, hi, c.in)
	}
	require.Equal(t, "2ms-10ms", FormatStepTime(2*time.Millisecond, 10*time.Millisecond))
	require.Equal(t, "3ms", FormatStepTime(3*time.Millisecond, 3*time.Millisecond))
}
