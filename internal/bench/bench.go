package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/walstream"
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
	// P99PerSecond is the median, over the seconds of the measurement
	// window, of each second's p99 (messages by the second they were
	// acknowledged in); Seconds is how many seconds it covers. Steady runs
	// only: the sweep judges latency on it, so that a stall of a second or
	// two (a checkpoint, another process) does not decide a verdict the way
	// it decides the whole window's p99.
	P99PerSecond float64 `json:"p99_per_second_median,omitempty"`
	Seconds      int     `json:"p99_seconds,omitempty"`
	// WorstSecond is the fewest messages acknowledged in one whole second
	// of the measurement window (steady runs; a second with none counts),
	// and WorstSecondAt that second's start in seconds into the window: a
	// stall the window's average rate hides. WorstSecondAt is -1 when the
	// run has no measurement window of a whole second (drain runs).
	WorstSecond   int64 `json:"worst_second_acked"`
	WorstSecondAt int   `json:"worst_second_at"`
}

// Sample is one point of the time series. Short runs are sampled every
// 100 ms; the interval doubles (and the series is merged pairwise) whenever
// it exceeds 240 points, unless --sample-interval fixes it.
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
	// Soak mode only: this process's resident memory and Go heap in bytes,
	// its goroutines, and the outbox's dead tuples (n_dead_tup) at the
	// sample; for an outbox in WAL mode, instead of the dead tuples, the
	// WAL its replication slot retains (SlotLagBytes: written and not yet
	// confirmed) and the bytes the relay holds in memory (HeldBytes).
	RSSBytes     int64 `json:"rss_bytes,omitempty"`
	HeapBytes    int64 `json:"heap_bytes,omitempty"`
	Goroutines   int   `json:"goroutines,omitempty"`
	DeadTuples   int64 `json:"dead_tuples,omitempty"`
	SlotLagBytes int64 `json:"slot_lag_bytes,omitempty"`
	HeldBytes    int64 `json:"held_bytes,omitempty"`
}

// StartState is the outbox a steady run started from: every run starts from
// an empty, vacuumed outbox right after a checkpoint, so that no run
// inherits the backlog, the dead tuples or the checkpoint debt of another.
type StartState struct {
	// OutboxRows is the outbox's row count before the run (always 0: the
	// bench waits for the relays to empty it, or empties it).
	OutboxRows int64 `json:"outbox_rows"`
	// DeadTuples is the outbox's n_dead_tup after the VACUUM.
	DeadTuples int64 `json:"dead_tuples"`
	// HeapBytes and IndexBytes are the outbox's size on disk after the
	// VACUUM and REINDEX.
	HeapBytes  int64 `json:"heap_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	// Checkpointed says whether the CHECKPOINT ran (it needs superuser or
	// pg_checkpoint).
	Checkpointed bool `json:"checkpointed"`
	// SlotLagBytes is, for an outbox in WAL mode, how many bytes of WAL the
	// outbox's replication slot had not confirmed when the run was
	// prepared; the bench advanced the slot over them, so the run starts
	// from a slot confirmed up to the WAL position then. They hold the
	// earlier phases' WAL (limits, checkpoints) and, only when the previous
	// run says so, messages its relay had not delivered.
	SlotLagBytes int64 `json:"slot_lag_bytes,omitempty"`
	// Note says what went differently, if anything.
	Note string `json:"note,omitempty"`
}

// Step is one steady run of a sweep.
type Step struct {
	Rate int `json:"rate"`
	// Role is reference (the lowest rate, run first: the latency reference
	// of the steps above it), bisect, or confirm (a repeat of the winner).
	Role           string  `json:"role"`
	ProducerRate   float64 `json:"producer_rate"`
	ProcessingRate float64 `json:"processing_rate"`
	// Growth is the backlog's growth test over the measurement window.
	Growth        Growth      `json:"backlog_growth"`
	BacklogAtStop int64       `json:"backlog_at_stop"`
	LatencyMS     *Latency    `json:"latency_ms"`
	P99BoundMS    float64     `json:"p99_bound_ms"`
	Sustainable   bool        `json:"sustainable"`
	Criteria      []Criterion `json:"criteria"`
	VerdictReason string      `json:"verdict_reason"`
	// DrainSeconds is how long the relays took to empty the outbox after
	// the producers stopped (-1: they did not, and the bench emptied it).
	DrainSeconds float64    `json:"drain_seconds"`
	Start        StartState `json:"start"`
	// Deadlocks is how many deadlocks PostgreSQL detected during the run.
	Deadlocks int64 `json:"deadlocks"`
}

// Result is what a run measured. Rates are msgs/s; fields that do not apply
// to a mode are zero, and Notes say how each figure was obtained.
type Result struct {
	Mode Mode `json:"mode"`
	// TargetRate is the steady rate, or the highest rate a sweep found
	// sustainable and confirmed (0 when none was).
	TargetRate float64 `json:"target_rate"`
	// ProducerRate is what the producers achieved: after the warm-up over
	// the planned window (steady), flat out (baseline), or the COPY
	// pre-fill's rate (drain).
	ProducerRate float64 `json:"producer_rate"`
	// ProcessingRate is what the relays delivered after the warm-up
	// (steady), or messages / DrainSeconds (drain, and baseline's drain).
	ProcessingRate float64 `json:"processing_rate"`
	// BacklogSlope is BacklogGrowth.Slope, msgs/s.
	BacklogSlope float64 `json:"backlog_slope"`
	// BacklogGrowth is the backlog's growth test after the warm-up.
	BacklogGrowth *Growth `json:"backlog_growth,omitempty"`
	// BacklogAtStop is the backlog when the producers stopped.
	BacklogAtStop int64 `json:"backlog_at_stop"`
	// DrainSeconds is the time to empty the outbox: from the relays' start
	// (drain, baseline), or from the producers' stop (steady; -1 when the
	// relays had not caught up within the tail wait).
	DrainSeconds float64 `json:"drain_seconds"`
	// Sustainable is the steady verdict (false for drain and baseline), with
	// its criteria and the evidence for each.
	Sustainable   bool        `json:"sustainable"`
	VerdictReason string      `json:"verdict_reason"`
	Criteria      []Criterion `json:"criteria,omitempty"`
	// ConfirmedRuns is how many runs at TargetRate a sweep made, all
	// sustainable (the bisection's and the repeats).
	ConfirmedRuns int `json:"confirmed_runs,omitempty"`
	// LatencyMS is commit → sink ack; nil when it cannot be measured.
	LatencyMS *Latency `json:"latency_ms"`
	// WALBytesPerMsg and CommitsPerMsg are PostgreSQL's WAL growth and
	// committed transactions over the measured part, per message.
	WALBytesPerMsg float64 `json:"wal_bytes_per_msg"`
	CommitsPerMsg  float64 `json:"commits_per_msg"`
	// DeadTuples is the outbox's n_dead_tup at the end.
	DeadTuples int64 `json:"dead_tuples"`
	// Deadlocks is how many deadlocks PostgreSQL detected in the database
	// during the run (pg_stat_database, database-wide).
	Deadlocks int64 `json:"deadlocks"`
	// RelayCPUSeconds and RelayPeakRSSBytes are the relays' resource use (see
	// RelayUsageNote for what was measured).
	RelayCPUSeconds float64 `json:"relay_cpu_seconds"`
	// RelayServerCPUSeconds is the CPU the server's processes serving the
	// relays used while they ran (their backends, and a WAL relay's
	// walsender), when the server runs on this machine; 0 when it could
	// not be read.
	RelayServerCPUSeconds float64 `json:"relay_server_cpu_seconds,omitempty"`
	RelayPeakRSSBytes     int64   `json:"relay_peak_rss_bytes"`
	// PoisonDeadLettered is how many poison messages (--poison-percent) the
	// probe sink failed on their last attempt, i.e. the relay dead-lettered.
	PoisonDeadLettered int64 `json:"poison_dead_lettered,omitempty"`
	// SlowSeconds are the slowest seconds of a steady run's window below
	// 80 % of the target rate (at most 10), each with what the relay, this
	// process, the machine and the server did around it;
	// SlowSecondsTotal counts them all. In-process relay only.
	SlowSeconds      []SlowSecond `json:"slow_seconds,omitempty"`
	SlowSecondsTotal int          `json:"slow_seconds_total"`
	// Messages is how many messages the run enqueued.
	Messages int64 `json:"messages"`
	// Relays is how many relays ran.
	Relays   int      `json:"relays"`
	Settings Settings `json:"settings"`
	// Limits are the physical limits measured in the same run, and Wharf's
	// figures as fractions of them; nil when not measured.
	Limits *Limits `json:"limits,omitempty"`
	// Overload is a steady run's figures under --backlog; nil without it.
	Overload *Overload `json:"overload,omitempty"`
	// Soak is a soak run's trends; nil in the other modes.
	Soak *Soak `json:"soak,omitempty"`
	// Environment is the machine and the server settings that matter.
	Environment Environment `json:"environment"`
	// Start is the state the (last) steady run started from.
	Start *StartState `json:"start,omitempty"`

	// Delivered is the distinct messages acknowledged (in-process relay; the
	// dead-lettered poison messages not included), or enqueued minus left in
	// the outbox (relay processes).
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
	// Samples are the time series (of the last confirming step, in a sweep).
	Samples []Sample `json:"samples"`
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

const topic = "bench"

// env is what every run of one Run call shares.
type env struct {
	o       Options
	ctl     *pgxpool.Pool
	version string
	// runSteady runs one steady run of a sweep: steady, or a stand-in in
	// the tests of the sweep's logic.
	runSteady func(context.Context, steadySpec) (*Result, error)
	// walStart and walTarget bound the WAL a pre-fill of an outbox in WAL
	// mode wrote (drain).
	walStart, walTarget walstream.LSN
	// heldBytes reads the in-process relay's WAL held bytes while a steady
	// run's relay runs (nil otherwise).
	heldBytes func() int64
	// server counts the CPU of the server's processes serving the running
	// relays (set by startRelays, sampled with every sample).
	server *serverCPU
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
	e.runSteady = e.steady
	_ = ctl.QueryRow(ctx, "SHOW server_version").Scan(&e.version)
	started := time.Now()
	environment, err := e.environment(ctx)
	if err != nil {
		return nil, err
	}
	drop, err := e.createSchema(ctx, o.Schema)
	if err != nil {
		return nil, err
	}
	defer drop()
	var res *Result
	switch o.Mode {
	case ModeDrain:
		res, err = e.drain(ctx, o.Schema)
	case ModeBaseline:
		res, err = e.baseline(ctx, o.Schema)
	case ModeSteady:
		res, err = e.steadyMode(ctx, o.Schema)
	case ModeSweep:
		res, err = e.sweep(ctx, o.Schema)
	case ModeSoak:
		res, err = e.soak(ctx, o.Schema)
	}
	if err != nil {
		return nil, err
	}
	if o.AsyncCommit {
		res.note("the producers committed with synchronous_commit off (--async-commit): no commit waited for its WAL flush, as for an application that sets it; the relay's connections kept the server's setting")
	}
	environment.LoadAverageEnd = loadAverage()
	res.Mode = o.Mode
	res.Settings = o.settings()
	res.Environment = environment
	res.PostgresVersion = e.version
	res.Started = started
	return res, nil
}

func connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return connectAs(ctx, url, maxConns, "")
}

// connectAs is connect with the connections' application_name set to app
// (unless the URL names one).
func connectAs(ctx context.Context, url string, maxConns int32, app string) (*pgxpool.Pool, error) {
	return connectWith(ctx, url, maxConns, func(cfg *pgxpool.Config) {
		if _, named := cfg.ConnConfig.RuntimeParams["application_name"]; app != "" && !named {
			cfg.ConnConfig.RuntimeParams["application_name"] = app
		}
	})
}

// producerPool connects the producers: Producers connections, committing
// with synchronous_commit off under AsyncCommit.
func (e *env) producerPool(ctx context.Context) (*pgxpool.Pool, error) {
	return connectWith(ctx, e.o.DatabaseURL, int32(e.o.Producers), func(cfg *pgxpool.Config) {
		if e.o.AsyncCommit {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		}
	})
}

// connectWith is connect with the pool's configuration passed through
// adjust first.
func connectWith(ctx context.Context, url string, maxConns int32, adjust func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url is malformed: %w", err)
	}
	adjust(cfg)
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
	wal := e.o.OutboxMode == "wal"
	drop := func() {
		if e.o.Keep {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		if wal {
			// Reverting the migrations removes the slot and the
			// publication too; the relays' walsenders end a moment after
			// the relays.
			for i := 0; i < 50; i++ {
				if _, err = m.Down(ctx, e.ctl, 0); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		} else {
			_, err = e.ctl.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		}
		if err != nil {
			e.o.Logger.Warn("wharf bench: dropping the schema failed", "schema", schema, "err", err)
		}
	}
	if _, err := m.Up(ctx, e.ctl); err != nil {
		drop()
		return nil, err
	}
	if wal {
		if err := m.SetWALMode(ctx, e.ctl); err != nil {
			drop()
			return nil, err
		}
	}
	return drop, nil
}

// settle is the pause after a CHECKPOINT, so that the next phase does not
// start while the server is still writing out what the checkpoint flushed.
const settle = time.Second

// quiesce runs a CHECKPOINT and waits a moment: a phase then starts with no
// checkpoint owed by the previous one. It reports whether the CHECKPOINT ran:
// it needs superuser or the pg_checkpoint role, and without it the bench
// goes on (the result says so).
func (e *env) quiesce(ctx context.Context) (bool, error) {
	ran := true
	if _, err := e.ctl.Exec(ctx, "CHECKPOINT"); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			return false, err
		}
		ran = false
	}
	select {
	case <-time.After(settle):
		return ran, nil
	case <-ctx.Done():
		return ran, ctx.Err()
	}
}

// prepare brings schema's outbox to the state every steady run starts from:
// no rows, its dead tuples vacuumed and its statistics fresh (VACUUM
// (ANALYZE) of the outbox and the relays' tables), its indexes rebuilt
// (REINDEX), then a CHECKPOINT. The caller has emptied the outbox already.
//
// An outbox in WAL mode has no rows: its table stays empty and unused, so
// only the relays' tables are vacuumed, nothing is reindexed, and the
// slot is advanced to the WAL position now instead (skipping the WAL the
// earlier phases wrote, which no relay needs to decode), then CHECKPOINTed.
func (e *env) prepare(ctx context.Context, schema string) (StartState, error) {
	var st StartState
	if err := e.ctl.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&st.OutboxRows); err != nil {
		return st, err
	}
	if e.wal() {
		if _, err := e.ctl.Exec(ctx, fmt.Sprintf("VACUUM (ANALYZE) %[1]s.lanes, %[1]s.relays, %[1]s.retries", schema)); err != nil {
			return st, fmt.Errorf("vacuuming the relays' tables: %w", err)
		}
		lag, err := e.advanceSlot(ctx, schema)
		if err != nil {
			return st, err
		}
		st.SlotLagBytes = lag
		return e.prepared(ctx, schema, st)
	}
	if _, err := e.ctl.Exec(ctx, fmt.Sprintf("VACUUM (ANALYZE) %[1]s.outbox, %[1]s.lanes, %[1]s.relays, %[1]s.retries", schema)); err != nil {
		return st, fmt.Errorf("vacuuming the outbox: %w", err)
	}
	// VACUUM frees the index pages of the rows removed but leaves the
	// indexes at their high-water size; after a run with a large backlog
	// the planner then costs the relay's queries on indexes many times their
	// content, and the next run is slower for having come after that one (on
	// the project machine, 10,000 msg/s after two runs at 80,000 went from a
	// p99 of 12 ms to 361 ms and a growing backlog). Rebuilding the empty
	// indexes makes every run start from the same outbox.
	if _, err := e.ctl.Exec(ctx, "REINDEX TABLE "+schema+".outbox"); err != nil {
		return st, fmt.Errorf("reindexing the outbox: %w", err)
	}
	return e.prepared(ctx, schema, st)
}

// prepared ends prepare: a CHECKPOINT, then the outbox's start state.
func (e *env) prepared(ctx context.Context, schema string, st StartState) (StartState, error) {
	ran, err := e.quiesce(ctx)
	if err != nil {
		return st, err
	}
	st.Checkpointed = ran
	if !ran {
		st.Note = "CHECKPOINT not permitted for this role (needs superuser or pg_checkpoint): a checkpoint owed by an earlier run may fall into this one"
	}
	if _, err := e.ctl.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return st, err
	}
	err = e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0),
		pg_relation_size($2::regclass), pg_indexes_size($2::regclass)`, schema, schema+".outbox").Scan(&st.DeadTuples, &st.HeapBytes, &st.IndexBytes)
	return st, err
}

// pgCounters are the server counters the run reports per message.
type pgCounters struct {
	lsn       string
	commits   int64
	deadlocks int64
}

func (e *env) counters(ctx context.Context) (pgCounters, error) {
	var c pgCounters
	err := e.ctl.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, xact_commit, deadlocks
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.lsn, &c.commits, &c.deadlocks)
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
	res.Deadlocks = after.deadlocks - before.deadlocks
	if res.Deadlocks > 0 {
		res.note("PostgreSQL detected %d deadlocks in this database during the run: each stalls the statements involved for deadlock_timeout (1 s by default) before one is cancelled and retried, which shows as a latency spike", res.Deadlocks)
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
	res.note("WAL is cluster-wide and commits database-wide: anything else running on the server is counted too")
	res.note("dead_tuples is pg_stat_user_tables.n_dead_tup of the outbox at the end")
	return nil
}

// outboxCount is the outbox's row count: exact, and cheap while the backlog
// is small (steady state).
func (e *env) outboxCount(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.ctl.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n)
	return n, err
}

// outboxRemoved is how many rows were removed from the outbox so far, from
// PostgreSQL's statistics (n_tup_del). During a drain, counting the
// outbox's rows every sample scans the whole backlog, which costs relay
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
	e.server = newServerCPU(ctx, e.ctl, relayAppName)
	if e.o.InProcess {
		return startInProcess(ctx, e.o, schema, tr, withProducers)
	}
	return startProcesses(e.o, schema)
}

func (e *env) stopRelays(r relays, res *Result) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.server != nil {
		// What the backends used up to the relays' stop.
		e.server.note(ctx, e.ctl)
		if d, ok := e.server.total(); ok {
			res.RelayServerCPUSeconds = d.Seconds()
		}
	}
	u, err := r.stop(ctx)
	res.RelayCPUSeconds = u.cpu.Seconds()
	res.RelayPeakRSSBytes = u.peakRSS
	res.RelayUsageNote = u.note
	res.PoisonDeadLettered = u.deadLettered
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
