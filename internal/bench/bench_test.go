package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// databaseURL is set by TestMain (main_test.go), which also lets the test
// binary stand in for the wharf executable in relay-process tests.
var databaseURL string

// The smoke tests are benchmarks in miniature: they run one after another,
// not in parallel, so that they do not fight for the CPU.

func smokeOptions(mode Mode) Options {
	return Options{
		Mode:           mode,
		DatabaseURL:    databaseURL,
		InProcess:      true,
		Relays:         1,
		SampleInterval: 100 * time.Millisecond,
		Warmup:         500 * time.Millisecond,
		TailWait:       5 * time.Second,
		// A short idle poll keeps the backlog's noise well under the 1 %
		// slope criterion in a 3-second run.
		RelayConfig: wharf.Config{PollInterval: 5 * time.Millisecond},
	}
}

// decode round-trips r through JSON and returns the top-level fields.
func decode(t *testing.T, r *Result) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, r))
	var m map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &m))
	for _, f := range []string{"mode", "target_rate", "producer_rate", "processing_rate", "backlog_slope", "backlog_at_stop",
		"drain_seconds", "sustainable", "verdict_reason", "latency_ms", "wal_bytes_per_msg", "commits_per_msg",
		"dead_tuples", "relay_cpu_seconds", "relay_peak_rss_bytes", "messages", "relays", "settings"} {
		require.Contains(t, m, f)
	}
	return m
}

func TestDrain(t *testing.T) {
	o := smokeOptions(ModeDrain)
	o.Messages = 20000
	var progress bytes.Buffer
	o.Progress = &progress
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "drain", m["mode"])
	require.EqualValues(t, 20000, r.Messages)
	require.EqualValues(t, 20000, r.Delivered)
	require.Zero(t, r.OutboxRemaining)
	require.Positive(t, r.DrainSeconds)
	require.Positive(t, r.ProcessingRate)
	require.Positive(t, r.ProducerRate)
	require.Positive(t, r.WALBytesPerMsg)
	require.Positive(t, r.CommitsPerMsg)
	require.Positive(t, r.RelayCPUSeconds)
	require.Positive(t, r.RelayPeakRSSBytes)
	require.Nil(t, r.LatencyMS)
	require.NotEmpty(t, r.Samples)

	// The presentation: summary, report files.
	var sum bytes.Buffer
	require.NoError(t, WriteSummary(&sum, r))
	require.Contains(t, sum.String(), "processing rate")
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, r))
	csvData, err := os.ReadFile(filepath.Join(dir, "samples.csv"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(csvData), "second,produced,processed,backlog,p50_ms,p99_ms,cpu_pct\n"))
	html, err := os.ReadFile(filepath.Join(dir, "index.html"))
	require.NoError(t, err)
	require.Contains(t, string(html), "<svg")
	require.NotContains(t, string(html), "<script")
}

func TestBaseline(t *testing.T) {
	o := smokeOptions(ModeBaseline)
	o.Duration = 2 * time.Second
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "baseline", m["mode"])
	require.Positive(t, r.ProducerRate)
	require.Positive(t, r.Messages)
	require.Zero(t, r.Relays)
	require.Equal(t, r.Messages, r.OutboxRemaining, "nothing relays in a baseline")
	require.Positive(t, r.SinkPublishRate)
	require.Positive(t, r.WALBytesPerMsg)
	// 100-message transactions: about one commit per 100 messages.
	require.Less(t, r.CommitsPerMsg, 0.05)
}

func TestSteady(t *testing.T) {
	o := smokeOptions(ModeSteady)
	o.Rate = 2000
	o.Duration = 3 * time.Second
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "steady", m["mode"])
	require.True(t, r.Sustainable, r.VerdictReason)
	require.NotNil(t, r.LatencyMS)
	require.Positive(t, r.LatencyMS.P50)
	require.LessOrEqual(t, r.LatencyMS.P50, r.LatencyMS.P99)
	require.LessOrEqual(t, r.LatencyMS.P99, r.LatencyMS.Max)
	require.InDelta(t, 2000, r.ProducerRate, 100)
	require.InDelta(t, 2000, r.ProcessingRate, 300)
	require.GreaterOrEqual(t, r.DrainSeconds, 0.0, "the relay caught up")
	require.Equal(t, r.Messages, r.Delivered)
	require.Zero(t, r.OutboxRemaining)
	// 3.5 s at 2000/s, in batches of 100.
	require.InDelta(t, 7000, r.Messages, 200)
}

func TestSweep(t *testing.T) {
	o := smokeOptions(ModeSweep)
	o.MinRate, o.MaxRate = 1000, 5000
	o.SweepSteps = 2
	o.Duration = 2 * time.Second
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "sweep", m["mode"])
	require.Len(t, r.Steps, 2)
	require.Equal(t, 3000, r.Steps[0].Rate)
	require.True(t, r.Sustainable, r.VerdictReason)
	require.GreaterOrEqual(t, r.TargetRate, 1000.0)
	require.LessOrEqual(t, r.TargetRate, 5000.0)
}

func TestDrainRelayProcesses(t *testing.T) {
	t.Setenv(RelayHelperEnv, "1")
	o := smokeOptions(ModeDrain)
	o.InProcess = false
	o.Relays = 2
	o.Messages = 20000
	o.RelayCommand = []string{os.Args[0]}
	o.RelayArgs = []string{"--poll-interval=5ms"}
	var stderr bytes.Buffer
	o.RelayStderr = &stderr
	r, err := Run(context.Background(), o)
	require.NoError(t, err, stderr.String())
	decode(t, r)
	require.Equal(t, 2, r.Relays)
	require.EqualValues(t, 20000, r.Delivered)
	require.Zero(t, r.OutboxRemaining)
	require.Nil(t, r.LatencyMS)
	require.Contains(t, r.LatencyNote, "n/a")
	require.Positive(t, r.RelayCPUSeconds)
	require.Positive(t, r.RelayPeakRSSBytes)
	require.Contains(t, r.RelayUsageNote, "2 relay processes")
}

func TestRelayProcessFailureIsReported(t *testing.T) {
	t.Setenv(RelayHelperEnv, "1")
	o := smokeOptions(ModeSteady)
	o.InProcess = false
	o.Rate = 1000
	o.RelayCommand = []string{os.Args[0]}
	o.RelayArgs = []string{"--no-such-flag"}
	_, err := Run(context.Background(), o)
	require.ErrorContains(t, err, "relay process 1")
}

func TestRelayProcessesNeedAnExecutable(t *testing.T) {
	o := smokeOptions(ModeDrain)
	o.InProcess = false
	o.Relays = 2
	o.Messages = 100
	o.RelayCommand = []string{filepath.Join(t.TempDir(), "no-such-wharf")}
	_, err := Run(context.Background(), o)
	require.ErrorContains(t, err, "--relays")
}

func TestOptionsErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		o    Options
		flag string
	}{
		{Options{DatabaseURL: "x"}, "--mode"},
		{Options{Mode: "fast", DatabaseURL: "x"}, "--mode"},
		{Options{Mode: ModeSteady, DatabaseURL: "x"}, "--rate"},
		{Options{Mode: ModeSweep, DatabaseURL: "x", MinRate: 5, MaxRate: 5}, "--max-rate"},
		{Options{Mode: ModeDrain, DatabaseURL: "x", Relays: 2, InProcess: true}, "--in-process"},
		{Options{Mode: ModeDrain, DatabaseURL: "x", PayloadBytes: 1}, "--payload-bytes"},
	} {
		err := c.o.Validate()
		require.ErrorContains(t, err, c.flag)
		require.NotContains(t, err.Error(), "\n")
	}
	_, err := Run(context.Background(), Options{Mode: ModeDrain})
	require.ErrorContains(t, err, "--database-url")
}

func TestSlope(t *testing.T) {
	require.Zero(t, Slope(nil, nil))
	require.Zero(t, Slope([]float64{1}, []float64{5}))
	require.Zero(t, Slope([]float64{2, 2}, []float64{1, 3}))
	require.InDelta(t, 3, Slope([]float64{0, 1, 2, 3}, []float64{1, 4, 7, 10}), 1e-9)
	require.InDelta(t, -2, Slope([]float64{1, 2, 3}, []float64{10, 8, 6}), 1e-9)
	// Noise around a flat line: the fit, not the end points.
	require.InDelta(t, 0, Slope([]float64{0, 1, 2, 3, 4}, []float64{0, 10, 0, 10, 0}), 1e-9)
	require.InDelta(t, 0.5, Slope([]float64{0, 1, 2, 3}, []float64{0, 1, 0, 2}), 1e-9)
}

func TestVerdict(t *testing.T) {
	ok, why := Verdict(10000, 9950, 50, 15000)
	require.True(t, ok, why)
	require.True(t, strings.HasPrefix(why, "met: "))

	ok, why = Verdict(10000, 9850, 0, 0) // under 99 % of the target
	require.False(t, ok)
	require.Contains(t, why, "producer 9850")

	ok, why = Verdict(10000, 10000, 101, 0) // growing faster than 1 %
	require.False(t, ok)
	require.Contains(t, why, "failed: backlog slope")

	ok, _ = Verdict(10000, 10000, 100, 20000) // both limits inclusive
	require.True(t, ok)
	ok, why = Verdict(10000, 10000, 0, 20001)
	require.False(t, ok)
	require.Contains(t, why, "backlog at stop")

	// Low rates: the slope limit is at least 1 msg/s.
	ok, _ = Verdict(50, 50, 1, 0)
	require.True(t, ok)
	ok, _ = Verdict(50, 50, 1.01, 0)
	require.False(t, ok)

	ok, _ = Verdict(0, 0, 0, 0)
	require.False(t, ok)
}

func TestHistogram(t *testing.T) {
	h := newHistogram()
	require.Zero(t, h.quantile(0.5))
	require.Nil(t, h.latency())
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	require.InEpsilon(t, 500, h.quantile(0.5), 0.01)
	require.InEpsilon(t, 990, h.quantile(0.99), 0.01)
	require.InDelta(t, 1000, h.quantile(1), 1e-9)
	// Buckets are contiguous and monotonic.
	for us := uint64(0); us < 1<<20; us += 7 {
		b := bucketOf(us)
		require.LessOrEqual(t, bucketOf(us), bucketOf(us+7))
		v := bucketValue(b)
		require.InDelta(t, float64(us), float64(v), float64(us)/100+1)
	}
}

func TestTracker(t *testing.T) {
	start := time.Now()
	tr := newTracker(start, 0)
	tr.committed([]int64{1, 2, 3}, start.Add(10*time.Millisecond))
	tr.ackedIDs([]int64{1, 2}, start.Add(30*time.Millisecond))
	// Acknowledged before the producer recorded the commit: zero latency.
	tr.ackedIDs([]int64{4}, start.Add(31*time.Millisecond))
	tr.committed([]int64{4}, start.Add(40*time.Millisecond))
	tr.ackedIDs([]int64{1, 4}, start.Add(50*time.Millisecond)) // redeliveries
	require.EqualValues(t, 3, tr.acked.Load())
	lat, dups := tr.summary()
	require.EqualValues(t, 2, dups)
	require.EqualValues(t, 3, lat.Count)
	require.InDelta(t, 20, lat.Max, 0.5)
	require.Zero(t, tr.takeInterval().quantile(0))

	// A chunk whose ids were all committed and acknowledged is freed, and a
	// late redelivery into it counts as a duplicate.
	ids := make([]int64, 1<<chunkBits)
	for i := range ids {
		ids[i] = int64(1<<chunkBits + i)
	}
	tr.committed(ids, start)
	tr.ackedIDs(ids, start.Add(time.Millisecond))
	require.NotContains(t, tr.chunks, int64(1))
	tr.ackedIDs(ids[:1], start.Add(time.Second))
	_, dups = tr.summary()
	require.EqualValues(t, 3, dups)
}
