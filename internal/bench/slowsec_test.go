package bench

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The slow seconds are those below 80 % of the rate, the slowest ten in
// window order, each described by the readings around it.
func TestSlowSecondsFromReadings(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1, 1}
	r := func(at time.Duration, fetches, slowFetches uint64, gc int64, ckpt, av int64, running ...string) watchReading {
		// Cumulative counts: fast fetches ≤ 1 ms, slow ones ≤ 1 s.
		f := []uint64{fetches, fetches, fetches, fetches + slowFetches, fetches + slowFetches}
		return watchReading{at: at, fetch: f, fetchSum: float64(slowFetches) * 0.5, write: make([]uint64, 5),
			gcCycles: gc, gcPause: time.Duration(gc) * time.Millisecond, cpu: at, checkpoints: ckpt, autovacuums: av, running: running}
	}
	readings := []watchReading{
		r(0, 0, 0, 0, 0, 0),
		r(1500*time.Millisecond, 100, 0, 1, 0, 0),
		r(3250*time.Millisecond, 140, 2, 3, 1, 1, "autovacuum VACUUM s.outbox"),
		r(5*time.Second, 200, 2, 3, 1, 1),
	}
	perSecond := []int64{1000, 1000, 500, 990, 799, 1000}
	slow, total := slowSeconds(perSecond, 1000, readings, bounds)
	require.Equal(t, 2, total)
	require.Len(t, slow, 2)

	s := slow[0]
	require.Equal(t, 2, s.Second)
	require.EqualValues(t, 500, s.Acked)
	require.InDelta(t, 50, s.Percent, 1e-9)
	// From the reading at 1.5 s (the last at or before 2 s) to the one at
	// 3.25 s (the first at or after 3 s).
	require.InDelta(t, 1.75, s.Span, 1e-9)
	require.EqualValues(t, 42, s.Fetches)
	require.InDelta(t, 1.0, s.FetchSeconds, 1e-9)
	require.InDelta(t, 1.0, s.FetchMaxBound, 1e-9, "the slowest fetch fell in the ≤ 1 s bucket")
	require.EqualValues(t, 2, s.GCCycles)
	require.InDelta(t, 2, s.GCPauseMS, 1e-9)
	require.InDelta(t, 100, s.ProcessCPU, 1e-6)
	require.EqualValues(t, 1, s.Checkpoints)
	require.EqualValues(t, 1, s.Autovacuums)
	require.Equal(t, []string{"autovacuum VACUUM s.outbox"}, s.Running)
	line := s.String()
	require.Contains(t, line, "second 3: 500 msgs (50 %)")
	require.Contains(t, line, "42 fetches (1000 ms, slowest ≤ 1000 ms)")
	require.Contains(t, line, "1 checkpoint(s) ended")
	require.Contains(t, line, "running: autovacuum VACUUM s.outbox")

	require.Equal(t, 4, slow[1].Second, "799 of 1000 is below 80 %; 990 is not")

	// At most ten, the slowest, in window order.
	many := make([]int64, 30)
	for i := range many {
		many[i] = int64(100 * i)
	}
	slow, total = slowSeconds(many, 10000, nil, bounds)
	require.Equal(t, 30, total)
	require.Len(t, slow, 10)
	for i, s := range slow {
		require.Equal(t, i, s.Second)
		require.Zero(t, s.Span, "no readings")
		require.Contains(t, s.String(), "no readings around it")
	}
}

// A real stall: the outbox locked for two whole seconds of a steady run's
// window. The run reports the seconds it covered as slow, with the watch's
// readings around them.
func TestSteadyReportsAStallAsSlowSeconds(t *testing.T) {
	ctx := context.Background()
	o := smokeOptions(ModeSteady)
	o.Rate = 2000
	o.Duration = 8 * time.Second
	o.Schema = fmt.Sprintf("wharf_bench_stall_%d", time.Now().UnixNano()%1_000_000)
	trackers := make(chan *tracker, 1)
	trackerHook = func(tr *tracker) { trackers <- tr }
	t.Cleanup(func() { trackerHook = nil })

	type locked struct {
		from, to time.Duration // since the window's start
		err      error
	}
	lockDone := make(chan locked, 1)
	go func() {
		tr := <-trackers
		windowStart := tr.start.Add(tr.warmup)
		// Wait for the window to begin and the relay to acknowledge in it.
		for time.Now().Before(windowStart) || tr.acked.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		conn, err := pgx.Connect(ctx, o.DatabaseURL)
		if err != nil {
			lockDone <- locked{err: err}
			return
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err != nil {
			lockDone <- locked{err: err}
			return
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+o.Schema+".outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
			lockDone <- locked{err: err}
			return
		}
		from := time.Since(windowStart)
		// Hold it until a whole second of the window has passed under it.
		first := from.Truncate(time.Second) + time.Second
		for time.Since(windowStart) < first+time.Second+100*time.Millisecond {
			time.Sleep(10 * time.Millisecond)
		}
		to := time.Since(windowStart)
		lockDone <- locked{from: from, to: to, err: tx.Rollback(ctx)}
	}()

	r, err := Run(ctx, o)
	require.NoError(t, err)
	l := <-lockDone
	require.NoError(t, l.err)
	first := int(l.from.Truncate(time.Second)/time.Second) + 1
	require.Less(t, first, 8, "the lock (%s to %s into the window) covered a whole second of it", l.from, l.to)

	require.Positive(t, r.SlowSecondsTotal)
	var s *SlowSecond
	for i := range r.SlowSeconds {
		if r.SlowSeconds[i].Second == first {
			s = &r.SlowSeconds[i]
		}
	}
	require.NotNil(t, s, "second %d, under the lock from %s to %s, is reported slow: %+v", first+1, l.from, l.to, r.SlowSeconds)
	require.Less(t, s.Percent, 80.0)
	require.Positive(t, s.Span, "readings around it")
	require.GreaterOrEqual(t, s.MachineBusy, 0.0)
	var sum bytes.Buffer
	require.NoError(t, WriteSummary(&sum, r))
	require.Contains(t, sum.String(), "slow seconds")
	require.Contains(t, sum.String(), s.String())
}
