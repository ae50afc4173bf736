package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Latency is end-to-end latency, commit → sink acknowledgement, in
// milliseconds.
type Latency struct {
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
	Count int64   `json:"count"` // messages measured
}

// Sample is one point of the time series, taken every SampleInterval.
type Sample struct {
	// Seconds is the time since the relays started (drain) or since the
	// producers started.
	Seconds float64 `json:"t"`
	// Produced and Processed are cumulative message counts.
	Produced  int64 `json:"produced"`
	Processed int64 `json:"processed"`
	// ProducedRate and ProcessedRate are msgs/s since the previous sample.
	ProducedRate  float64 `json:"produced_rate"`
	ProcessedRate float64 `json:"processed_rate"`
	// Backlog is produced minus acknowledged (in-process relay) or the
	// outbox's row count (relay processes; during a drain, the pre-fill minus
	// the rows removed per pg_stat_user_tables, to avoid scanning it).
	Backlog int64 `json:"backlog"`
	// P50 and P99 are the latencies of the messages acknowledged since the
	// previous sample, in ms (0 when unknown).
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	// CPUPercent is the CPU the bench process used over the interval, in
	// percent of one core, when the relay runs in-process (the producers are
	// included); 0 with relay processes, which are not sampled per interval.
	CPUPercent float64 `json:"cpu_pct"`
	// Phase is warmup, measure or tail (after the producers stopped).
	Phase string `json:"phase"`
}

// Step is one steady run of a sweep.
type Step struct {
	Rate           int      `json:"rate"`
	ProducerRate   float64  `json:"producer_rate"`
	ProcessingRate float64  `json:"processing_rate"`
	BacklogSlope   float64  `json:"backlog_slope"`
	BacklogAtStop  int64    `json:"backlog_at_stop"`
	Sustainable    bool     `json:"sustainable"`
	VerdictReason  string   `json:"verdict_reason"`
	LatencyMS      *Latency `json:"latency_ms"`
}

// Result is what a run measured. Rates are msgs/s; fields that do not apply
// to a mode are zero, and Notes say how each figure was obtained.
type Result struct {
	Mode Mode `json:"mode"`
	// TargetRate is the steady rate, or the highest sustainable rate a sweep
	// found (0 when none was).
	TargetRate float64 `json:"target_rate"`
	// ProducerRate is what the producers achieved after the warm-up: the
	// messages committed after it over the planned window (drain: the COPY
	// pre-fill's rate).
	ProducerRate float64 `json:"producer_rate"`
	// ProcessingRate is what the relays delivered after the warm-up (drain:
	// messages / DrainSeconds).
	ProcessingRate float64 `json:"processing_rate"`
	// BacklogSlope is the least-squares growth of the backlog after the
	// warm-up, msgs/s.
	BacklogSlope float64 `json:"backlog_slope"`
	// BacklogAtStop is the backlog when the producers stopped.
	BacklogAtStop int64 `json:"backlog_at_stop"`
	// DrainSeconds is the time to empty the outbox: from the relays' start
	// (drain), or from the producers' stop (steady; -1 when the relays had not
	// caught up within the tail wait).
	DrainSeconds float64 `json:"drain_seconds"`
	// Sustainable is the steady verdict of DESIGN.md §6 (false for drain and
	// baseline).
	Sustainable   bool   `json:"sustainable"`
	VerdictReason string `json:"verdict_reason"`
	// LatencyMS is commit → sink ack; nil when it cannot be measured.
	LatencyMS *Latency `json:"latency_ms"`
	// WALBytesPerMsg and CommitsPerMsg are PostgreSQL's WAL growth and
	// committed transactions over the measured part, per message.
	WALBytesPerMsg float64 `json:"wal_bytes_per_msg"`
	CommitsPerMsg  float64 `json:"commits_per_msg"`
	// DeadTuples is the outbox's n_dead_tup at the end.
	DeadTuples int64 `json:"dead_tuples"`
	// RelayCPUSeconds and RelayPeakRSSBytes are the relays' resource use (see
	// RelayUsageNote for what was measured).
	RelayCPUSeconds   float64 `json:"relay_cpu_seconds"`
	RelayPeakRSSBytes int64   `json:"relay_peak_rss_bytes"`
	// Messages is how many messages the run enqueued.
	Messages int64 `json:"messages"`
	// Relays is how many relays ran.
	Relays   int      `json:"relays"`
	Settings Settings `json:"settings"`

	// Delivered is the distinct messages acknowledged (in-process relay), or
	// enqueued minus left in the outbox (relay processes).
	Delivered int64 `json:"delivered"`
	// Redelivered counts acknowledgements of already acknowledged messages
	// (in-process relay only).
	Redelivered int64 `json:"redelivered"`
	// OutboxRemaining is the outbox's row count at the end.
	OutboxRemaining int64 `json:"outbox_remaining"`
	// SinkPublishRate is a direct publish to the sink without the outbox
	// (baseline only).
	SinkPublishRate float64 `json:"sink_publish_rate,omitempty"`
	// LatencyNote says how latency was measured, or why it was not.
	LatencyNote string `json:"latency_note"`
	// RelayUsageNote says what the CPU and RSS figures cover.
	RelayUsageNote string `json:"relay_usage_note"`
	// Notes are further remarks on the method.
	Notes []string `json:"notes"`
	// PostgresVersion is the server's version.
	PostgresVersion string `json:"postgres_version"`
	// Started is when the run began.
	Started time.Time `json:"started"`
	// Steps are a sweep's runs in order.
	Steps []Step `json:"steps,omitempty"`
	// Samples are the time series (of the best step, in a sweep).
	Samples []Sample `json:"samples"`
}

const topic = "bench"

// env is what every run of one Run call shares.
type env struct {
	o       Options
	ctl     *pgxpool.Pool
	version string
}

// Run measures what opts.Mode says and returns the result. The schema it
// works in is dropped at the end unless opts.Keep; an interrupted ctx stops
// producers and relays and returns ctx's error.
func Run(ctx context.Context, opts Options) (*Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.DatabaseURL == "" {
		return nil, errors.New("--database-url is required")
	}
	if o.Schema == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		o.Schema = "wharf_bench_" + hex.EncodeToString(b[:])
	}
	if err := wharfmigrate.ValidateSchema(o.Schema); err != nil {
		return nil, fmt.Errorf("--schema: %w", err)
	}
	ctl, err := connect(ctx, o.DatabaseURL, 4)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	e := &env{o: o, ctl: ctl}
	_ = ctl.QueryRow(ctx, "SHOW server_version").Scan(&e.version)
	started := time.Now()
	var res *Result
	switch o.Mode {
	case ModeDrain:
		res, err = e.drain(ctx, o.Schema)
	case ModeBaseline:
		res, err = e.load(ctx, o.Schema, 0, false, "baseline")
	case ModeSteady:
		res, err = e.load(ctx, o.Schema, float64(o.Rate), false, fmt.Sprintf("steady %d/s", o.Rate))
	case ModeSweep:
		res, err = e.sweep(ctx)
	}
	if err != nil {
		return nil, err
	}
	res.Mode = o.Mode
	res.Settings = o.settings()
	res.PostgresVersion = e.version
	res.Started = started
	return res, nil
}

func connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url is malformed: %w", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database (check --database-url): %w", err)
	}
	return pool, nil
}

// createSchema migrates a fresh schema and returns a function dropping it
// (unless Keep).
func (e *env) createSchema(ctx context.Context, schema string) (func(), error) {
	var exists bool
	if err := e.ctl.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		return nil, err
	}
	if exists {
		return nil, fmt.Errorf("--schema: schema %s already exists; the bench needs a fresh one (drop it, or leave --schema out)", schema)
	}
	m, err := wharfmigrate.New(schema)
	if err != nil {
		return nil, fmt.Errorf("--schema: %w", err)
	}
	drop := func() {
		if e.o.Keep {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.ctl.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			e.o.Logger.Warn("wharf bench: dropping the schema failed", "schema", schema, "err", err)
		}
	}
	if _, err := m.Up(ctx, e.ctl); err != nil {
		drop()
		return nil, err
	}
	return drop, nil
}

// pgCounters are the server counters the run reports per message.
type pgCounters struct {
	lsn     string
	commits int64
}

func (e *env) counters(ctx context.Context) (pgCounters, error) {
	var c pgCounters
	err := e.ctl.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text,
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())`).Scan(&c.lsn, &c.commits)
	return c, err
}

// finish fills in the server-side figures. The workers' connections must be
// closed already: a backend flushes its statistics when it exits (or at most
// once a second), so finish waits a moment before reading them.
func (e *env) finish(ctx context.Context, res *Result, schema string, before pgCounters, messages int64) error {
	time.Sleep(600 * time.Millisecond)
	if _, err := e.ctl.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return err
	}
	after, err := e.counters(ctx)
	if err != nil {
		return err
	}
	var wal float64
	if err := e.ctl.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8`, after.lsn, before.lsn).Scan(&wal); err != nil {
		return err
	}
	if messages > 0 {
		res.WALBytesPerMsg = wal / float64(messages)
		res.CommitsPerMsg = float64(after.commits-before.commits) / float64(messages)
	}
	if err := e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0)`, schema).Scan(&res.DeadTuples); err != nil {
		return err
	}
	if err := e.ctl.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&res.OutboxRemaining); err != nil {
		return err
	}
	res.Notes = append(res.Notes,
		"WAL is cluster-wide and commits database-wide: anything else running on the server is counted too",
		"dead_tuples is pg_stat_user_tables.n_dead_tup of the outbox at the end")
	return nil
}

// outboxCount is the outbox's row count: exact, and cheap while the backlog
// is small (steady state).
func (e *env) outboxCount(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.ctl.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n)
	return n, err
}

// outboxRemoved is how many rows the relays removed from the outbox so far,
// from PostgreSQL's statistics (n_tup_del). During a drain, counting the
// outbox's rows every second scans the whole backlog, which costs relay
// processes about a third of their rate; the statistics cost nothing but lag
// up to about a second (busy backends flush them once a second), too much for
// the steady-state verdict, whose thresholds are a second or two of load.
func (e *env) outboxRemoved(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0)`, schema).Scan(&n)
	return n, err
}

func (e *env) outboxEmpty(ctx context.Context, schema string) (bool, error) {
	var some bool
	err := e.ctl.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+schema+".outbox)").Scan(&some)
	return !some, err
}

func (e *env) startRelays(ctx context.Context, schema string, tr *tracker, withProducers bool) (relays, error) {
	if e.o.InProcess {
		return startInProcess(ctx, e.o, schema, tr, withProducers)
	}
	return startProcesses(e.o, schema)
}

func (e *env) stopRelays(r relays, res *Result) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := r.stop(ctx)
	res.RelayCPUSeconds = u.cpu.Seconds()
	res.RelayPeakRSSBytes = u.peakRSS
	res.RelayUsageNote = u.note
	return err
}

// keyer names message i's key.
type keyer struct {
	o       Options
	lastIdx int64
	last    string
}

func (k *keyer) key(i int64) string {
	var idx int64
	switch {
	case k.o.Keys > 0:
		return "k" + strconv.FormatInt(i%int64(k.o.Keys), 10)
	case k.o.RecordsPerKey < 0:
		return ""
	default:
		idx = i / int64(k.o.RecordsPerKey)
	}
	if k.last == "" || idx != k.lastIdx {
		k.lastIdx, k.last = idx, "k"+strconv.FormatInt(idx, 10)
	}
	return k.last
}

func makePayload(n int) []byte {
	p := make([]byte, n)
	p[0] = '"'
	for i := 1; i < n-1; i++ {
		p[i] = 'a' + byte(i%26)
	}
	p[n-1] = '"'
	return p
}

// drain pre-fills the outbox with COPY and times the relays emptying it.
func (e *env) drain(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	drop, err := e.createSchema(ctx, schema)
	if err != nil {
		return nil, err
	}
	defer drop()
	res := &Result{Relays: o.Relays, Messages: int64(o.Messages), TargetRate: 0}

	fillStart := time.Now()
	kr := &keyer{o: o}
	payload := makePayload(o.PayloadBytes)
	var i int64
	n, err := e.ctl.CopyFrom(ctx, pgx.Identifier{schema, "outbox"}, []string{"topic", "key", "payload"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= int64(o.Messages) {
				return nil, nil
			}
			var key any
			if k := kr.key(i); k != "" {
				key = k
			}
			i++
			return []any{topic, key, payload}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("pre-filling the outbox: %w", err)
	}
	res.ProducerRate = float64(n) / time.Since(fillStart).Seconds()
	if _, err := e.ctl.Exec(ctx, "VACUUM ANALYZE "+schema+".outbox"); err != nil {
		return nil, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	tr := newTracker(start, 0)
	r, err := e.startRelays(ctx, schema, tr, false)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = e.stopRelays(r, res)
		}
	}()
	total := int64(o.Messages)
	sm := newSampler(e, schema, start, tr, o.InProcess, "drain")
	sm.fixedProduced = total
	if err := sm.sample(ctx, "measure"); err != nil {
		return nil, err
	}
	tick := time.NewTicker(o.SampleInterval)
	defer tick.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	var end time.Time
	for end.IsZero() {
		select {
		case <-tick.C:
			if err := sm.sample(ctx, "measure"); err != nil {
				return nil, err
			}
		case <-poll.C:
			if o.InProcess && tr.acked.Load() < total {
				continue
			}
			empty, err := e.outboxEmpty(ctx, schema)
			if err != nil {
				return nil, err
			}
			if empty {
				end = time.Now()
			}
		case err := <-r.exited():
			return nil, err
		case <-deadline.C:
			return nil, fmt.Errorf("drain not done after %s (raise --timeout)", o.Timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res.DrainSeconds = end.Sub(start).Seconds()
	res.ProcessingRate = float64(total) / res.DrainSeconds
	if err := sm.sample(ctx, "measure"); err != nil {
		return nil, err
	}
	sm.progressDone()
	stopped = true
	if err := e.stopRelays(r, res); err != nil {
		return nil, err
	}
	res.Samples = sm.samples
	if o.InProcess {
		res.Delivered = tr.acked.Load()
		_, res.Redelivered = tr.summary()
		if res.Delivered != total {
			return nil, fmt.Errorf("the outbox is empty but the sink acknowledged %d of %d messages", res.Delivered, total)
		}
	} else {
		res.Delivered = total
	}
	res.VerdictReason = "n/a: drain mode has no target rate"
	res.LatencyNote = "n/a (drain: the messages were pre-filled, so commit → ack measures queueing, not the relay)"
	res.Notes = append(res.Notes,
		"producer_rate is the COPY pre-fill's rate (one COPY); the outbox is then VACUUM ANALYZEd, as scripts/drain-bench.sh did, and drain_seconds runs from the relays' start to an empty outbox",
		"wal_bytes_per_msg and commits_per_msg cover the drain only (the relays' reads, removals and leases), not the pre-fill")
	if !o.InProcess {
		res.Notes = append(res.Notes, "drain_seconds includes starting the relay processes")
	}
	if err := e.finish(ctx, res, schema, before, total); err != nil {
		return nil, err
	}
	return res, nil
}

// producers enqueue through the library, in transactions of ProducerBatch
// messages, on a token schedule: batch b is due at start + b*batch/rate, so
// a late batch is sent at once and the schedule, not a sleep per message,
// sets the rate. With rate 0 they run flat out.
type producers struct {
	o        Options
	pool     *pgxpool.Pool
	client   *wharf.Client
	payload  []byte
	next     atomic.Int64
	produced atomic.Int64
	// inWindow counts the messages whose commit returned at or after
	// measureFrom, timed by the producers themselves, so a late sampler
	// cannot shift the window's start.
	inWindow    atomic.Int64
	measureFrom time.Time
	onCommit    func(ids []int64, at time.Time)
}

func (p *producers) run(ctx context.Context, start time.Time, rate float64, stopAt time.Time) error {
	g, ctx := errgroup.WithContext(ctx)
	batch := p.o.ProducerBatch
	for range p.o.Producers {
		g.Go(func() error {
			msgs := make([]wharf.Message, batch)
			kr := &keyer{o: p.o}
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for {
				b := p.next.Add(1) - 1
				if rate > 0 {
					due := start.Add(time.Duration(float64(b) * float64(batch) / rate * float64(time.Second)))
					// Behind schedule, the producers still stop on time.
					if !due.Before(stopAt) || !time.Now().Before(stopAt) {
						return nil
					}
					if d := time.Until(due); d > 0 {
						timer.Reset(d)
						select {
						case <-timer.C:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
				} else if !time.Now().Before(stopAt) {
					return nil
				}
				first := b * int64(batch)
				for i := range msgs {
					msgs[i] = wharf.Message{Topic: topic, Key: kr.key(first + int64(i)), Payload: p.payload}
				}
				tx, err := p.pool.Begin(ctx)
				if err != nil {
					return err
				}
				ids, err := p.client.EnqueueTx(ctx, tx, msgs...)
				if err != nil {
					_ = tx.Rollback(ctx)
					return err
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				now := time.Now()
				if p.onCommit != nil {
					p.onCommit(ids, now)
				}
				p.produced.Add(int64(len(ids)))
				if !now.Before(p.measureFrom) {
					p.inWindow.Add(int64(len(ids)))
				}
			}
		})
	}
	return g.Wait()
}

// load runs the producers at rate (0: flat out, no relays: baseline) for
// Warmup+Duration and measures the relays keeping up.
func (e *env) load(ctx context.Context, schema string, rate float64, inSweep bool, label string) (*Result, error) {
	o := e.o
	baseline := rate == 0
	warmup := o.Warmup
	if baseline {
		warmup = 0
	}
	drop, err := e.createSchema(ctx, schema)
	if err != nil {
		return nil, err
	}
	defer drop()
	res := &Result{TargetRate: rate, Relays: o.Relays}
	if baseline {
		res.Relays = 0
	}
	pool, err := connect(ctx, o.DatabaseURL, int32(o.Producers))
	if err != nil {
		return nil, err
	}
	poolClosed := false
	defer func() {
		if !poolClosed {
			pool.Close()
		}
	}()
	client, err := wharf.NewClient(nil, &wharf.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	tr := newTracker(start, warmup)
	p := &producers{o: o, pool: pool, client: client, payload: makePayload(o.PayloadBytes), measureFrom: start.Add(warmup)}
	var r relays
	if !baseline {
		if o.InProcess {
			p.onCommit = tr.committed
		}
		r, err = e.startRelays(ctx, schema, tr, true)
		if err != nil {
			return nil, err
		}
	}
	relaysStopped := baseline
	defer func() {
		if !relaysStopped {
			_ = e.stopRelays(r, res)
		}
	}()
	var exited <-chan error
	if r != nil {
		exited = r.exited()
	}

	sm := newSampler(e, schema, start, tr, o.InProcess && !baseline, label)
	sm.produced = &p.produced
	sm.noRelay = baseline
	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	stopAt := start.Add(warmup + o.Duration)
	prodDone := make(chan error, 1)
	go func() { prodDone <- p.run(prodCtx, start, rate, stopAt) }()
	defer func() {
		cancelProd()
		select {
		case <-prodDone:
		case <-time.After(30 * time.Second):
		}
	}()

	tick := time.NewTicker(o.SampleInterval)
	defer tick.Stop()
	var warmC <-chan time.Time
	if warmup > 0 {
		wt := time.NewTimer(time.Until(start.Add(warmup)))
		defer wt.Stop()
		warmC = wt.C
	}
	// With the relay in this process the backlog costs nothing to read, so
	// the slope is fitted to a reading every 20 ms rather than to the samples:
	// the backlog jitters by up to a poll interval's worth of messages, which
	// a handful of points cannot average out.
	fineInterval := 20 * time.Millisecond
	var fineC <-chan time.Time
	var fitX, fitY []float64
	if sm.inProcess {
		fine := time.NewTicker(fineInterval)
		defer fine.Stop()
		fineC = fine.C
	}
	var warm *Sample
	if warmup == 0 {
		if err := sm.sample(ctx, "measure"); err != nil {
			return nil, err
		}
		warm = sm.last()
	}
	for producing := true; producing; {
		select {
		case <-fineC:
			if warm != nil {
				x, _ := sm.measure(ctx, "measure", false) // in-process: no query, no error
				fitX, fitY = append(fitX, x.Seconds), append(fitY, float64(x.Backlog))
			}
		case <-tick.C:
			phase := "measure"
			if warm == nil {
				phase = "warmup"
			}
			if err := sm.sample(ctx, phase); err != nil {
				return nil, err
			}
		case <-warmC:
			// The warm-up's end is the first point of the fit, not a sample
			// of the series (it would fall between two).
			w, err := sm.measure(ctx, "measure", false)
			if err != nil {
				return nil, err
			}
			warm = &w
		case err := <-prodDone:
			prodDone <- nil // for the deferred wait
			if err != nil {
				return nil, fmt.Errorf("producer failed: %w", err)
			}
			producing = false
		case err := <-exited:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := sm.sample(ctx, "measure"); err != nil {
		return nil, err
	}
	stop := sm.last()
	if warm == nil { // the producers stopped before the warm-up ended
		warm = &sm.samples[0]
	}
	// The rates are over the planned window: producers start no batch after
	// stopAt, so what they fell behind is missing from the count, while a
	// last commit that returned a little late does not stretch the window.
	window := stopAt.Sub(start).Seconds() - warm.Seconds
	if window > 0 {
		res.ProducerRate = float64(p.inWindow.Load()) / window
		res.ProcessingRate = float64(stop.Processed-warm.Processed) / window
	}
	res.Messages = stop.Produced
	xs, ys := []float64{warm.Seconds}, []float64{float64(warm.Backlog)}
	if sm.inProcess {
		xs, ys = append(xs, fitX...), append(ys, fitY...)
		xs, ys = append(xs, stop.Seconds), append(ys, float64(stop.Backlog))
	} else {
		for _, s := range sm.samples {
			if s.Seconds > warm.Seconds {
				xs = append(xs, s.Seconds)
				ys = append(ys, float64(s.Backlog))
			}
		}
	}

	if baseline {
		pool.Close()
		poolClosed = true
		res.VerdictReason = "n/a: baseline runs no relay"
		res.LatencyNote = "n/a (baseline runs no relay)"
		res.RelayUsageNote = "n/a (baseline runs no relay)"
		res.Notes = append(res.Notes, "wal_bytes_per_msg and commits_per_msg cover the inserts alone")
		rate, err := publishRate(ctx, o)
		if err != nil {
			return nil, err
		}
		res.SinkPublishRate = rate
		res.Notes = append(res.Notes, "sink_publish_rate: batches of 1000 messages published straight to --sink for one second, without an outbox")
		sm.progressDone()
		res.Samples = sm.samples
		if err := e.finish(ctx, res, schema, before, res.Messages); err != nil {
			return nil, err
		}
		return res, nil
	}

	res.BacklogSlope = Slope(xs, ys)
	res.BacklogAtStop = stop.Backlog
	res.Sustainable, res.VerdictReason = Verdict(rate, res.ProducerRate, res.BacklogSlope, res.BacklogAtStop)

	// Tail: let the relays deliver what is left, so the latency covers every
	// message, and time how long catching up takes.
	res.DrainSeconds = -1
	if !inSweep || res.Sustainable {
		stopT := time.Now()
		tailEnd := time.NewTimer(o.TailWait)
		defer tailEnd.Stop()
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
	tail:
		for {
			select {
			case <-tick.C:
				if err := sm.sample(ctx, "tail"); err != nil {
					return nil, err
				}
			case <-poll.C:
				var done bool
				if o.InProcess {
					done = tr.acked.Load() >= p.produced.Load()
				} else if done, err = e.outboxEmpty(ctx, schema); err != nil {
					return nil, err
				}
				if done {
					res.DrainSeconds = time.Since(stopT).Seconds()
					break tail
				}
			case <-tailEnd.C:
				break tail
			case err := <-exited:
				return nil, err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if err := sm.sample(ctx, "tail"); err != nil {
			return nil, err
		}
	}
	sm.progressDone()
	relaysStopped = true
	if err := e.stopRelays(r, res); err != nil {
		return nil, err
	}
	pool.Close()
	poolClosed = true
	res.Samples = sm.samples
	if o.InProcess {
		res.Delivered = tr.acked.Load()
		res.LatencyMS, res.Redelivered = tr.summary()
		res.LatencyNote = "commit → sink ack: the producer records the time its Commit returned per message id, the in-process relay's probe sink the time the sink acknowledged; messages acknowledged during the warm-up are excluded"
		if missing := res.Messages - res.Delivered; missing > 0 {
			res.LatencyNote += fmt.Sprintf("; %d messages not acknowledged by the end are not counted", missing)
		}
	} else {
		res.LatencyNote = "n/a (multi-process): relay processes cannot report acknowledgement times; run --relays 1 --in-process for latency"
	}
	res.Notes = append(res.Notes,
		"backlog is produced minus acknowledged (in-process relay) or the outbox's row count (relay processes; during a drain, the pre-fill minus pg_stat_user_tables.n_tup_del, which lags up to ~1 s but does not scan the backlog); the slope is a least-squares fit after the warm-up, to a backlog reading every 20 ms (in-process relay) or to the samples (relay processes)",
		"producer_rate is the messages committed after the warm-up over the planned window (batch i is due at start + i*batch/rate; no batch starts after the planned stop, so a producer that fell behind comes short)",
		"drain_seconds is the time from the producers' stop until the relays caught up (-1: not within --tail-wait)",
		"wal_bytes_per_msg and commits_per_msg cover the inserts and the relays' work together")
	if err := e.finish(ctx, res, schema, before, res.Messages); err != nil {
		return nil, err
	}
	if !o.InProcess {
		res.Delivered = res.Messages - res.OutboxRemaining
	}
	return res, nil
}

// publishRate publishes batches straight to the sink for a second.
func publishRate(ctx context.Context, o Options) (float64, error) {
	sink, err := sinkurl.Open(ctx, o.Sink)
	if err != nil {
		return 0, fmt.Errorf("--sink: %w", err)
	}
	defer sink.Close()
	kr := &keyer{o: o}
	payload := makePayload(o.PayloadBytes)
	batch := make([]*wharf.Message, 1000)
	var sent int64
	start := time.Now()
	for time.Since(start) < time.Second {
		for i := range batch {
			id := sent + int64(i) + 1
			batch[i] = &wharf.Message{ID: id, Topic: topic, Key: kr.key(id), Payload: payload}
		}
		for i, err := range sink.Publish(ctx, batch) {
			if err != nil {
				return 0, fmt.Errorf("--sink: publishing message %d directly: %w", batch[i].ID, err)
			}
		}
		sent += int64(len(batch))
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return float64(sent) / time.Since(start).Seconds(), nil
}

// sweep bisects the rate between MinRate and MaxRate.
func (e *env) sweep(ctx context.Context) (*Result, error) {
	o := e.o
	lo, hi := o.MinRate, o.MaxRate
	var best *Result
	var steps []Step
	for i := range o.SweepSteps {
		rate := (lo + hi) / 2
		if rate > 1000 {
			rate = int(math.Round(float64(rate)/100) * 100)
		}
		schema := fmt.Sprintf("%s_%d", o.Schema, i+1)
		label := fmt.Sprintf("sweep %d/%d: %d/s", i+1, o.SweepSteps, rate)
		r, err := e.load(ctx, schema, float64(rate), true, label)
		if err != nil {
			return nil, fmt.Errorf("sweep step %d (%d msg/s): %w", i+1, rate, err)
		}
		steps = append(steps, Step{Rate: rate, ProducerRate: r.ProducerRate, ProcessingRate: r.ProcessingRate,
			BacklogSlope: r.BacklogSlope, BacklogAtStop: r.BacklogAtStop, Sustainable: r.Sustainable,
			VerdictReason: r.VerdictReason, LatencyMS: r.LatencyMS})
		if o.Progress != nil {
			verdict := "NOT sustainable"
			if r.Sustainable {
				verdict = "sustainable"
			}
			fmt.Fprintf(o.Progress, "sweep %d/%d: %d msg/s %s (%s)\n", i+1, o.SweepSteps, rate, verdict, r.VerdictReason)
		}
		if r.Sustainable {
			lo = rate
			best = r
		} else {
			hi = rate
		}
	}
	if best == nil {
		best = &Result{Relays: o.Relays,
			VerdictReason: fmt.Sprintf("no tested rate was sustainable (lowest tried %d msg/s); lower --min-rate", steps[len(steps)-1].Rate)}
	} else {
		best.VerdictReason = fmt.Sprintf("highest sustainable rate found in %d steps (the next one up failed or was not tried): %s", len(steps), best.VerdictReason)
	}
	best.Steps = steps
	best.Notes = append(best.Notes, "sweep: every figure but steps comes from the highest sustainable step")
	return best, nil
}
