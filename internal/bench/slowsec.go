package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
)

// A slow second is a whole second of a steady run's window in which the
// relay acknowledged less than slowFraction of the target rate. While the
// window runs, a watch reads what could explain one: the relay's fetches
// and result writes, this process's garbage collections and CPU, the
// machine's CPU, and the server's checkpoints and autovacuums. Each slow
// second is then reported with what changed from the reading before it
// began to the first after it ended.
const (
	slowFraction = 0.8
	// watchEvery is the watch's reading period: a reading is a query of
	// the server's statistics views and a few counters of this process.
	watchEvery = 250 * time.Millisecond
	// maxSlowSeconds is how many slow seconds a result describes (the
	// slowest ones; SlowSecondsTotal counts them all).
	maxSlowSeconds = 10
)

// SlowSecond is one second of the window below slowFraction of the target
// rate and what was seen around it (from the watch reading before the
// second to the first after it).
type SlowSecond struct {
	// Second is its start in seconds into the window; Acked the messages
	// acknowledged in it; Percent of the target rate.
	Second  int     `json:"second"`
	Acked   int64   `json:"acked"`
	Percent float64 `json:"percent_of_target"`
	// Span is the seconds the readings around it cover.
	Span float64 `json:"span_seconds"`
	// Fetches and FetchSeconds: the relay's fetches that ended in the
	// span and their total time; FetchMaxBound the upper bound of the
	// slowest one's histogram bucket. ResultWrites and ResultWriteSeconds
	// likewise for the writes of delivery results.
	Fetches            int64   `json:"fetches"`
	FetchSeconds       float64 `json:"fetch_seconds"`
	FetchMaxBound      float64 `json:"fetch_max_bound_seconds"`
	ResultWrites       int64   `json:"result_writes"`
	ResultWriteSeconds float64 `json:"result_write_seconds"`
	ResultWriteMax     float64 `json:"result_write_max_bound_seconds"`
	// GCCycles and GCPauseMS: this process's collections in the span and
	// their stop-the-world pauses.
	GCCycles  int64   `json:"gc_cycles"`
	GCPauseMS float64 `json:"gc_pause_ms"`
	// ProcessCPU is this process's CPU over the span in percent of one
	// core; MachineBusy the machine's, in percent of all its cores (-1
	// when /proc/stat cannot be read).
	ProcessCPU  float64 `json:"process_cpu_pct"`
	MachineBusy float64 `json:"machine_busy_pct"`
	// Checkpoints ended in the span (timed or requested); Autovacuums of
	// the outbox ended in it (vacuums and analyzes); Running lists the
	// autovacuum workers and the checkpointer's wait seen at the readings.
	Checkpoints int64    `json:"checkpoints"`
	Autovacuums int64    `json:"outbox_autovacuums"`
	Running     []string `json:"running,omitempty"`
}

// watchReading is one reading of the watch.
type watchReading struct {
	at                 time.Duration // since the window's start
	fetch, write       []uint64      // cumulative histogram counts
	fetchSum, writeSum float64
	gcCycles           int64
	gcPause            time.Duration
	cpu                time.Duration
	busy, total        uint64 // /proc/stat jiffies of all CPUs
	checkpoints        int64
	autovacuums        int64
	running            []string
}

// watch takes readings every watchEvery from the window's start until
// stopped.
type watch struct {
	start  time.Time // the window's start
	stats  *wharf.Stats
	ctl    *pgxpool.Pool
	schema string

	mu       sync.Mutex
	readings []watchReading
	err      error
	stop     chan struct{}
	done     chan struct{}
}

func startWatch(ctx context.Context, start time.Time, stats *wharf.Stats, ctl *pgxpool.Pool, schema string) *watch {
	w := &watch{start: start, stats: stats, ctl: ctl, schema: schema, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(ctx)
	return w
}

func (w *watch) run(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		r, err := w.read(ctx)
		w.mu.Lock()
		if err != nil {
			if w.err == nil {
				w.err = err
			}
		} else {
			w.readings = append(w.readings, r)
		}
		w.mu.Unlock()
		select {
		case <-t.C:
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// finish stops the watch after one last reading and returns its readings.
func (w *watch) finish() ([]watchReading, error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readings, w.err
}

func (w *watch) read(ctx context.Context) (watchReading, error) {
	r := watchReading{at: time.Since(w.start)}
	r.fetch, r.fetchSum = w.stats.FetchSeconds.Snapshot()
	r.write, r.writeSum = w.stats.ResultWriteSeconds.Snapshot()
	var gc debug.GCStats
	debug.ReadGCStats(&gc)
	r.gcCycles, r.gcPause = gc.NumGC, gc.PauseTotal
	r.cpu, _, _ = selfUsage()
	r.busy, r.total = machineJiffies()
	var running string
	err := w.ctl.QueryRow(ctx, `SELECT
    (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
    coalesce((SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables
              WHERE schemaname = $1 AND relname = 'outbox'), 0),
    coalesce((SELECT string_agg(CASE WHEN backend_type = 'checkpointer' THEN 'checkpointer ' || wait_event
                                     ELSE regexp_replace(query, '^autovacuum: ', 'autovacuum ') END, '|' ORDER BY pid)
              FROM pg_stat_activity
              WHERE backend_type = 'autovacuum worker' AND query <> ''
                 OR backend_type = 'checkpointer' AND wait_event IS NOT NULL
                    AND wait_event NOT IN ('CheckpointerMain')), '')`, w.schema).
		Scan(&r.checkpoints, &r.autovacuums, &running)
	if err != nil {
		return r, fmt.Errorf("the slow-second watch's reading of the server's statistics: %w", err)
	}
	if running != "" {
		r.running = strings.Split(running, "|")
	}
	return r, nil
}

// machineJiffies returns the busy and total jiffies of all CPUs from
// /proc/stat (0, 0 when it cannot be read).
func machineJiffies() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// slowSeconds finds the window's seconds below slowFraction of rate in
// perSecond (acknowledgements per second of the window) and describes the
// slowest maxSlowSeconds of them from the readings. It returns them in
// window order and how many there were in all.
func slowSeconds(perSecond []int64, rate float64, readings []watchReading, bounds []float64) ([]SlowSecond, int) {
	type sec struct {
		i int
		n int64
	}
	var slow []sec
	for i, n := range perSecond {
		if float64(n) < slowFraction*rate {
			slow = append(slow, sec{i, n})
		}
	}
	total := len(slow)
	// The slowest first, then back in window order.
	slices.SortFunc(slow, func(a, b sec) int { return cmp.Or(cmp.Compare(a.n, b.n), cmp.Compare(a.i, b.i)) })
	if len(slow) > maxSlowSeconds {
		slow = slow[:maxSlowSeconds]
	}
	slices.SortFunc(slow, func(a, b sec) int { return cmp.Compare(a.i, b.i) })
	out := make([]SlowSecond, 0, len(slow))
	for _, s := range slow {
		x := SlowSecond{Second: s.i, Acked: s.n, Percent: 100 * float64(s.n) / rate, MachineBusy: -1}
		from, to := bracket(readings, time.Duration(s.i)*time.Second, time.Duration(s.i+1)*time.Second)
		if from != nil && to != nil {
			describe(&x, from, to, bounds)
		}
		out = append(out, x)
	}
	return out, total
}

// bracket returns the last reading at or before a and the first at or
// after b (nil when there is none).
func bracket(rs []watchReading, a, b time.Duration) (from, to *watchReading) {
	for i := range rs {
		if rs[i].at <= a {
			from = &rs[i]
		}
		if to == nil && rs[i].at >= b {
			to = &rs[i]
		}
	}
	return from, to
}

func describe(x *SlowSecond, from, to *watchReading, bounds []float64) {
	span := (to.at - from.at).Seconds()
	x.Span = span
	x.Fetches, x.FetchSeconds, x.FetchMaxBound = histDelta(from.fetch, to.fetch, from.fetchSum, to.fetchSum, bounds)
	x.ResultWrites, x.ResultWriteSeconds, x.ResultWriteMax = histDelta(from.write, to.write, from.writeSum, to.writeSum, bounds)
	x.GCCycles = to.gcCycles - from.gcCycles
	x.GCPauseMS = float64(to.gcPause-from.gcPause) / float64(time.Millisecond)
	if span > 0 {
		x.ProcessCPU = 100 * (to.cpu - from.cpu).Seconds() / span
	}
	if dt := to.total - from.total; to.total > 0 && from.total > 0 && dt > 0 {
		x.MachineBusy = 100 * float64(to.busy-from.busy) / float64(dt)
	}
	x.Checkpoints = to.checkpoints - from.checkpoints
	x.Autovacuums = to.autovacuums - from.autovacuums
	seen := map[string]bool{}
	for _, r := range []*watchReading{from, to} {
		for _, s := range r.running {
			if !seen[s] {
				seen[s] = true
				x.Running = append(x.Running, s)
			}
		}
	}
}

// histDelta returns the observations between two cumulative snapshots,
// their sum, and the upper bound of the highest bucket that gained one
// (+Inf as -1).
func histDelta(a, b []uint64, sumA, sumB float64, bounds []float64) (n int64, sum, maxBound float64) {
	if len(a) == 0 || len(b) != len(a) {
		return 0, 0, 0
	}
	n = int64(b[len(b)-1] - a[len(a)-1])
	for i := len(b) - 1; i >= 0; i-- {
		var prevA, prevB uint64
		if i > 0 {
			prevA, prevB = a[i-1], b[i-1]
		}
		if (b[i] - prevB) > (a[i] - prevA) {
			if i < len(bounds) {
				maxBound = bounds[i]
			} else {
				maxBound = -1
			}
			break
		}
	}
	return n, sumB - sumA, maxBound
}

// String is the slow second in one line.
func (x SlowSecond) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "second %d: %d msgs (%.0f %%)", x.Second+1, x.Acked, x.Percent)
	if x.Span == 0 {
		b.WriteString("; no readings around it")
		return b.String()
	}
	fmt.Fprintf(&b, "; over %.2f s around it: %d fetches (%.0f ms", x.Span, x.Fetches, 1000*x.FetchSeconds)
	if x.Fetches > 0 {
		fmt.Fprintf(&b, ", slowest %s", bound(x.FetchMaxBound))
	}
	fmt.Fprintf(&b, "), %d result writes (%.0f ms", x.ResultWrites, 1000*x.ResultWriteSeconds)
	if x.ResultWrites > 0 {
		fmt.Fprintf(&b, ", slowest %s", bound(x.ResultWriteMax))
	}
	fmt.Fprintf(&b, "), %d GC (%.1f ms paused), process CPU %.0f %%", x.GCCycles, x.GCPauseMS, x.ProcessCPU)
	if x.MachineBusy >= 0 {
		fmt.Fprintf(&b, ", machine %.0f %% busy", x.MachineBusy)
	}
	if x.Checkpoints > 0 {
		fmt.Fprintf(&b, ", %d checkpoint(s) ended", x.Checkpoints)
	}
	if x.Autovacuums > 0 {
		fmt.Fprintf(&b, ", %d autovacuum(s) of the outbox ended", x.Autovacuums)
	}
	if len(x.Running) > 0 {
		fmt.Fprintf(&b, "; running: %s", strings.Join(x.Running, ", "))
	}
	return b.String()
}

func bound(s float64) string {
	if s < 0 {
		return "over 30 s"
	}
	return fmt.Sprintf("≤ %g ms", 1000*s)
}
