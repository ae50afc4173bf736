package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// soakMinDuration is the shortest soak window: a trend needs time.
	soakMinDuration = 30 * time.Second
	// soakSamples is about how many samples a soak takes (its interval is
	// the run's length divided by it, at least a second).
	soakSamples = 200
)

// Soak is what a soak run adds to the steady verdict: each resource's trend
// over the measurement window, tested like the backlog's growth.
type Soak struct {
	// Flat reports that no trend rose faster than its tolerance.
	Flat   bool    `json:"flat"`
	Trends []Trend `json:"trends"`
}

// Trend is one sampled quantity over a soak's measurement window.
type Trend struct {
	// Name is rss_bytes, heap_bytes, goroutines, p99_ms, and dead_tuples
	// (table outbox) or slot_lag_bytes and held_bytes (WAL mode).
	Name string `json:"name"`
	// First, Last, Median and Max are the readings' values.
	First  float64 `json:"first"`
	Last   float64 `json:"last"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	// PerHour is the least-squares slope, per hour, and Upper95PerHour its
	// one-sided 95 % upper bound; TolerancePerHour is the rise allowed.
	PerHour          float64 `json:"per_hour"`
	Upper95PerHour   float64 `json:"upper_95_per_hour"`
	TolerancePerHour float64 `json:"tolerance_per_hour"`
	// Growth is the test itself (per-second units, as for the backlog).
	Growth Growth `json:"growth"`
	// Flat is false when the quantity rose faster than the tolerance with
	// 95 % confidence (or could not be tested).
	Flat bool `json:"flat"`
}

// soakTolerance is the rise per hour a quantity whose median is median may
// show and still count as flat: a fraction of its level, with a floor.
func soakTolerance(name string, median, rate float64) float64 {
	switch name {
	case "rss_bytes", "heap_bytes":
		return math.Max(4<<20, 0.05*median) // 4 MiB or 5 % per hour
	case "goroutines":
		return math.Max(2, 0.05*median)
	case "p99_ms":
		return math.Max(2, 0.10*median)
	case "slot_lag_bytes", "held_bytes":
		// WAL retained and messages held: a few seconds' worth at most
		// while the relay keeps up; 16 MiB or 10 % an hour is a leak.
		return math.Max(16<<20, 0.10*median)
	default: // dead_tuples: vacuum keeps up unless they grow like a backlog
		return 3600 * GrowthTolerance(rate)
	}
}

// soak is --mode soak: one long steady run that samples the relay process's
// resources, then tests each one's trend.
func (e *env) soak(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	res, err := e.steady(ctx, e.rateSpec(schema, "soak"))
	if err != nil {
		return nil, err
	}
	res.Mode = ModeSoak
	res.Soak = soakTrends(res.Samples, float64(o.Rate), e.wal())
	for _, t := range res.Soak.Trends {
		c := Criterion{Name: "trend_" + t.Name, Judged: t.Growth.Valid, Met: t.Flat, Detail: t.String()}
		if !c.Judged {
			c.Detail = t.Name + " trend not testable: " + t.Growth.String()
		}
		res.Criteria = append(res.Criteria, c)
		if c.Judged && !c.Met {
			res.Sustainable = false
			res.VerdictReason = "failed: " + c.Detail + "; " + res.VerdictReason
		}
	}
	if e.wal() {
		res.note("soak: every %s the bench process's resident memory (/proc/self/statm; it holds the relay, the producers and the bench), Go heap (runtime/metrics), goroutines, the WAL the outbox's replication slot retains (pg_current_wal_lsn() - confirmed_flush_lsn) and the bytes the relay holds in memory (wharf_wal_held_bytes) were read; each trend over the measurement window is tested like the backlog's growth; flat means no rise above max(4 MiB, 5 %%)/h for memory, max(2, 5 %%)/h for goroutines, max(2 ms, 10 %%)/h for p99, and max(16 MiB, 10 %%)/h for the retained WAL and the held bytes, with 95 %% confidence", o.SampleInterval)
	} else {
		res.note("soak: every %s the bench process's resident memory (/proc/self/statm; it holds the relay, the producers and the bench), Go heap (runtime/metrics), goroutines and the outbox's n_dead_tup were read; each trend over the measurement window is tested like the backlog's growth; flat means no rise above max(4 MiB, 5 %%)/h for memory, max(2, 5 %%)/h for goroutines, max(2 ms, 10 %%)/h for p99, and the backlog tolerance for dead tuples, with 95 %% confidence", o.SampleInterval)
	}
	return res, nil
}

// soakTrends tests the trend of each soak quantity over the samples of the
// measurement window; wal selects an outbox in WAL mode's quantities (the
// slot's retained WAL and the relay's held bytes instead of dead tuples).
func soakTrends(samples []Sample, rate float64, wal bool) *Soak {
	type quantity struct {
		name string
		v    func(Sample) float64
	}
	get := []quantity{
		{"rss_bytes", func(x Sample) float64 { return float64(x.RSSBytes) }},
		{"heap_bytes", func(x Sample) float64 { return float64(x.HeapBytes) }},
		{"goroutines", func(x Sample) float64 { return float64(x.Goroutines) }},
		{"p99_ms", func(x Sample) float64 { return x.P99 }},
	}
	if wal {
		get = append(get, quantity{"slot_lag_bytes", func(x Sample) float64 { return float64(x.SlotLagBytes) }},
			quantity{"held_bytes", func(x Sample) float64 { return float64(x.HeldBytes) }})
	} else {
		get = append(get, quantity{"dead_tuples", func(x Sample) float64 { return float64(x.DeadTuples) }})
	}
	// Zero is a reading for these (nothing retained, held or dead), not a
	// missing one.
	zeroCounts := map[string]bool{"dead_tuples": true, "slot_lag_bytes": true, "held_bytes": true}
	out := &Soak{Flat: true}
	for _, g := range get {
		var xs, ys []float64
		for _, x := range samples {
			// Zero is "not read" (a p99 with no acknowledgement in the
			// interval, RSS off Linux), except for dead tuples.
			if v := g.v(x); x.Phase == "measure" && (v > 0 || zeroCounts[g.name]) {
				xs, ys = append(xs, x.Seconds), append(ys, v)
			}
		}
		t := Trend{Name: g.name}
		if len(ys) > 0 {
			t.First, t.Last = ys[0], ys[len(ys)-1]
			sorted := slices.Clone(ys)
			slices.Sort(sorted)
			t.Median, t.Max = sorted[len(sorted)/2], sorted[len(sorted)-1]
		}
		t.TolerancePerHour = soakTolerance(g.name, t.Median, rate)
		t.Growth = TestGrowth(xs, ys, t.TolerancePerHour/3600)
		t.PerHour, t.Upper95PerHour = 3600*t.Growth.Slope, 3600*t.Growth.Upper
		t.Flat = !t.Growth.Growing()
		if len(ys) == 0 && !zeroCounts[g.name] {
			// Not measurable here (no /proc): not judged, not failed.
			t.Flat = true
		}
		out.Flat = out.Flat && t.Flat
		out.Trends = append(out.Trends, t)
	}
	return out
}

// String is the trend's evidence in one line.
func (t Trend) String() string {
	f := func(v float64) string {
		if strings.HasSuffix(t.Name, "_bytes") {
			return fmt.Sprintf("%.1f MiB", v/(1<<20))
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	verdict := "flat"
	if !t.Flat {
		verdict = "RISING"
	}
	return fmt.Sprintf("%s %s: %s → %s (median %s, max %s), trend %s/h (95 %% upper bound %s/h, tolerance %s/h, p = %.2g)",
		t.Name, verdict, f(t.First), f(t.Last), f(t.Median), f(t.Max), f(t.PerHour), f(t.Upper95PerHour), f(t.TolerancePerHour), t.Growth.PValue)
}

// soakReadings fills a soak sample's resource readings.
func (e *env) soakReadings(ctx context.Context, schema string, x *Sample) error {
	x.RSSBytes = residentBytes()
	x.HeapBytes = heapBytes()
	x.Goroutines = runtime.NumGoroutine()
	if e.wal() {
		if e.heldBytes != nil {
			x.HeldBytes = e.heldBytes()
		}
		// The slot is named after the schema.
		return e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1), 0)`, schema).Scan(&x.SlotLagBytes)
	}
	return e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0)`, schema).Scan(&x.DeadTuples)
}

// residentBytes is this process's resident set size now (0 where
// /proc/self/statm does not exist).
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// heapBytes is the Go heap's live and not yet swept objects.
func heapBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64()) //nolint:gosec // a heap fits in int64
}
