package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Overload is what a steady run with --backlog measured: the relay offered
// more than it can take, and what it processed. Every figure but Backlog,
// PrefillRate and BacklogProcessed is over the measurement window (after the
// warm-up) and comes from the same two readings, its first and its last,
// so that OutstandingAtStart + ProducedInWindow − ProcessedInWindow =
// OutstandingAtEnd exactly.
type Overload struct {
	// Backlog is the messages pre-filled before the relay and the producers
	// started: the outbox's rows counted after the COPY (table), or the
	// messages the Enqueue calls returned (WAL mode).
	Backlog int64 `json:"backlog"`
	// PrefillRate is the pre-fill's rate (not part of the run).
	PrefillRate float64 `json:"prefill_rate"`
	// WindowSeconds is the time between the window's first and last reading.
	WindowSeconds float64 `json:"window_seconds"`
	// OutstandingAtStart is what was enqueued and not yet processed at the
	// window's start: the pre-fill less what the relay processed in the
	// warm-up, plus what the producers committed in it.
	OutstandingAtStart int64 `json:"outstanding_at_start"`
	// ProducedInWindow is what the producers committed in the window.
	ProducedInWindow int64 `json:"produced_in_window"`
	// ProcessedInWindow is what the relay processed (the sink acknowledged;
	// with relay processes, the rows that left the outbox) in the window.
	ProcessedInWindow int64 `json:"processed_in_window"`
	// OutstandingAtEnd is what was left at the window's end.
	OutstandingAtEnd int64 `json:"outstanding_at_end"`
	// MinOutstanding is the lowest backlog reading in the window (every
	// 20 ms with the relay in this process, every sample with relay
	// processes). Above 0, the relay never ran out of work: ProcessedRate
	// is its throughput under overload.
	MinOutstanding int64 `json:"min_outstanding"`
	// Saturated says MinOutstanding > 0.
	Saturated bool `json:"saturated"`
	// OfferedRate is (OutstandingAtStart + ProducedInWindow) /
	// WindowSeconds: the work the relay was given to do in the window, per
	// second of it.
	OfferedRate float64 `json:"offered_rate"`
	// ProcessedRate is ProcessedInWindow / WindowSeconds.
	ProcessedRate float64 `json:"processed_rate"`
	// WorstSecond is the fewest messages processed in one whole second of
	// the window (pre-filled ones included), WorstSecondAt that second's
	// start in seconds into the window; -1 when unknown (relay processes,
	// or no whole second).
	WorstSecond   int64 `json:"worst_second_processed"`
	WorstSecondAt int   `json:"worst_second_at"`
	// BacklogProcessed is how many pre-filled messages the sink had
	// acknowledged by the end of the run (relay in this process; -1 with
	// relay processes, which cannot tell them apart).
	BacklogProcessed int64 `json:"backlog_processed"`
}

// prefillBacklog writes --backlog messages into the prepared, empty outbox
// of a steady run, before the relay and the producers start, and returns
// their seqs (for the tracker) and the pre-fill's rate. A table outbox is
// filled with one COPY and ANALYZEd (autovacuum analyzes a table that grows
// by that much as it grows; VACUUM is left out, which would mark the new
// rows all-visible and set their hint bits, as inserts at the producers'
// pace do not); an outbox in WAL mode through Enqueue calls of
// --producer-batch messages. A CHECKPOINT follows, so that the pre-fill's
// WAL is not flushed inside the window.
func (e *env) prefillBacklog(ctx context.Context, schema string) ([]int64, float64, error) {
	o := e.o
	n := int64(o.Backlog)
	var seqs []int64
	var rate float64
	if e.wal() {
		var mu sync.Mutex
		seqs = make([]int64, 0, n)
		var err error
		rate, _, err = e.enqueueFill(ctx, schema, n, func(s []int64) {
			mu.Lock()
			seqs = append(seqs, s...)
			mu.Unlock()
		})
		if err != nil {
			return nil, 0, fmt.Errorf("pre-filling the backlog: %w", err)
		}
	} else {
		var err error
		if rate, err = e.copyFill(ctx, pgx.Identifier{schema, "outbox"}, n); err != nil {
			return nil, 0, fmt.Errorf("pre-filling the backlog: %w", err)
		}
		rows, err := e.ctl.Query(ctx, "SELECT id FROM "+schema+".outbox")
		if err != nil {
			return nil, 0, err
		}
		if seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return nil, 0, err
		}
		if _, err := e.ctl.Exec(ctx, "ANALYZE "+schema+".outbox"); err != nil {
			return nil, 0, err
		}
	}
	if int64(len(seqs)) != n {
		return nil, 0, fmt.Errorf("pre-filling the backlog: wrote %d messages, found %d", n, len(seqs))
	}
	if _, err := e.quiesce(ctx); err != nil {
		return nil, 0, err
	}
	return seqs, rate, nil
}

// overload computes a --backlog run's figures from the window's first and
// last readings and the backlog readings between them.
func overload(backlog int64, prefillRate float64, first, last Sample, readings []float64, tr *tracker, inProcess bool) *Overload {
	ov := &Overload{Backlog: backlog, PrefillRate: prefillRate, WindowSeconds: last.Seconds - first.Seconds,
		OutstandingAtStart: first.Backlog, ProducedInWindow: last.Produced - first.Produced,
		ProcessedInWindow: last.Processed - first.Processed, WorstSecond: -1, WorstSecondAt: -1, BacklogProcessed: -1}
	ov.OutstandingAtEnd = ov.OutstandingAtStart + ov.ProducedInWindow - ov.ProcessedInWindow
	ov.MinOutstanding = min(first.Backlog, last.Backlog)
	for _, b := range readings {
		ov.MinOutstanding = min(ov.MinOutstanding, int64(b))
	}
	ov.Saturated = ov.MinOutstanding > 0
	if ov.WindowSeconds > 0 {
		ov.OfferedRate = float64(ov.OutstandingAtStart+ov.ProducedInWindow) / ov.WindowSeconds
		ov.ProcessedRate = float64(ov.ProcessedInWindow) / ov.WindowSeconds
	}
	if inProcess {
		ov.WorstSecond, ov.WorstSecondAt = tr.worst()
	}
	return ov
}

// overloadNote says how an overload run's figures were obtained.
func overloadNote(res *Result, o Options) {
	res.note("overload (--backlog %d): the outbox was pre-filled before the relay and the producers started (see overload.backlog), so the relay was offered the producers' %d msg/s plus the backlog. offered_rate = (outstanding at the window's start + produced in the window) / window; processed_rate = processed in the window / window, both from the window's first and last readings; saturated = the backlog never reached 0 in the window (then processed_rate is the relay's throughput under overload). the verdict is the steady run's, on the whole backlog (pre-fill included): a backlog of more than 2 s of --rate left at the stop fails it", o.Backlog, o.Rate)
	res.note("overload: messages, delivered, wal_bytes_per_msg and commits_per_msg include the pre-filled messages (the counters are read before the pre-fill); the latency covers the producers' messages only (the pre-filled ones have no commit time)")
	if !o.InProcess {
		res.note("overload with relay processes: each reading counts the outbox's rows (a scan of the backlog, which costs the relay some of its rate), and the worst second is not known")
	}
}
