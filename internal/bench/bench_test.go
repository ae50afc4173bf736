package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/testtool"
)

// databaseURL is set by TestMain (main_test.go), which also lets the test
// binary stand in for the wharf executable in relay-process tests.
var databaseURL string

// The smoke tests are benchmarks in miniature: they run one after another,
// not in parallel, so that they do not fight for the CPU.

func smokeOptions(mode Mode) Options {
	return Options{
		Mode:        mode,
		DatabaseURL: databaseURL,
		InProcess:   true,
		Relays:      1,
		Warmup:      500 * time.Millisecond,
		TailWait:    5 * time.Second,
		// A short idle poll keeps the backlog's noise small in a short run.
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
		"dead_tuples", "relay_cpu_seconds", "relay_peak_rss_bytes", "messages", "relays", "settings", "environment"} {
		require.Contains(t, m, f)
	}
	env := m["environment"].(map[string]any)
	require.Positive(t, env["cores"])
	require.NotEmpty(t, env["tls"])
	names := map[string]bool{}
	for _, s := range env["postgres_settings"].([]any) {
		names[s.(map[string]any)["name"].(string)] = true
	}
	for _, n := range []string{"autovacuum", "shared_buffers", "synchronous_commit", "fsync", "max_wal_size"} {
		require.True(t, names[n], "setting %s reported", n)
	}
	return m
}

// report writes the summary and the HTML report of r and returns both.
func report(t *testing.T, r *Result) (summary, html string) {
	t.Helper()
	var sum bytes.Buffer
	require.NoError(t, WriteSummary(&sum, r))
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, r))
	b, err := os.ReadFile(filepath.Join(dir, "index.html"))
	require.NoError(t, err)
	require.Contains(t, string(b), "<svg")
	require.NotContains(t, string(b), "<script")
	for _, s := range []string{sum.String(), string(b)} {
		require.Contains(t, s, "shared_buffers=")
		require.Contains(t, s, "load average at start")
		require.Contains(t, s, "TLS")
	}
	return sum.String(), string(b)
}

func TestDrain(t *testing.T) {
	o := smokeOptions(ModeDrain)
	o.Messages = 20000
	o.Limits = true
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
	if serverRunsHere(t) {
		// The relay's backends did the fetches and removals.
		require.Positive(t, r.RelayServerCPUSeconds)
	}
	// The series runs from the relays' start to the empty outbox, however
	// short the drain: a first sample and a last one with everything
	// processed, in time order (how many lie between depends on the drain's
	// speed against the sampling interval, so it is not asserted).
	require.GreaterOrEqual(t, len(r.Samples), 2)
	last := r.Samples[len(r.Samples)-1]
	require.EqualValues(t, 20000, last.Processed)
	require.Zero(t, last.Backlog)
	for i := 1; i < len(r.Samples); i++ {
		require.GreaterOrEqual(t, r.Samples[i].Seconds, r.Samples[i-1].Seconds)
		require.GreaterOrEqual(t, r.Samples[i].Processed, r.Samples[i-1].Processed)
	}
	require.NotNil(t, r.Limits)
	require.Positive(t, r.Limits.RemovalRate)
	require.EqualValues(t, 20000, r.Limits.RemovalRows)
	require.InDelta(t, r.ProcessingRate/r.Limits.RemovalRate, r.Limits.DrainFraction, 1e-9)

	sum, html := report(t, r)
	require.Contains(t, sum, "drain rate")
	if serverRunsHere(t) {
		require.Regexp(t, `server CPU for relays +[0-9.]+ s \([0-9.]+ µs/msg\): the relays' backends`, sum)
	}
	require.Contains(t, sum, "of the removal limit")
	require.Contains(t, html, "of the removal limit")
	require.NotContains(t, html, ">produced<", "a drain produces nothing")
	require.NotContains(t, html, "--rate<", "settings of other modes are not shown")
	require.Contains(t, html, "--messages<")
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, r))
	csvData, err := os.ReadFile(filepath.Join(dir, "samples.csv"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(csvData), "second,produced,processed,backlog,p50_ms,p99_ms,cpu_pct,phase,rss_bytes,heap_bytes,goroutines,dead_tuples\n"))
}

// A table outbox's drain can be pre-filled one message per transaction
// (--messages-per-tx 1), the backlog of producers that commit one event
// each: every row has a transaction of its own, and the drain delivers them.
func TestDrainTableOutboxFilledOneMessagePerTransaction(t *testing.T) {
	o := smokeOptions(ModeDrain)
	o.ProducerBatch = 1
	o.EnqueueFill = true
	o.Producers = 2
	e := walEnv(t, o, "bench_table_fill_one")
	ctx := context.Background()
	const n = 40
	_, _, err := e.enqueueFill(ctx, e.o.Schema, n, nil)
	require.NoError(t, err)
	var rows, xids int
	require.NoError(t, e.ctl.QueryRow(ctx, "SELECT count(*), count(DISTINCT xmin::text) FROM "+e.o.Schema+".outbox").Scan(&rows, &xids))
	require.Equal(t, n, rows)
	require.Equal(t, n, xids, "one transaction per message")

	o.Messages = 2000
	r, err := Run(ctx, o)
	require.NoError(t, err)
	require.EqualValues(t, 2000, r.Delivered)
	require.Zero(t, r.OutboxRemaining)
	sum, html := report(t, r)
	require.Contains(t, sum, "pre-fill (Enqueue, 1 per tx)")
	require.Contains(t, html, "--producer-batch<")
}

func TestBaseline(t *testing.T) {
	o := smokeOptions(ModeBaseline)
	o.Duration = time.Second
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "baseline", m["mode"])
	require.Positive(t, r.ProducerRate)
	require.Positive(t, r.Messages)
	require.Equal(t, 1, r.Relays)
	require.Equal(t, r.Messages, r.Delivered, "the relays drained what the producers wrote")
	require.Zero(t, r.OutboxRemaining)
	require.Positive(t, r.ProcessingRate)
	require.Positive(t, r.SinkPublishRate)
	require.Positive(t, r.WALBytesPerMsg)
	// 100-message transactions: about one commit per 100 messages.
	require.Less(t, r.CommitsPerMsg, 0.05)
	l := r.Limits
	require.NotNil(t, l)
	require.Positive(t, l.InsertRate)
	require.Positive(t, l.RemovalRate)
	require.Equal(t, r.Messages, l.RemovalRows)
	require.InDelta(t, r.ProducerRate/l.InsertRate, l.ProducerFraction, 1e-9)
	require.InDelta(t, r.ProcessingRate/l.RemovalRate, l.DrainFraction, 1e-9)
	phases := map[string]bool{}
	for _, s := range r.Samples {
		phases[s.Phase] = true
	}
	require.Equal(t, map[string]bool{"enqueue": true, "drain": true}, phases)
	sum, html := report(t, r)
	for _, s := range []string{sum, html} {
		require.Contains(t, s, "insert limit")
		require.Contains(t, s, "removal limit")
		require.Contains(t, s, "of the insert limit")
		require.Contains(t, s, "of the removal limit")
	}
	var sb strings.Builder
	require.NoError(t, WriteJSON(&sb, r))
	require.Contains(t, sb.String(), `"producer_fraction"`)
	require.Contains(t, sb.String(), `"drain_fraction"`)
}

// A steady run at 2000 msg/s. Whether this machine sustains that rate now
// depends on what else it runs: that verdict, and the rates' closeness to
// the target, are checked only in the long run (CI); every run checks that
// the verdict is the one on the run's evidence, and the rest.
func TestSteady(t *testing.T) {
	o := smokeOptions(ModeSteady)
	o.Rate = 2000
	o.Duration = 3 * time.Second
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "steady", m["mode"])
	require.Len(t, r.Criteria, 4)
	require.NotNil(t, r.BacklogGrowth)
	j := Judge(Evidence{Target: float64(o.Rate), ProducerRate: r.ProducerRate, Growth: *r.BacklogGrowth, BacklogAtStop: r.BacklogAtStop})
	require.Equal(t, j.Criteria[:3], r.Criteria[:3], "the verdict is the one on the run's evidence")
	require.Equal(t, j.Sustainable, r.Sustainable, r.VerdictReason)
	// The producers never run ahead of the target: 3.5 s at 2000/s, in
	// batches of 100.
	require.LessOrEqual(t, r.ProducerRate, 2000*1.05)
	require.LessOrEqual(t, r.Messages, int64(7100))
	if testtool.IsLong() {
		require.True(t, r.Sustainable, r.VerdictReason)
		require.InDelta(t, 2000, r.ProducerRate, 100)
		require.InDelta(t, 2000, r.ProcessingRate, 300)
		require.InDelta(t, 7000, r.Messages, 200)
		require.Greater(t, r.BacklogGrowth.Readings, 100, "a reading every 20 ms over 3 s")
		// Sampled every 100 ms: the charts have points to draw.
		require.Greater(t, len(r.Samples), 25)
	}
	require.True(t, r.BacklogGrowth.Valid)
	require.Equal(t, r.BacklogGrowth.Slope, r.BacklogSlope)
	require.NotNil(t, r.Start)
	require.Zero(t, r.Start.OutboxRows)
	require.True(t, r.Start.Checkpointed)
	require.NotNil(t, r.LatencyMS)
	require.Positive(t, r.LatencyMS.P50)
	require.LessOrEqual(t, r.LatencyMS.P50, r.LatencyMS.P99)
	require.LessOrEqual(t, r.LatencyMS.P99, r.LatencyMS.Max)
	require.Positive(t, r.ProducerRate)
	require.Positive(t, r.ProcessingRate)
	require.GreaterOrEqual(t, r.DrainSeconds, 0.0, "the relay caught up")
	require.Equal(t, r.Messages, r.Delivered)
	require.Zero(t, r.OutboxRemaining)
	require.GreaterOrEqual(t, len(r.Samples), 3, "the charts have points to draw")
	sum, html := report(t, r)
	require.Contains(t, sum, "backlog growth")
	mark := "✗"
	if r.Criteria[1].Met {
		mark = "✓"
	}
	require.Equal(t, "backlog_growth", r.Criteria[1].Name)
	require.Contains(t, sum, mark+" backlog_growth")
	require.Contains(t, html, "--rate<")
	require.NotContains(t, html, "--messages<")
}

// With --poison-percent the probe sink fails every N-th message on every
// attempt: the relay retries it, dead-letters it after the poison schedule's
// attempts, and the run still works its backlog off (a dead letter counts
// as worked off, not as delivered, and has no latency).
//
// What a run on this machine measures (is 2000 msg/s with poison
// sustainable here, now?) depends on the machine and what else it runs, so
// the run's verdict is checked for being the verdict on the run's own
// evidence; that a backlog shaped by poison messages is judged sustainable
// is TestGrowthPassesPoisonHolds, on deterministic input.
func TestSteadyWithPoison(t *testing.T) {
	o := smokeOptions(ModeSteady)
	o.Rate = 2000
	o.Duration = 3 * time.Second
	o.PoisonPercent = 1
	o.Keep = true
	// The tail ends as soon as every message is worked off: this bound is a
	// hang guard, not the time the relay is given.
	o.TailWait = 2 * time.Minute
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.EqualValues(t, 1, m["settings"].(map[string]any)["poison_percent"])
	require.Zero(t, r.OutboxRemaining, "the poison messages left the outbox")
	require.GreaterOrEqual(t, r.DrainSeconds, 0.0, "the relay worked the backlog off")
	require.Len(t, r.Criteria, 4)
	require.NotNil(t, r.BacklogGrowth)
	require.NotNil(t, r.LatencyMS)
	// Without --max-p99 a steady run does not judge its latency.
	j := Judge(Evidence{Target: float64(o.Rate), ProducerRate: r.ProducerRate, Growth: *r.BacklogGrowth, BacklogAtStop: r.BacklogAtStop})
	require.Equal(t, j.Criteria[:3], r.Criteria[:3], "the verdict is the one on the run's evidence")
	require.False(t, r.Criteria[3].Judged, r.Criteria[3].Detail)
	require.Equal(t, j.Sustainable, r.Sustainable, r.VerdictReason)

	// Every 100th seq is poison; the relay dead-letters each after 3 attempts.
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	defer pool.Close()
	schema := r.Settings.Schema
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	var dead, notPoison, attempts3 int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*), count(*) FILTER (WHERE id % 100 <> 0), count(*) FILTER (WHERE attempts = 3) FROM "+schema+".dead_letters").
		Scan(&dead, &notPoison, &attempts3))
	require.Zero(t, notPoison, "only poison messages are dead-lettered")
	require.Equal(t, dead, attempts3, "each after 3 attempts")
	require.Equal(t, dead, r.PoisonDeadLettered)
	require.InDelta(t, float64(r.Messages)/100, float64(dead), 2)
	require.Equal(t, r.Messages-dead, r.Delivered)
	sum, _ := report(t, r)
	require.Contains(t, sum, "poison messages")
}

// The sweep against the real database (its search is checked on
// deterministic verdicts by TestSweepBisectsAndConfirms and the tests next
// to it).
func TestSweep(t *testing.T) {
	testtool.Long(t, "a sweep of at least four 3 s runs")
	o := smokeOptions(ModeSweep)
	// Rates any machine sustains even while other tests load it: this test
	// checks the search, not the machine (a 1000 msg/s reference step once
	// failed its p99 bound on a loaded CI machine with 2 s windows).
	o.MinRate, o.MaxRate = 500, 2000
	// Other test binaries load the machine while this one runs (p99 reached
	// 57-125 ms at 1,200-1,400 msg/s in CI): the latency bound is judged by
	// the verdict tests with synthetic series; here it is set where it
	// cannot decide, so the run shows the search itself.
	o.P99Floor = 2 * time.Second
	o.SweepSteps = 2
	o.Duration = 3 * time.Second
	o.Limits = true
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	steps := ""
	for _, s := range r.Steps {
		steps += fmt.Sprintf("\n  %s %d msg/s: sustainable=%v %s", s.Role, s.Rate, s.Sustainable, s.VerdictReason)
	}
	require.Equal(t, "sweep", m["mode"])
	require.Equal(t, 500, r.Steps[0].Rate)
	require.Equal(t, RoleReference, r.Steps[0].Role)
	require.True(t, r.Steps[0].Sustainable, "the reference step must pass:%s", steps)
	require.Equal(t, 1000, r.Steps[1].Rate, "the geometric mean of 500 and 2000:%s", steps)
	require.True(t, r.Sustainable, "%s:%s", r.VerdictReason, steps)
	require.GreaterOrEqual(t, r.ConfirmedRuns, 3)
	for _, s := range r.Steps {
		require.Zero(t, s.Start.OutboxRows, "every run starts from an empty outbox")
		require.True(t, s.Growth.Valid)
		// Latency is judged on the median of the window's per-second p99s.
		require.NotNil(t, s.LatencyMS)
		require.Positive(t, s.LatencyMS.Seconds)
		require.LessOrEqual(t, s.LatencyMS.Seconds, int(o.Duration/time.Second), "at most one p99 per second of the window")
		require.Positive(t, s.LatencyMS.P99PerSecond)
		require.LessOrEqual(t, s.LatencyMS.P99PerSecond, s.LatencyMS.Max)
	}
	for _, s := range r.Steps[1:] {
		require.Contains(t, s.VerdictReason, "median of the window's", "runs above the reference are judged on the per-second median")
	}
	// The sweep ends with the winner's two repeats, both passing. A repeat
	// at another rate is allowed only where one failed there (a loaded
	// machine can fail one), which sent the search below it.
	n := len(r.Steps)
	require.GreaterOrEqual(t, n, 4, steps)
	for _, s := range r.Steps[n-2:] {
		require.Equal(t, RoleConfirm, s.Role, steps)
		require.Equal(t, int(r.TargetRate), s.Rate, steps)
		require.True(t, s.Sustainable, steps)
	}
	for _, s := range r.Steps[:n-2] {
		if s.Role == RoleConfirm && s.Rate != int(r.TargetRate) {
			failed := false
			for _, o := range r.Steps {
				failed = failed || (o.Rate == s.Rate && !o.Sustainable)
			}
			require.True(t, failed, "a repeat at %d msg/s without a failure there:%s", s.Rate, steps)
			require.Greater(t, s.Rate, int(r.TargetRate), steps)
		}
	}
	require.Positive(t, r.Limits.InsertRate)
	require.InDelta(t, r.TargetRate/r.Limits.InsertRate, r.Limits.ProducerFraction, 1e-9)
	sum, html := report(t, r)
	require.Contains(t, sum, "sweep runs, in order")
	require.Contains(t, sum, "reference")
	require.Contains(t, html, "detects ≥")
	require.Contains(t, sum, "median p99/s ms (bound)")
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

func TestPoisonNeedsTheRelayInProcess(t *testing.T) {
	o := smokeOptions(ModeDrain)
	o.PoisonPercent = 1
	_, err := Run(context.Background(), o)
	require.ErrorContains(t, err, "--poison-percent fails messages in the in-process relay's sink: use it with --mode steady, sweep or soak")
	o = smokeOptions(ModeSteady)
	o.Rate = 1000
	o.PoisonPercent = 60
	_, err = Run(context.Background(), o)
	require.ErrorContains(t, err, "--poison-percent must be between 0 and 50, got 60")
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
		{Options{Mode: ModeSweep, DatabaseURL: "x", P99Floor: -time.Second}, "--p99-floor"},
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

func TestOptionsNewFlags(t *testing.T) {
	err := Options{Mode: ModeSweep, DatabaseURL: "x", Confirm: 1}.Validate()
	require.ErrorContains(t, err, "--confirm must be at least 2")
	err = Options{Mode: ModeSteady, DatabaseURL: "x", Rate: 5, MaxP99: -time.Second}.Validate()
	require.ErrorContains(t, err, "--max-p99")
	err = Options{Mode: ModeSteady, DatabaseURL: "x", Rate: 5, Duration: 500 * time.Millisecond}.Validate()
	require.ErrorContains(t, err, "--duration must be at least 1s")
}

func TestTrackerPerSecondP99(t *testing.T) {
	// A 10 s window after a 1 s warm-up: 1,000 messages a second at 5 ms,
	// except one second in which 200 of them took 400 ms (a stall). The
	// window's p99 is the stall's; the median of the per-second p99s is not.
	start := time.Now()
	tr := newTracker(start, time.Second)
	tr.windowEnd = 11 * time.Second
	id := int64(0)
	for sec := range 12 { // the warm-up second, ten in the window, one after it
		for i := range 1000 {
			id++
			lat := 5 * time.Millisecond
			if sec == 4 && i < 200 {
				lat = 400 * time.Millisecond
			}
			ack := start.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Millisecond + lat)
			tr.committed([]int64{id}, ack.Add(-lat))
			tr.ackedIDs([]int64{id}, ack)
		}
	}
	lat, _ := tr.summary()
	require.InDelta(t, 400, lat.P99, 5, "the whole run's p99 is the stall's")
	require.Equal(t, 10, lat.Seconds, "seconds of the window only")
	require.InDelta(t, 5, lat.P99PerSecond, 0.1)
	require.EqualValues(t, 1000, lat.WorstSecond, "every second of the window acknowledged 1,000")
}

// The worst second is the window's whole second with the fewest
// acknowledgements, a second with none included; the warm-up and what
// follows the window do not count.
func TestTrackerWorstSecond(t *testing.T) {
	start := time.Now()
	tr := newTracker(start, time.Second)
	tr.windowEnd = 6 * time.Second // five whole seconds
	id := int64(0)
	perSecond := []int{10, 1000, 1000, 300, 1000, 1000, 5} // warm-up, five in the window, one after
	for sec, n := range perSecond {
		for i := range n {
			id++
			ack := start.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Millisecond/2)
			tr.committed([]int64{id}, ack)
			tr.ackedIDs([]int64{id}, ack)
		}
	}
	lat, _ := tr.summary()
	require.EqualValues(t, 300, lat.WorstSecond)
	require.Equal(t, 2, lat.WorstSecondAt)

	// A second in which nothing was acknowledged is the worst.
	tr = newTracker(start, 0)
	tr.windowEnd = 3 * time.Second
	for _, sec := range []int{0, 2} {
		id++
		ack := start.Add(time.Duration(sec) * time.Second)
		tr.committed([]int64{id}, ack)
		tr.ackedIDs([]int64{id}, ack)
	}
	lat, _ = tr.summary()
	require.Zero(t, lat.WorstSecond)
	require.Equal(t, 1, lat.WorstSecondAt)
}

// A drain of an outbox in WAL mode: pre-filled through the enqueue path,
// finished when the slot is confirmed past the pre-fill, every message
// delivered once; the report says which outbox it measured.
func TestDrainWALOutbox(t *testing.T) {
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	t.Setenv(RelayHelperEnv, "1")
	o := smokeOptions(ModeDrain)
	o.DatabaseURL = url
	o.OutboxMode = "wal"
	o.Messages = 20000
	o.RelayCommand = []string{os.Args[0]}
	var stderr bytes.Buffer
	o.RelayStderr = &stderr
	r, err := Run(context.Background(), o)
	require.NoError(t, err, stderr.String())
	require.EqualValues(t, 20000, r.Delivered)
	require.Equal(t, 1, r.Relays)
	require.Positive(t, r.RelayPeakRSSBytes)
	require.Positive(t, r.ProcessingRate)
	require.Positive(t, r.ProducerRate)
	sum, _ := report(t, r)
	require.Contains(t, sum, "pre-fill (Enqueue, 1000 per tx)")
	require.Contains(t, sum, "WAL mode")

	for _, c := range []struct {
		mode   Mode
		outbox string
		limits bool
		want   string
	}{
		{ModeDrain, "wal", true, "--limits measures the table outbox's removal limit"},
		{ModeDrain, "heap", false, `--outbox-mode must be table or wal, got "heap"`},
	} {
		o := smokeOptions(c.mode)
		o.OutboxMode, o.Limits, o.Rate = c.outbox, c.limits, 1000
		_, err := Run(context.Background(), o)
		require.ErrorContains(t, err, c.want)
	}
}

// serverRunsHere reports whether the test database's server is a postgres
// process of this machine (its backends' CPU can be read from /proc).
func serverRunsHere(t *testing.T) bool {
	t.Helper()
	pool, err := connect(context.Background(), databaseURL, 1)
	require.NoError(t, err)
	defer pool.Close()
	var pid int32
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	_, ok := postgresCPU(pid)
	return ok
}
