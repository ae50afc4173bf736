package bench

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/internal/walstream"
)

func walOptions(t *testing.T, mode Mode) Options {
	t.Helper()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	o := smokeOptions(mode)
	o.DatabaseURL = url
	o.OutboxMode = "wal"
	return o
}

// A short steady run against an outbox in WAL mode, with its limits: the
// relay runs in this process, so latency is measured, every message is
// delivered once, and the tracker holds only the messages in flight.
func TestSteadyWALOutbox(t *testing.T) {
	o := walOptions(t, ModeSteady)
	o.InProcess = false // forced on for a WAL outbox
	o.Rate = 2000
	o.Duration = 2 * time.Second
	o.Limits = true
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	var trackers []*tracker
	trackerHook = func(tr *tracker) { trackers = append(trackers, tr) }
	t.Cleanup(func() { trackerHook = nil })
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "steady", m["mode"])
	require.True(t, r.Settings.InProcess)
	require.Equal(t, 1, r.Relays)
	require.NotEmpty(t, r.VerdictReason)
	require.Len(t, r.Criteria, 4)
	require.NotNil(t, r.BacklogGrowth)
	require.True(t, r.BacklogGrowth.Valid, "the backlog is read from the tracker")
	require.NotNil(t, r.LatencyMS, r.LatencyNote)
	require.Positive(t, r.LatencyMS.P50)
	require.LessOrEqual(t, r.LatencyMS.P99, r.LatencyMS.Max)
	require.LessOrEqual(t, r.ProducerRate, 2000*1.05, "the producers never run ahead of the target")
	if testtool.IsLong() { // how close they come depends on the machine's load
		require.InDelta(t, 2000, r.ProducerRate, 200)
	}
	require.GreaterOrEqual(t, r.DrainSeconds, 0.0, "the relay caught up")
	require.Positive(t, r.Messages)
	require.Equal(t, r.Messages, r.Delivered)
	require.Zero(t, r.Redelivered)
	require.Positive(t, r.WALBytesPerMsg)
	// The limits wrote WAL after the slot's position, which prepare
	// skipped: the run started from a drained outbox.
	require.NotNil(t, r.Start)
	require.Positive(t, r.Start.SlotLagBytes)
	l := r.Limits
	require.NotNil(t, l)
	require.Positive(t, l.InsertRate)
	require.Positive(t, l.EmitRate)
	require.Positive(t, l.EmitWALBytesPerMsg)
	require.InDelta(t, r.ProducerRate/l.EmitRate, l.EmitFraction, 1e-9)

	require.Len(t, trackers, 1)
	tr := trackers[0]
	require.True(t, tr.sparse)
	require.Zero(t, tr.inFlight(), "every entry freed once acknowledged")
	// In flight: the backlog (produced, not acknowledged; the samples'
	// largest, plus what two sample intervals add at the rate) and the
	// producers' open transactions (registered before their Commit). The
	// backlog itself can be large here: after the limits, the walsender
	// decodes their WAL again before it reaches the run's (over a second
	// on a slow machine).
	var maxBacklog int64
	for _, x := range r.Samples {
		maxBacklog = max(maxBacklog, x.Backlog)
	}
	inFlight := int(maxBacklog) + r.Settings.Producers*r.Settings.ProducerBatch + 2*o.Rate/10
	require.LessOrEqual(t, tr.peak, inFlight, "the tracker held the messages in flight, not the run's")
	require.Less(t, tr.peak, int(r.Messages))

	sum, html := report(t, r)
	for _, s := range []string{sum, html} {
		require.Contains(t, s, "WAL mode")
		require.Contains(t, s, "emit limit")
		require.Contains(t, s, "of the emit limit")
		require.Contains(t, s, "replication slot advanced over")
	}
	require.Contains(t, html, "--outbox-mode<")
}

// A short soak of an outbox in WAL mode: the slot's retained WAL and the
// relay's held bytes are read at every sample and judged as trends. With
// 1 % poison messages, which wait in memory for their retries, the relay
// holds messages at most samples.
func TestSoakWALOutbox(t *testing.T) {
	testtool.Long(t, "a 30 s soak")
	o := walOptions(t, ModeSoak)
	o.Rate = 2000
	o.PoisonPercent = 1
	o.Duration = soakMinDuration
	o.Warmup = time.Second
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	decode(t, r)
	require.True(t, r.Settings.InProcess)
	require.NotNil(t, r.Soak)
	var names []string
	for _, tr := range r.Soak.Trends {
		names = append(names, tr.Name)
		require.True(t, tr.Growth.Valid, tr.String())
	}
	require.Equal(t, []string{"rss_bytes", "heap_bytes", "goroutines", "p99_ms", "slot_lag_bytes", "held_bytes"}, names)
	held, lag := 0, 0
	for _, x := range r.Samples {
		if x.Phase == "measure" {
			require.Zero(t, x.DeadTuples)
			if x.HeldBytes > 0 {
				held++
			}
			if x.SlotLagBytes > 0 {
				lag++
			}
		}
	}
	require.Positive(t, held, "the relay held messages at some samples")
	require.Positive(t, lag, "the slot retained WAL at some samples")
	require.Positive(t, r.PoisonDeadLettered)
	require.Equal(t, r.Messages, r.Delivered+r.PoisonDeadLettered)
	sum, _ := report(t, r)
	require.Contains(t, sum, "trend_slot_lag_bytes")
	require.Contains(t, sum, "wharf_wal_held_bytes")
}

// A small baseline of an outbox in WAL mode: Wharf's enqueue beside the
// bare emit of the same payloads, then the relay drains the slot past the
// enqueue's WAL; the emit limit's messages are not the outbox's.
func TestBaselineWALOutbox(t *testing.T) {
	t.Setenv(RelayHelperEnv, "1")
	o := walOptions(t, ModeBaseline)
	o.Duration = time.Second
	o.RelayCommand = []string{os.Args[0]}
	var stderr bytes.Buffer
	o.RelayStderr = &stderr
	r, err := Run(context.Background(), o)
	require.NoError(t, err, stderr.String())
	m := decode(t, r)
	require.Equal(t, "baseline", m["mode"])
	require.False(t, r.Settings.InProcess)
	require.Positive(t, r.ProducerRate)
	require.Positive(t, r.Messages)
	require.Equal(t, r.Messages, r.Delivered)
	require.Positive(t, r.DrainSeconds, "the drain finished")
	require.Positive(t, r.ProcessingRate)
	require.Positive(t, r.WALBytesPerMsg)
	l := r.Limits
	require.NotNil(t, l)
	require.Positive(t, l.InsertRate)
	require.Positive(t, l.EmitRate)
	require.Positive(t, l.EmitWALBytesPerMsg)
	require.Equal(t, emitPrefix(r.Settings.Schema), l.EmitPrefix)
	require.NotEqual(t, r.Settings.Schema, l.EmitPrefix)
	require.Len(t, l.EmitPrefix, len(r.Settings.Schema), "as long as the outbox's prefix")
	require.InDelta(t, r.WALBytesPerMsg/l.EmitWALBytesPerMsg, l.WALBytesFraction, 1e-9)
	require.InDelta(t, r.ProducerRate/l.EmitRate, l.EmitFraction, 1e-9)
	require.InDelta(t, r.ProducerRate/l.InsertRate, l.ProducerFraction, 1e-9)
	require.Zero(t, l.RemovalRate, "the removal limit is a table outbox's")
	require.Zero(t, l.DrainFraction)
	// A bare emit of the payload alone: less WAL than Wharf's message,
	// which adds its topic, key and nonce to the same logical message.
	require.Greater(t, l.WALBytesFraction, 0.0)

	sum, html := report(t, r)
	for _, s := range []string{sum, html} {
		require.Contains(t, s, "emit limit")
		require.Contains(t, s, "of the emit limit")
		require.Contains(t, s, "× the bare emit")
		require.NotContains(t, s, "bare claim+delete", "no removal limit")
	}
	var sb strings.Builder
	require.NoError(t, WriteJSON(&sb, r))
	for _, f := range []string{`"emit_rate"`, `"emit_wal_bytes_per_msg"`, `"wal_bytes_fraction"`, `"emit_fraction"`} {
		require.Contains(t, sb.String(), f)
	}
}

// walEnv is a bench environment with o's defaults and a WAL outbox in
// schema, dropped at cleanup.
func walEnv(t *testing.T, o Options, schema string) *env {
	t.Helper()
	o, err := o.withDefaults()
	require.NoError(t, err)
	o.Schema = schema
	ctx := context.Background()
	ctl, err := connect(ctx, o.DatabaseURL, 2)
	require.NoError(t, err)
	t.Cleanup(ctl.Close)
	e := &env{o: o, ctl: ctl}
	drop, err := e.createSchema(ctx, o.Schema)
	require.NoError(t, err)
	t.Cleanup(drop)
	return e
}

// The relay's stream keeps only its outbox's prefix: logical messages of
// the emit limit's prefix are skipped, not dead-lettered, and advancing the
// slot skips what no relay delivered.
func TestWALSlotAdvanceAndPrefix(t *testing.T) {
	o := walOptions(t, ModeSteady)
	o.Rate = 1000
	e := walEnv(t, o, "wharf_bench_waltest")
	o, ctl := e.o, e.ctl
	ctx := context.Background()

	// Not streamed: the slot keeps them, and advancing skips them.
	c, err := wharf.NewClient(ctl, &wharf.Config{Schema: o.Schema})
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, wharf.Message{Topic: topic, Payload: []byte(`"x"`)})
	require.NoError(t, err)
	before, err := e.insertLSN(ctx)
	require.NoError(t, err)
	skipped, err := e.advanceSlot(ctx, o.Schema)
	require.NoError(t, err)
	require.Positive(t, skipped)
	var confirmed string
	require.NoError(t, ctl.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", o.Schema).Scan(&confirmed))
	lsn, err := walstream.ParseLSN(confirmed)
	require.NoError(t, err)
	require.GreaterOrEqual(t, lsn, before, "confirmed past everything written before the advance")

	// Logical messages of the emit limit's prefix, then one outbox message,
	// streamed by the relay.
	for range 3 {
		_, err = e.walMarker(ctx, o.Schema)
		require.NoError(t, err)
	}
	tr := newSparseTracker(time.Now(), 0)
	r, err := startInProcess(ctx, o, o.Schema, tr, false)
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, wharf.Message{Topic: topic, Payload: []byte(`"y"`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, dups := tr.summary()
		return dups > 0 || tr.acked.Load() > 0
	}, time.Minute, 20*time.Millisecond)
	_, err = r.stop(ctx)
	require.NoError(t, err)
	_, dups := tr.summary()
	require.EqualValues(t, 1, dups, "the message was not registered with the tracker: its ack counts as a redelivery")
	n, err := e.deadLetters(ctx, o.Schema)
	require.NoError(t, err)
	require.Zero(t, n, "the other prefix's messages were dropped by the stream")
}

// stuckSink acknowledges nothing: it refuses every message at once (a
// retryable error, so the relay retries later). Whatever the producers of
// TestSweepStepAdvancesAnUndrainedSlot write stays a backlog, however fast
// or slow the machine is.
type stuckSink struct{}

func (stuckSink) Publish(_ context.Context, msgs []*wharf.Message) []error {
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = errStuck
	}
	return errs
}

func (stuckSink) Close() error { return nil }

var errStuck = errors.New("benchstuck: this sink acknowledges nothing")

func init() {
	sinkurl.Register("benchstuck", func(context.Context, *url.URL) (wharf.Sink, error) { return stuckSink{}, nil })
}

// A sweep step whose backlog the relay cannot work off in time leaves the
// slot advanced past it, so the next step starts from a drained outbox:
// none of the old messages reach its relay (its tracker would count them as
// redeliveries).
func TestSweepStepAdvancesAnUndrainedSlot(t *testing.T) {
	o := walOptions(t, ModeSweep)
	o.Sink = "benchstuck:"
	o.Duration = time.Second
	o.TailWait = -1
	e := walEnv(t, o, "wharf_bench_walundrained")
	o = e.o
	ctx := context.Background()
	defer func(w time.Duration) { drainAllWait = w }(drainAllWait)
	drainAllWait = 300 * time.Millisecond

	r, err := e.steady(ctx, steadySpec{schema: o.Schema, rate: 3000, label: "stuck", drainAll: true})
	require.NoError(t, err)
	require.Positive(t, r.Messages)
	require.Zero(t, r.Delivered, "the stuck sink left a backlog")
	require.Contains(t, strings.Join(r.Notes, "\n"), "the bench advanced the slot")

	// The tail ends once the relay caught up: a hang guard.
	e.o.Sink, e.o.TailWait = "null:", 2*time.Minute
	r, err = e.steady(ctx, steadySpec{schema: o.Schema, rate: 1000, label: "next"})
	require.NoError(t, err)
	require.Equal(t, r.Messages, r.Delivered)
	require.Zero(t, r.Redelivered, "no message of the previous step was streamed")
}

func TestWALOutboxOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: ModeSteady, OutboxMode: "wal", DatabaseURL: "x", Rate: 100, Relays: 2}, "use --relays 1 (got --relays 2)"},
		{Options{Mode: ModeSweep, OutboxMode: "wal", DatabaseURL: "x", Relays: 3}, "use --relays 1"},
		{Options{Mode: ModeDrain, OutboxMode: "wal", DatabaseURL: "x", Limits: true}, "--limits measures the table outbox's removal limit"},
		{Options{Mode: ModeDrain, OutboxMode: "heap", DatabaseURL: "x"}, `--outbox-mode must be table or wal, got "heap"`},
	} {
		err := c.o.Validate()
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "\n")
	}
	for _, c := range []struct {
		mode      Mode
		inProcess bool
	}{{ModeSteady, true}, {ModeSweep, true}, {ModeSoak, true}, {ModeBaseline, false}, {ModeDrain, false}} {
		o, err := Options{Mode: c.mode, OutboxMode: "wal", DatabaseURL: "x", Rate: 100, Duration: time.Minute,
			Limits: c.mode != ModeDrain && c.mode != ModeSoak, InProcess: !c.inProcess}.withDefaults()
		require.NoError(t, err, c.mode)
		require.Equal(t, c.inProcess, o.InProcess, c.mode)
		require.Equal(t, 1, o.Relays)
	}
}

// A drain's WAL pre-fill honours --producer-batch: with 1, every message is
// a transaction of its own holding one logical message, as the slot's
// decoded changes show (one BEGIN, one message and one COMMIT each).
func TestWALFillOneMessagePerTransaction(t *testing.T) {
	o := walOptions(t, ModeDrain)
	o.ProducerBatch = 1
	o.Producers = 2
	e := walEnv(t, o, "bench_fill_one")
	require.Equal(t, 1, e.o.ProducerBatch)
	ctx := context.Background()
	const n = 40
	_, end, err := e.enqueueFill(ctx, e.o.Schema, n, nil)
	require.NoError(t, err)
	require.Greater(t, end, e.walStart)
	// The pre-fill commits without waiting for the flush, and a slot
	// decodes flushed WAL only: a checkpoint flushes it (as the drain's
	// quiesce does).
	_, err = e.ctl.Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	var begins, msgs, commits int
	require.NoError(t, e.ctl.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE get_byte(data, 0) = ascii('B')),
       count(*) FILTER (WHERE get_byte(data, 0) = ascii('M')),
       count(*) FILTER (WHERE get_byte(data, 0) = ascii('C'))
  FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL,
       'proto_version', '1', 'publication_names', $1::text, 'messages', 'true')`, e.o.Schema).Scan(&begins, &msgs, &commits))
	require.Equal(t, n, msgs, "one logical message per message")
	require.Equal(t, n, begins, "one transaction per message")
	require.Equal(t, n, commits)

	d, err := Options{Mode: ModeDrain, OutboxMode: "wal", DatabaseURL: "x"}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, walFillBatch, d.ProducerBatch, "a WAL drain pre-fills 1000 messages per transaction unless told")
}
