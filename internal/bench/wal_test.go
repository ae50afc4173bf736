package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
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
	require.InDelta(t, 2000, r.ProducerRate, 200)
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
	require.Less(t, tr.peak, int(r.Messages)/2, "the tracker held the messages in flight, not the run's")

	sum, html := report(t, r)
	for _, s := range []string{sum, html} {
		require.Contains(t, s, "WAL mode")
		require.Contains(t, s, "emit limit")
		require.Contains(t, s, "of the emit limit")
		require.Contains(t, s, "replication slot advanced over")
	}
}

func TestWALOutboxOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: ModeSoak, OutboxMode: "wal", DatabaseURL: "x", Rate: 100, Duration: time.Minute}, "--outbox-mode wal does not work with --mode soak"},
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
	}{{ModeSteady, true}, {ModeSweep, true}, {ModeDrain, false}} {
		o, err := Options{Mode: c.mode, OutboxMode: "wal", DatabaseURL: "x", Rate: 100, Limits: c.mode != ModeDrain, InProcess: !c.inProcess}.withDefaults()
		require.NoError(t, err, c.mode)
		require.Equal(t, c.inProcess, o.InProcess, c.mode)
		require.Equal(t, 1, o.Relays)
	}
}
