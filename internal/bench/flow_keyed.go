package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wharfhq/wharf/wharfflow"
)

// The keyed and ratelimited workloads are flows as applications use flow
// control: children under concurrency keys doing a few milliseconds of work
// (a sleep) each, and steps drawing on a rate key's token bucket. Besides
// the rates they check the limits from the steps' side: the steps of one key
// running at once (never above its limit) and the steps started in any
// window (never above the bucket's rate times the window plus its burst).

// KeyedFigures are the keyed workload's figures (and keyed-unkeyed's, the
// same children without keys, where the key figures are zero).
type KeyedFigures struct {
	// Keys and Limit are the concurrency keys and each key's
	// ConcurrencyLimit; 0 for keyed-unkeyed.
	Keys  int `json:"keys"`
	Limit int `json:"limit"`
	// ChildrenPerParent children of one step each per parent.
	ChildrenPerParent int `json:"children_per_parent"`
	// The children's step time (a sleep): the range it is drawn from
	// uniformly, the mean of the draws for the drained instances, and the
	// mean time measured in the children's steps (the sleeps overshoot).
	StepTimeMinMs      float64 `json:"step_time_min_ms"`
	StepTimeMaxMs      float64 `json:"step_time_max_ms"`
	StepTimeMeanMs     float64 `json:"step_time_mean_ms"`
	StepTimeMeasuredMs float64 `json:"step_time_measured_ms"`
	// ChildStepsPerSec is the children's steps per second of the drain
	// (FlowResult.StepsPerSec counts every step, spawns and joins too).
	// ChildWindowStepsPerSec is over the children's window instead: the
	// first child step's start to the last one's end (what DBOS's harness
	// reports beside its run's rate, which its parents' polling of their
	// children's results stretches).
	ChildStepsPerSec       float64 `json:"children_steps_per_sec"`
	ChildWindowStepsPerSec float64 `json:"children_window_steps_per_sec"`
	// IdealStepsPerSec is the limit-bound ideal: every key's slots always
	// busy, Keys × Limit ÷ StepTimeMeanMs; OfIdeal is ChildStepsPerSec's
	// share of it. Keyed only.
	IdealStepsPerSec float64 `json:"ideal_children_steps_per_sec,omitempty"`
	OfIdeal          float64 `json:"of_ideal,omitempty"`
	// OfMeasuredIdeal is ChildStepsPerSec's share of the ideal at the step
	// time measured instead (Keys × Limit ÷ StepTimeMeasuredMs): the
	// sleeps' overshoot on a busy machine is the steps' time, not the
	// runner's. Keyed only.
	OfMeasuredIdeal float64 `json:"of_measured_ideal,omitempty"`
	// SlotsBusy is the share of each key's slots taken by its children's
	// steps from the key's first step start to its last step end (Limit
	// slots over that window), the mean over the keys: how little a key's
	// slots idle between one step's end and the next one's start while
	// the key has work. Keyed only.
	SlotsBusy float64 `json:"slots_busy,omitempty"`
	// UnkeyedStepsPerSec is keyed-unkeyed's ChildStepsPerSec, run in the
	// same invocation, and OfUnkeyed this workload's share of it. Keyed
	// only, when keyed-unkeyed ran.
	UnkeyedStepsPerSec float64 `json:"unkeyed_children_steps_per_sec,omitempty"`
	OfUnkeyed          float64 `json:"of_unkeyed,omitempty"`
	// MaxRunningPerKey is the most children's steps of one key seen running
	// at once (counted in the step function, in the drain and the paced
	// phase), the largest of MaxRunningByKey; it must not exceed Limit.
	// MaxRunning is the most children's steps running at once, all keys.
	MaxRunningPerKey int   `json:"max_running_per_key"`
	MaxRunningByKey  []int `json:"max_running_by_key,omitempty"`
	MaxRunning       int   `json:"max_running"`
	// LongestGapMs is the longest time between two children's step starts
	// (any keys) in the drain: a stall of the workload shows as a gap far
	// above the step time.
	LongestGapMs float64 `json:"longest_gap_ms"`
}

// RateFigures are the ratelimited workload's figures, from the start times
// of its steps in the drain.
type RateFigures struct {
	// PerSecond and Burst are the rate key's token bucket.
	PerSecond float64 `json:"per_second"`
	Burst     float64 `json:"burst"`
	// Starts is how many steps started.
	Starts int `json:"starts"`
	// AchievedPerSecond is the steps started per second after the first
	// Burst ones (from the start of step Burst to the last one's), and
	// OfConfigured its share of PerSecond.
	AchievedPerSecond float64 `json:"achieved_per_second"`
	OfConfigured      float64 `json:"of_configured"`
	// MaxIn1s is the most steps started in any window of one second;
	// Overshoot1s is MaxIn1s − (PerSecond × 1 s + Burst), at most 0 when the
	// bucket holds. Likewise in 100 ms windows.
	MaxIn1s        int     `json:"max_starts_in_1s"`
	Overshoot1s    float64 `json:"overshoot_1s"`
	MaxIn100ms     int     `json:"max_starts_in_100ms"`
	Overshoot100ms float64 `json:"overshoot_100ms"`
	// The same at the claims: each step counted when the claim call that
	// leased it was sent (the claim takes its tokens as it starts). A step
	// starts after its claim's whole run and the runner's dispatch, which
	// vary by several milliseconds on a busy machine and crowd a window's
	// starts beyond what the bucket let through: the claims' figures are
	// the bucket's, the starts' what a called service would see.
	ClaimGrants         int     `json:"claim_grants"`
	ClaimMaxIn1s        int     `json:"claim_max_in_1s"`
	ClaimOvershoot1s    float64 `json:"claim_overshoot_1s"`
	ClaimMaxIn100ms     int     `json:"claim_max_in_100ms"`
	ClaimOvershoot100ms float64 `json:"claim_overshoot_100ms"`
}

// RunnerLog counts what the runners logged during a workload.
type RunnerLog struct {
	// Deadlocks is the records (any level) whose message or attributes
	// carry "deadlock detected" or SQLSTATE 40P01; ServerDeadlocks the
	// deadlocks the server counted in the database meanwhile
	// (pg_stat_database; any session of the database).
	Deadlocks       int64 `json:"deadlocks"`
	ServerDeadlocks int64 `json:"server_deadlocks"`
	// Warnings and Errors are the records at Warn and at Error level;
	// Messages counts them by message.
	Warnings int64            `json:"warnings"`
	Errors   int64            `json:"errors"`
	Messages map[string]int64 `json:"messages,omitempty"`
}

// logCounts is what a countingHandler counted.
type logCounts struct {
	mu  sync.Mutex
	log RunnerLog
}

func (c *logCounts) snapshot() RunnerLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.log
	if c.log.Messages != nil {
		out.Messages = make(map[string]int64, len(c.log.Messages))
		for k, v := range c.log.Messages {
			out.Messages[k] = v
		}
	}
	return out
}

// countingHandler counts the runners' records (deadlocks, warnings, errors)
// and passes those its inner handler takes on to it.
type countingHandler struct {
	inner slog.Handler
	c     *logCounts
	// attrs are those given With, searched for deadlocks too.
	attrs string
}

func newCountingLogger(inner *slog.Logger) (*slog.Logger, *logCounts) {
	c := &logCounts{}
	return slog.New(&countingHandler{inner: inner.Handler(), c: c}), c
}

// Enabled is true at every level: a deadlock is counted whatever the level
// of its record.
func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteByte(' ')
		b.WriteString(a.String())
		return true
	})
	text := b.String()
	deadlock := strings.Contains(text, "deadlock detected") || strings.Contains(text, "40P01")
	if deadlock || r.Level >= slog.LevelWarn {
		h.c.mu.Lock()
		if deadlock {
			h.c.log.Deadlocks++
		}
		switch {
		case r.Level >= slog.LevelError:
			h.c.log.Errors++
		case r.Level >= slog.LevelWarn:
			h.c.log.Warnings++
		}
		if r.Level >= slog.LevelWarn {
			if h.c.log.Messages == nil {
				h.c.log.Messages = map[string]int64{}
			}
			h.c.log.Messages[r.Message]++
		}
		h.c.mu.Unlock()
	}
	if h.inner.Enabled(ctx, r.Level) {
		return h.inner.Handle(ctx, r)
	}
	return nil
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		b.WriteByte(' ')
		b.WriteString(a.String())
	}
	return &countingHandler{inner: h.inner.WithAttrs(as), c: h.c, attrs: b.String()}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{inner: h.inner.WithGroup(name), c: h.c, attrs: h.attrs}
}

// ParseStepTime parses --step-time: "MIN-MAX" (e.g. 2ms-10ms) or one
// duration for a fixed time; 0 <= MIN <= MAX.
func ParseStepTime(s string) (lo, hi time.Duration, err error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		b = a
	}
	lo, err = time.ParseDuration(strings.TrimSpace(a))
	if err == nil {
		hi, err = time.ParseDuration(strings.TrimSpace(b))
	}
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("--step-time %q: use MIN-MAX, e.g. 2ms-10ms, or one duration", s)
	case lo < 0 || hi < 0:
		return 0, 0, fmt.Errorf("--step-time %q: durations must not be negative", s)
	case lo > hi:
		return 0, 0, fmt.Errorf("--step-time %q: the minimum %s is above the maximum %s", s, lo, hi)
	}
	return lo, hi, nil
}

// FormatStepTime is ParseStepTime's inverse.
func FormatStepTime(lo, hi time.Duration) string {
	if lo == hi {
		return lo.String()
	}
	return lo.String() + "-" + hi.String()
}

// keyTracker counts the children's steps running, by key: entered on a
// step's entry, left on its exit.
type keyTracker struct {
	mu        sync.Mutex
	running   []int
	maxByKey  []int
	total     int
	maxTotal  int
	steps     int64
	stepNanos int64
	lastEnter time.Time
	// While gaps is on (the drain): maxGap is the longest time between two
	// entries, first the first entry, last the last exit and exits the
	// exits.
	gaps        bool
	maxGap      time.Duration
	first, last time.Time
	exits       int64
	// By key, in the drain: the first step start, the last step end and
	// the steps' time.
	keyFirst, keyLast []time.Time
	keyBusy           []time.Duration
}

func newKeyTracker(keys int) *keyTracker {
	return &keyTracker{running: make([]int, keys), maxByKey: make([]int, keys),
		keyFirst: make([]time.Time, keys), keyLast: make([]time.Time, keys), keyBusy: make([]time.Duration, keys)}
}

// enter counts a step of key (-1: none) in.
func (t *keyTracker) enter(key int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key >= 0 {
		t.running[key]++
		t.maxByKey[key] = max(t.maxByKey[key], t.running[key])
	}
	t.total++
	t.maxTotal = max(t.maxTotal, t.total)
	now := time.Now()
	if t.gaps && !t.lastEnter.IsZero() {
		t.maxGap = max(t.maxGap, now.Sub(t.lastEnter))
	}
	if t.gaps && t.first.IsZero() {
		t.first = now
	}
	t.lastEnter = now
}

// stopGaps ends the gaps' measure (at the drain's end), the time since the
// last entry included: a drain stopped while stalled shows its stall.
func (t *keyTracker) stopGaps() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gaps && !t.lastEnter.IsZero() {
		t.maxGap = max(t.maxGap, time.Since(t.lastEnter))
	}
	t.gaps = false
}

func (t *keyTracker) exit(key int, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key >= 0 {
		t.running[key]--
	}
	t.total--
	t.steps++
	t.stepNanos += int64(took)
	if t.gaps {
		t.last = time.Now()
		t.exits++
		if key >= 0 {
			if start := t.last.Add(-took); t.keyFirst[key].IsZero() || start.Before(t.keyFirst[key]) {
				t.keyFirst[key] = start
			}
			t.keyLast[key] = t.last
			t.keyBusy[key] += took
		}
	}
}

func (t *keyTracker) figures(k *KeyedFigures) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k.Keys > 0 {
		k.MaxRunningByKey = slices.Clone(t.maxByKey)
		k.MaxRunningPerKey = slices.Max(t.maxByKey)
	}
	k.MaxRunning = t.maxTotal
	k.LongestGapMs = ms(t.maxGap)
	if d := t.last.Sub(t.first); d > 0 {
		k.ChildWindowStepsPerSec = float64(t.exits) / d.Seconds()
	}
	if t.steps > 0 {
		k.StepTimeMeasuredMs = float64(t.stepNanos) / float64(t.steps) / 1e6
	}
	if k.Keys > 0 && k.Limit > 0 {
		var sum float64
		n := 0
		for key := range t.keyBusy {
			if w := t.keyLast[key].Sub(t.keyFirst[key]); w > 0 {
				sum += t.keyBusy[key].Seconds() / (float64(k.Limit) * w.Seconds())
				n++
			}
		}
		if n > 0 {
			k.SlotsBusy = sum / float64(n)
		}
	}
}

// keyedParent is a keyed parent's state: its children's keys (-1: none)
// and step times, drawn when it is started.
type keyedParent struct {
	Prev  int64   `json:"prev"`
	Keys  []int   `json:"keys"`
	Sleep []int64 `json:"sleep_ns"`
}

type keyedChild struct {
	Prev  int64 `json:"prev"`
	Key   int   `json:"key"`
	Sleep int64 `json:"sleep_ns"`
}

// keyedChildren is how many children each keyed parent spawns.
const keyedChildren = 3

// keyedWorkload is the keyed workload (keys true) or keyed-unkeyed: the
// same parents, children and step times (same seed), the children without
// concurrency keys.
type keyedWorkload struct {
	keys, limit int
	lo, hi      time.Duration
	keyed       bool
	rng         *rand.Rand
	tracker     *keyTracker
	parentsDone atomic.Int64
	// drawn sums the step times drawn while counting (the drain's).
	counting bool
	drawn    time.Duration
	drawnN   int
	parent   *wharfflow.Flow[keyedParent]
	child    *wharfflow.Flow[keyedChild]
}

func newKeyedWorkload(o FlowOptions, keyed bool, lat, span *latencies) *keyedWorkload {
	w := &keyedWorkload{keys: o.ConcurrencyKeys, limit: o.ConcurrencyLimit, lo: o.StepTimeMin, hi: o.StepTimeMax, keyed: keyed,
		rng: rand.New(rand.NewPCG(o.Seed, 0x6b65796564)), tracker: newKeyTracker(o.ConcurrencyKeys), counting: true}
	w.tracker.gaps = true
	w.child = wharfflow.New[keyedChild]("keyed_child", nil).Step("work", func(ctx context.Context, s *keyedChild, _ wharfflow.Input) wharfflow.Outcome {
		t0 := time.Now()
		lat.add(s.Prev)
		w.tracker.enter(s.Key)
		sleepCtx(ctx, time.Duration(s.Sleep))
		w.tracker.exit(s.Key, time.Since(t0))
		return wharfflow.Done(t0.UnixNano())
	})
	w.parent = wharfflow.New[keyedParent]("keyed_parent", nil).
		Step("fan", func(_ context.Context, s *keyedParent, _ wharfflow.Input) wharfflow.Outcome {
			s.Prev = time.Now().UnixNano()
			kids := make([]wharfflow.Child, len(s.Keys))
			for i, k := range s.Keys {
				var opts wharfflow.Options
				if k >= 0 {
					opts = wharfflow.Options{ConcurrencyKey: keyName(k), ConcurrencyLimit: w.limit}
				}
				kids[i] = w.child.Child(keyedChild{Prev: s.Prev, Key: k, Sleep: s.Sleep[i]}, opts)
			}
			return wharfflow.Spawn("join", kids...)
		}).
		Step("join", func(_ context.Context, s *keyedParent, in wharfflow.Input) wharfflow.Outcome {
			var last int64
			for _, ch := range in.Children {
				var started int64
				_ = json.Unmarshal(ch.Result, &started)
				last = max(last, started)
			}
			lat.add(last)
			span.add(s.Prev)
			w.parentsDone.Add(1)
			return wharfflow.Done(nil)
		})
	return w
}

func keyName(k int) string { return "key" + strconv.Itoa(k) }

// start draws a parent's children's keys and step times. Called from one
// goroutine (the pre-fill, then the paced phase).
func (w *keyedWorkload) start(int) wharfflow.Start {
	s := keyedParent{Keys: make([]int, keyedChildren), Sleep: make([]int64, keyedChildren)}
	for i := range keyedChildren {
		k := w.rng.IntN(w.keys)
		d := w.lo
		if w.hi > w.lo {
			d += time.Duration(w.rng.Int64N(int64(w.hi-w.lo) + 1))
		}
		if !w.keyed {
			k = -1
		}
		s.Keys[i], s.Sleep[i] = k, int64(d)
		if w.counting {
			w.drawn += d
			w.drawnN++
		}
	}
	return w.parent.Start(s, wharfflow.StartOptions{})
}

// figures fills the keyed figures of a drain of elapsed.
func (w *keyedWorkload) figures(res *FlowResult, elapsed time.Duration) {
	w.tracker.stopGaps()
	k := &KeyedFigures{ChildrenPerParent: keyedChildren, StepTimeMinMs: ms(w.lo), StepTimeMaxMs: ms(w.hi)}
	if w.keyed {
		k.Keys, k.Limit = w.keys, w.limit
	}
	if w.drawnN > 0 {
		k.StepTimeMeanMs = ms(w.drawn / time.Duration(w.drawnN))
	}
	k.ChildStepsPerSec = float64(w.parentsDone.Load()*keyedChildren) / elapsed.Seconds()
	if w.keyed && k.StepTimeMeanMs > 0 {
		k.IdealStepsPerSec = float64(w.keys*w.limit) / (k.StepTimeMeanMs / 1000)
		k.OfIdeal = k.ChildStepsPerSec / k.IdealStepsPerSec
	}
	w.tracker.figures(k)
	if w.keyed && k.StepTimeMeasuredMs > 0 {
		k.OfMeasuredIdeal = k.ChildStepsPerSec / (float64(w.keys*w.limit) / (k.StepTimeMeasuredMs / 1000))
	}
	res.Keyed = k
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// rateSteps is how many steps each ratelimited instance runs, each taking
// a token.
const rateSteps = 3

// rateWorkload is the ratelimited workload: instances of rateSteps empty
// steps under one rate key; each step's start is recorded.
type rateWorkload struct {
	perSecond, burst float64
	mu               sync.Mutex
	starts           []time.Time
	done             atomic.Int64
	flow             *wharfflow.Flow[benchState]
}

// rateKey is the ratelimited workload's rate key.
const rateKey = "rl"

func newRateWorkload(o FlowOptions) *rateWorkload {
	w := &rateWorkload{perSecond: o.RateLimit, burst: o.RateBurst}
	step := func(next string) wharfflow.StepFunc[benchState] {
		return func(context.Context, *benchState, wharfflow.Input) wharfflow.Outcome {
			now := time.Now()
			w.mu.Lock()
			w.starts = append(w.starts, now)
			w.mu.Unlock()
			if next == "" {
				w.done.Add(1)
				return wharfflow.Done(nil)
			}
			return wharfflow.Next(next)
		}
	}
	w.flow = wharfflow.New[benchState]("ratelimited", nil).Step("a", step("b")).Step("b", step("c")).Step("c", step(""))
	return w
}

// instances is how many instances keep the bucket busy for d: the burst,
// then d at the rate.
func (w *rateWorkload) instances(d time.Duration) int {
	steps := w.perSecond*d.Seconds() + w.burst
	return max(1, int((steps+rateSteps-1)/rateSteps))
}

func (w *rateWorkload) start(int) wharfflow.Start {
	return w.flow.Start(benchState{}, wharfflow.StartOptions{Options: wharfflow.Options{RateKey: rateKey}})
}

// figures fills the rate figures from the steps' starts and the claims'
// grants.
func (w *rateWorkload) figures(res *FlowResult, granted []time.Time) {
	w.mu.Lock()
	ts := slices.Clone(w.starts)
	w.mu.Unlock()
	res.Rate = rateFigures(ts, w.perSecond, w.burst)
	g := rateFigures(granted, w.perSecond, w.burst)
	res.Rate.ClaimGrants = g.Starts
	res.Rate.ClaimMaxIn1s, res.Rate.ClaimOvershoot1s = g.MaxIn1s, g.Overshoot1s
	res.Rate.ClaimMaxIn100ms, res.Rate.ClaimOvershoot100ms = g.MaxIn100ms, g.Overshoot100ms
}

// rateFigures computes the rate figures of the steps' start times.
func rateFigures(ts []time.Time, perSecond, burst float64) *RateFigures {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	r := &RateFigures{PerSecond: perSecond, Burst: burst, Starts: len(ts)}
	if b := int(burst); len(ts) > b+1 {
		if d := ts[len(ts)-1].Sub(ts[b]); d > 0 {
			r.AchievedPerSecond = float64(len(ts)-1-b) / d.Seconds()
			r.OfConfigured = r.AchievedPerSecond / perSecond
		}
	}
	r.MaxIn1s = maxInWindow(ts, time.Second)
	r.Overshoot1s = float64(r.MaxIn1s) - (perSecond + burst)
	r.MaxIn100ms = maxInWindow(ts, 100*time.Millisecond)
	r.Overshoot100ms = float64(r.MaxIn100ms) - (perSecond/10 + burst)
	return r
}

// maxInWindow is the most of the sorted times in any window [t, t+w).
func maxInWindow(ts []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// writeKeyedSummary prints the keyed figures of a keyed or keyed-unkeyed
// result.
func writeKeyedSummary(w io.Writer, r FlowResult) error {
	k := r.Keyed
	if k == nil {
		return nil
	}
	steps := fmt.Sprintf("%s: children %.0f steps/s (%.0f/s over the children's window; all steps %.0f/s; step time %s, mean %.2f ms drawn, %.2f ms measured)",
		r.Workload, k.ChildStepsPerSec, k.ChildWindowStepsPerSec, r.StepsPerSec, FormatStepTime(time.Duration(k.StepTimeMinMs*1e6), time.Duration(k.StepTimeMaxMs*1e6)),
		k.StepTimeMeanMs, k.StepTimeMeasuredMs)
	if k.Keys == 0 {
		_, err := fmt.Fprintf(w, "%s; at most %d running at once; longest gap between two children's starts %.0f ms\n",
			steps, k.MaxRunning, k.LongestGapMs)
		return err
	}
	line := fmt.Sprintf("%s; limit-bound ideal %.0f/s (%d keys × %d ÷ %.2f ms): %.2f of it (%.2f at the measured step time); "+
		"key slots busy %.2f of each key's window", steps, k.IdealStepsPerSec,
		k.Keys, k.Limit, k.StepTimeMeanMs, k.OfIdeal, k.OfMeasuredIdeal, k.SlotsBusy)
	if k.UnkeyedStepsPerSec > 0 {
		line += fmt.Sprintf("; without keys %.0f/s: %.2f of it", k.UnkeyedStepsPerSec, k.OfUnkeyed)
	}
	verdict := "within the limit"
	if k.MaxRunningPerKey > k.Limit {
		verdict = "OVER THE LIMIT"
	}
	byKey := make([]string, len(k.MaxRunningByKey))
	for i, n := range k.MaxRunningByKey {
		byKey[i] = strconv.Itoa(n)
	}
	_, err := fmt.Fprintf(w, "%s\n%s: most running at once: %d of one key, limit %d, %s (by key %s); %d of all keys (%d slots); "+
		"longest gap between two children's starts %.0f ms\n",
		line, r.Workload, k.MaxRunningPerKey, k.Limit, verdict, strings.Join(byKey, " "), k.MaxRunning, k.Keys*k.Limit, k.LongestGapMs)
	return err
}

// writeRateSummary prints the ratelimited figures.
func writeRateSummary(w io.Writer, r FlowResult) error {
	f := r.Rate
	if f == nil {
		return nil
	}
	_, err := fmt.Fprintf(w, "%s: %.1f steps started/s after the first burst (bucket %g/s, burst %g): %.3f of it; "+
		"most starts in any 1 s %d (rate × 1 s + burst = %g: overshoot %+g), in any 100 ms %d (%g: overshoot %+g)\n"+
		"%s: at the claims (%d steps leased, each counted when its claim was sent): most in any 1 s %d (overshoot %+g), "+
		"in any 100 ms %d (overshoot %+g); the starts lag their claims by the claim's run and the dispatch, which crowds them\n",
		r.Workload, f.AchievedPerSecond, f.PerSecond, f.Burst, f.OfConfigured,
		f.MaxIn1s, f.PerSecond+f.Burst, f.Overshoot1s, f.MaxIn100ms, f.PerSecond/10+f.Burst, f.Overshoot100ms,
		r.Workload, f.ClaimGrants, f.ClaimMaxIn1s, f.ClaimOvershoot1s, f.ClaimMaxIn100ms, f.ClaimOvershoot100ms)
	return err
}

// writeRunnerLog prints what the runners logged, the most frequent
// messages first.
func writeRunnerLog(w io.Writer, r FlowResult) error {
	l := r.RunnerLog
	line := fmt.Sprintf("%s: runner log: %d deadlock detected (server counted %d), %d warnings, %d errors", r.Workload,
		l.Deadlocks, l.ServerDeadlocks, l.Warnings, l.Errors)
	msgs := slices.Collect(maps.Keys(l.Messages))
	slices.SortFunc(msgs, func(a, b string) int { return cmp.Or(cmp.Compare(l.Messages[b], l.Messages[a]), strings.Compare(a, b)) })
	for i, m := range msgs {
		if i == 0 {
			line += ":"
		} else {
			line += ";"
		}
		line += fmt.Sprintf(" %q ×%d", m, l.Messages[m])
	}
	_, err := fmt.Fprintln(w, line)
	return err
}
