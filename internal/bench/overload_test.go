package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// checkOverload asserts what holds for any overload run, whatever the
// machine's speed: the window's figures add up, the rates are those counts
// over the window, and every message, pre-filled or produced, was processed
// exactly once by the end (the run waits for the relay to catch up).
func checkOverload(t *testing.T, r *Result, backlog int64, inProcess bool) *Overload {
	t.Helper()
	ov := r.Overload
	require.NotNil(t, ov)
	require.Equal(t, backlog, ov.Backlog, "the pre-fill wrote --backlog messages")
	require.Positive(t, ov.PrefillRate)
	require.Positive(t, ov.WindowSeconds)
	require.Equal(t, ov.OutstandingAtStart+ov.ProducedInWindow-ov.ProcessedInWindow, ov.OutstandingAtEnd)
	require.Equal(t, r.BacklogAtStop, ov.OutstandingAtEnd, "the window ends at the producers' stop")
	require.GreaterOrEqual(t, ov.ProcessedInWindow, int64(0))
	require.GreaterOrEqual(t, ov.OutstandingAtEnd, int64(0), "nothing is processed that was not offered")
	require.LessOrEqual(t, ov.MinOutstanding, min(ov.OutstandingAtStart, ov.OutstandingAtEnd))
	require.Equal(t, ov.MinOutstanding > 0, ov.Saturated)
	require.InDelta(t, float64(ov.OutstandingAtStart+ov.ProducedInWindow)/ov.WindowSeconds, ov.OfferedRate, 1e-6)
	require.InDelta(t, float64(ov.ProcessedInWindow)/ov.WindowSeconds, ov.ProcessedRate, 1e-6)
	require.GreaterOrEqual(t, r.DrainSeconds, 0.0, "the relay caught up")
	require.Greater(t, r.Messages, backlog, "the producers ran beside the backlog")
	require.Equal(t, r.Messages, r.Delivered, "every message, pre-filled or produced, was processed")
	require.NotEmpty(t, r.Samples)
	require.GreaterOrEqual(t, r.Samples[0].Produced, backlog, "the samples count the backlog as produced")
	sum, _ := report(t, r)
	require.Contains(t, sum, "overload backlog")
	if !inProcess {
		// Relay processes: the outbox's row count is all there is.
		require.Equal(t, -1, ov.WorstSecondAt)
		require.EqualValues(t, -1, ov.BacklogProcessed)
		return ov
	}
	// The relay is in this process: the tracker counts the worst second.
	require.GreaterOrEqual(t, ov.WorstSecondAt, 0)
	require.Less(t, float64(ov.WorstSecondAt), ov.WindowSeconds)
	require.GreaterOrEqual(t, ov.WorstSecond, int64(0))
	require.LessOrEqual(t, ov.WorstSecond, ov.ProcessedInWindow)

	require.Zero(t, r.Redelivered)
	require.Equal(t, backlog, ov.BacklogProcessed, "every pre-filled message was acknowledged once")
	require.NotNil(t, r.LatencyMS, r.LatencyNote)
	require.LessOrEqual(t, r.LatencyMS.Count, r.Messages-backlog, "the pre-filled messages have no latency")
	require.Contains(t, sum, "pre-filled processed")
	return ov
}

// A steady run with --backlog against a table outbox: the pre-fill is in
// the database's insert count, and what the report says the relay processed
// is what the database says it deleted.
func TestSteadyBacklogTableOutbox(t *testing.T) {
	testBacklogTable(t, true)
}

// The same with the relay as a process: processed is what left the outbox,
// read from its row count.
func TestSteadyBacklogRelayProcess(t *testing.T) {
	t.Setenv(RelayHelperEnv, "1")
	testBacklogTable(t, false)
}

func testBacklogTable(t *testing.T, inProcess bool) {
	const backlog = 20000
	o := smokeOptions(ModeSteady)
	if !inProcess {
		o.InProcess = false
		o.RelayCommand = []string{os.Args[0]}
		o.RelayArgs = []string{"--poll-interval=5ms"}
	}
	o.Rate = 2000
	o.Backlog = backlog
	o.Duration = 2 * time.Second
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	var b [4]byte
	_, _ = rand.Read(b[:])
	o.Schema = "wharf_overload_" + hex.EncodeToString(b[:])
	o.Keep = true // for the database's own counts below
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+o.Schema+" CASCADE")
		pool.Close()
	})
	r, err := Run(ctx, o)
	require.NoError(t, err)
	checkOverload(t, r, backlog, inProcess)
	require.Zero(t, r.OutboxRemaining)

	// The server's statistics of the outbox: rows inserted (the COPY and
	// the producers') and deleted (the relay's removals). A backend reports
	// them when it exits, and the relay's have: wait for them to arrive
	// (a hang guard of a minute, not a timing assumption).
	var ins, del int64
	guard := time.Now().Add(time.Minute)
	for {
		_, err := pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'`,
			o.Schema).Scan(&ins, &del))
		if (ins >= r.Messages && del >= r.Delivered) || time.Now().After(guard) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, r.Messages, ins, "the database inserted the pre-fill and the producers' messages")
	require.Equal(t, r.Delivered, del, "the relay removed exactly what the report says it processed")
}

// The same against an outbox in WAL mode: the pre-fill goes through Enqueue
// calls, the relay acknowledges it through the slot.
func TestSteadyBacklogWALOutbox(t *testing.T) {
	const backlog = 20000
	o := walOptions(t, ModeSteady)
	o.Rate = 2000
	o.Backlog = backlog
	o.Duration = 2 * time.Second
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	checkOverload(t, r, backlog, true)
}

func TestBacklogOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: ModeSteady, Rate: 1, Backlog: -1}, "--backlog must not be negative"},
		{Options{Mode: ModeSweep, Backlog: 10}, "--backlog pre-fills the outbox of a steady run"},
		{Options{Mode: ModeSteady, Rate: 1, Backlog: 10, PoisonPercent: 1, InProcess: true}, "--backlog and --poison-percent"},
	} {
		err := c.o.Validate()
		require.Error(t, err)
		require.Contains(t, err.Error(), c.want)
	}
	require.NoError(t, Options{Mode: ModeSteady, Rate: 1, Backlog: 10}.Validate())
}

// Pre-filled messages, in both tracker layouts: the first acknowledgement
// counts as processed (and in its second of the window) without a latency,
// a second one as a redelivery, and the producers' messages are tracked as
// before.
func TestTrackerPrefilled(t *testing.T) {
	for _, sparse := range []bool{false, true} {
		start := time.Unix(1000, 0)
		tr := newTracker(start, 0)
		if sparse {
			tr = newSparseTracker(start, 0)
		}
		tr.windowEnd = 2 * time.Second
		tr.prefilled([]int64{1, 2, 3})
		tr.enqueued([]int64{4})
		tr.committed([]int64{4}, start.Add(100*time.Millisecond))
		tr.ackedIDs([]int64{1, 2, 4}, start.Add(500*time.Millisecond))
		tr.ackedIDs([]int64{3, 1}, start.Add(1500*time.Millisecond))
		lat, dups := tr.summary()
		require.EqualValues(t, 4, tr.acked.Load(), "sparse %t", sparse)
		require.EqualValues(t, 3, tr.backlogAcked.Load(), "sparse %t", sparse)
		require.EqualValues(t, 1, dups, "the second ack of seq 1 is a redelivery (sparse %t)", sparse)
		require.NotNil(t, lat)
		require.EqualValues(t, 1, lat.Count, "only the produced message has a latency (sparse %t)", sparse)
		require.InDelta(t, 400, lat.P50, 5)
		worst, at := tr.worst()
		require.EqualValues(t, 1, worst, "second 2 processed seq 3 alone (sparse %t)", sparse)
		require.Equal(t, 1, at)
	}
}
