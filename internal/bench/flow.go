package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/procstat"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// FlowWorkloads are the workloads of `wharf bench --mode flow`.
var FlowWorkloads = []string{"steps", "signal", "children", "keyed", "keyed-unkeyed", "ratelimited"}

// DefaultFlowWorkloads are those run when none is named.
var DefaultFlowWorkloads = []string{"steps", "signal", "children"}

// flowWorkloadsHint lists the workloads for an error message.
const flowWorkloadsHint = "use steps, signal, children, keyed, keyed-unkeyed or ratelimited"

// FlowOptions configure the flow benchmark.
type FlowOptions struct {
	DatabaseURL string
	// Schema defaults to wharf_flowbench_<random>, dropped at the end
	// unless Keep.
	Schema string
	Keep   bool
	// Workloads to run, in order; defaults to DefaultFlowWorkloads. keyed
	// is followed by keyed-unkeyed (unless SkipUnkeyed, or it is named).
	Workloads []string
	// Instances per workload for the drain (throughput): flows, or for
	// keyed parents. Defaults to 20000. Not for ratelimited (RateFor).
	Instances int
	// Runners in this process. Defaults to 1.
	Runners int
	// MaxInFlight per runner. Defaults to 512.
	MaxInFlight int
	// LeaseTTL is the runners' Config.LeaseTTL (0: theirs, 30s). Rows
	// waiting on a concurrency key wake at the latest when a running
	// step's lease ends.
	LeaseTTL time.Duration
	// Paced is how long the latency phase starts flows at half the drained
	// rate (0 = no latency phase). Defaults to 5s.
	Paced time.Duration
	// SignalAfter is how long after an instance's first step ran the
	// signal workload signals it (0: at once, so that most signals race
	// the write of the await and take the path of a signal that came
	// first).
	SignalAfter time.Duration
	// ConcurrencyKeys is how many concurrency keys the keyed workload's
	// children are spread over (each child one, drawn at random), and
	// ConcurrencyLimit each key's limit. Default 4 and 2.
	ConcurrencyKeys  int
	ConcurrencyLimit int
	// StepTimeMin and StepTimeMax bound the keyed children's step time (a
	// sleep drawn uniformly); both zero: 2ms and 10ms; StepTimeMax
	// negative: no sleep.
	StepTimeMin, StepTimeMax time.Duration
	// SkipUnkeyed: keyed is not followed by keyed-unkeyed (the same
	// children without keys, for the ratio).
	SkipUnkeyed bool
	// Seed seeds the keyed draws (keys and step times). Defaults to 1.
	Seed uint64
	// RateLimit and RateBurst are the ratelimited workload's token bucket
	// (Config.RateLimits). Default 200/s and 10.
	RateLimit, RateBurst float64
	// RateFor is how long the ratelimited drain lasts at RateLimit: it
	// starts RateLimit × RateFor + RateBurst steps' worth of instances.
	// Defaults to 10s.
	RateFor time.Duration
	// DrainTimeout stops a drain that has not ended after it: its figures
	// are over what it did, marked incomplete, and RunFlow returns an error
	// once the other workloads ran. 0: no limit.
	DrainTimeout time.Duration
	Progress     io.Writer
	Logger       *slog.Logger
}

// FlowResult is one workload's figures.
type FlowResult struct {
	Workload  string `json:"workload"`
	Instances int    `json:"instances"`
	// Runners drained the instances, in this process.
	Runners int `json:"runners"`
	// Incomplete: the drain stopped (DrainTimeout, or interrupted) with
	// FlowsDone of Instances done; the rates are over the time it ran.
	Incomplete   bool    `json:"incomplete,omitempty"`
	FlowsDone    int64   `json:"flows_done,omitempty"`
	StopReason   string  `json:"stop_reason,omitempty"`
	StepsPerFlow int     `json:"steps_per_flow"`
	Steps        int64   `json:"steps"`
	Seconds      float64 `json:"seconds"`
	StepsPerSec  float64 `json:"steps_per_sec"`
	FlowsPerSec  float64 `json:"flows_per_sec"`
	// Client round trips (queries, BEGIN and COMMIT each count one) and
	// committed transactions per step during the drain, all clients
	// (runners and, for signal, the signal sender) included.
	RoundTripsPerStep float64 `json:"round_trips_per_step"`
	CommitsPerStep    float64 `json:"commits_per_step"`
	// CPU per step during the drain, in microseconds: this process's (the
	// runners, and for signal the signal sender's client side), and the
	// server processes' serving the workload's connections (when the server
	// runs on this machine; 0 otherwise). On a shared machine these are
	// steadier than steps/s, which the machine's other work moves.
	ProcessCPUPerStepUs float64 `json:"process_cpu_us_per_step"`
	ServerCPUPerStepUs  float64 `json:"server_cpu_us_per_step,omitempty"`
	// Step-to-step latency while flows start at PacedRate flows/s: from a
	// step's start to the next step's start of the same instance (for
	// signal, from the signal's send to the resumed step's start; for
	// children, from the spawning step's start to each child's, and from
	// the last child's start to the join's).
	PacedRate float64 `json:"paced_flows_per_sec"`
	P50Ms     float64 `json:"step_to_step_p50_ms"`
	P99Ms     float64 `json:"step_to_step_p99_ms"`
	Samples   int     `json:"latency_samples"`
	// P99PerSecondMs is the step-to-step p99 of each second of the paced
	// phase (by when the gap ended): a stall of the server (a checkpoint's
	// writes) shows as one second's, where P99Ms blends it with the rest.
	P99PerSecondMs []float64 `json:"step_to_step_p99_per_second_ms,omitempty"`
	// Children: from the spawning step's start to the join's (two
	// step-to-step gaps and the children's steps).
	SpanP50Ms   float64 `json:"spawn_to_join_p50_ms,omitempty"`
	SpanP99Ms   float64 `json:"spawn_to_join_p99_ms,omitempty"`
	SpanSamples int     `json:"spawn_to_join_samples,omitempty"`
	// Signal: the share of resumed steps a signal leased to the runner that
	// wrote the await (run without a claim), in the drain and in the paced
	// phase; the others arrived before their await was written and went
	// through a claim.
	SignalLeasedDrain float64 `json:"signal_leased_share_drain,omitempty"`
	SignalLeasedPaced float64 `json:"signal_leased_share_paced,omitempty"`
	// Statements per step during the drain, from pg_stat_statements, by
	// kind (stmtKind): top-level statements sent by the clients, and
	// "in functions" for those the flow functions run (with
	// pg_stat_statements.track = all). Nil when the server does not load
	// pg_stat_statements; StatementsNote says why.
	Statements     map[string]float64 `json:"statements_per_step,omitempty"`
	StatementsNote string             `json:"statements_note,omitempty"`
	// Calls is how long the flow functions' calls took, seen from the
	// client, during the paced phase: the parts of a step-to-step gap.
	Calls map[string]CallTime `json:"paced_calls,omitempty"`
	// RunnerLog counts what the runners logged (deadlocks, warnings and
	// errors) over the workload.
	RunnerLog RunnerLog `json:"runner_log"`
	// Keyed and Rate are the figures of the keyed (and keyed-unkeyed) and
	// ratelimited workloads.
	Keyed *KeyedFigures `json:"keyed,omitempty"`
	Rate  *RateFigures  `json:"rate,omitempty"`
}

// roundTrips counts the queries a pool sends and, while timing is on,
// times the flow functions' calls by kind (stmtKind): where the
// step-to-step latency goes.
type roundTrips struct {
	n      atomic.Int64
	timing atomic.Bool
	mu     sync.Mutex
	took   map[string][]time.Duration
	// While grants is on, granted gets the time each claim call was sent
	// once per step it leased (ratelimited: each took a token).
	grants  atomic.Bool
	granted []time.Time
}

type claimAskKey struct{}

type claimAsk struct {
	ask  int
	sent time.Time
}

type queryStartKey struct{}

type queryStart struct {
	kind string
	at   time.Time
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	if r.grants.Load() && strings.Contains(d.SQL, "claim_flow_steps(") && len(d.Args) > 2 {
		if ask, ok := d.Args[2].(int); ok {
			ctx = context.WithValue(ctx, claimAskKey{}, claimAsk{ask: ask, sent: time.Now()})
		}
	}
	if !r.timing.Load() {
		return ctx
	}
	kind := stmtKind(d.SQL, true)
	switch kind {
	case "claim", "outcome", "signal", "start", "wake", "leased read":
		return context.WithValue(ctx, queryStartKey{}, queryStart{kind: kind, at: time.Now()})
	}
	return ctx
}

func (r *roundTrips) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if c, ok := ctx.Value(claimAskKey{}).(claimAsk); ok && d.Err == nil {
		r.noteGrants(c, d.CommandTag.RowsAffected())
	}
	s, ok := ctx.Value(queryStartKey{}).(queryStart)
	if !ok {
		return
	}
	took := time.Since(s.at)
	r.mu.Lock()
	if r.took == nil {
		r.took = map[string][]time.Duration{}
	}
	r.took[s.kind] = append(r.took[s.kind], took)
	r.mu.Unlock()
}

// noteGrants records the steps a claim call leased, at the time it was
// sent: the claim takes their tokens as it starts, on the server's clock
// (the same as this one's here), while its end comes after its whole run,
// which varies with the rows it goes through by more than a token's
// interval. claim_flow_steps returns a row per step and, when it leased
// fewer than asked, one more giving the next due time: rows below the ask
// carry it; rows equal to it are taken as a full claim.
func (r *roundTrips) noteGrants(c claimAsk, rows int64) {
	n := rows
	if rows > 0 && rows < int64(c.ask) {
		n--
	}
	if n <= 0 {
		return
	}
	r.mu.Lock()
	for range n {
		r.granted = append(r.granted, c.sent)
	}
	r.mu.Unlock()
}

// callTimes is the p50 and p99 in ms of each kind's calls timed, as
// "kind p50/p99 (calls)".
func (r *roundTrips) callTimes() map[string]CallTime {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]CallTime{}
	for k, ds := range r.took {
		slices.Sort(ds)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		out[k] = CallTime{Calls: len(ds), P50Ms: ms(quantileOf(ds, 0.5)), P99Ms: ms(quantileOf(ds, 0.99)), MaxMs: ms(ds[len(ds)-1])}
	}
	return out
}

// CallTime is the client-side duration of one kind of call (a round trip,
// with its commit when it runs alone) during the paced phase.
type CallTime struct {
	Calls int     `json:"calls"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

type benchState struct {
	Prev int64 `json:"prev"` // unix ns of the previous step's start
	Sent int64 `json:"sent"`
}

// latencies collects step-to-step gaps while recording is on.
type latencies struct {
	on  atomic.Bool
	mu  sync.Mutex
	got []time.Duration
	at  []time.Time // when each gap ended
}

func (l *latencies) add(prev int64) {
	if prev == 0 || !l.on.Load() {
		return
	}
	now := time.Now()
	d := now.Sub(time.Unix(0, prev))
	l.mu.Lock()
	l.got = append(l.got, d)
	l.at = append(l.at, now)
	l.mu.Unlock()
}

// perSecond is the p99 in milliseconds of the gaps that ended in each of
// the n seconds from start (0 for a second without any).
func (l *latencies) perSecond(start time.Time, n int) []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	secs := make([][]time.Duration, n)
	for i, at := range l.at {
		if k := int(at.Sub(start) / time.Second); k >= 0 && k < n {
			secs[k] = append(secs[k], l.got[i])
		}
	}
	out := make([]float64, n)
	for k, ds := range secs {
		slices.Sort(ds)
		out[k] = float64(quantileOf(ds, 0.99).Microseconds()) / 1000
	}
	return out
}

// summary sorts the samples and returns how many there are and their p50
// and p99 in milliseconds.
func (l *latencies) summary() (n int, p50, p99 float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.got)
	ms := func(q float64) float64 { return float64(quantileOf(l.got, q).Microseconds()) / 1000 }
	return len(l.got), ms(0.5), ms(0.99)
}

// quantileOf is the q-quantile of sorted durations (0 for none).
func quantileOf(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// RunFlow runs the flow workloads and returns their figures.
func RunFlow(ctx context.Context, o FlowOptions) ([]FlowResult, error) {
	if o.Instances <= 0 {
		o.Instances = 20000
	}
	if o.Runners <= 0 {
		o.Runners = 1
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 512
	}
	if o.Paced == 0 {
		o.Paced = 5 * time.Second
	}
	if len(o.Workloads) == 0 {
		o.Workloads = DefaultFlowWorkloads
	}
	if o.ConcurrencyKeys == 0 {
		o.ConcurrencyKeys = 4
	}
	if o.ConcurrencyLimit == 0 {
		o.ConcurrencyLimit = 2
	}
	switch {
	case o.StepTimeMin == 0 && o.StepTimeMax == 0:
		o.StepTimeMin, o.StepTimeMax = 2*time.Millisecond, 10*time.Millisecond
	case o.StepTimeMax < 0:
		o.StepTimeMin, o.StepTimeMax = 0, 0
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.RateLimit == 0 {
		o.RateLimit = 200
	}
	if o.RateBurst == 0 {
		o.RateBurst = 10
	}
	if o.RateFor == 0 {
		o.RateFor = 10 * time.Second
	}
	switch {
	case o.ConcurrencyKeys < 1:
		return nil, fmt.Errorf("--concurrency-keys must be at least 1, got %d", o.ConcurrencyKeys)
	case o.ConcurrencyLimit < 1:
		return nil, fmt.Errorf("--concurrency-limit must be at least 1, got %d", o.ConcurrencyLimit)
	case o.StepTimeMin < 0 || o.StepTimeMax < o.StepTimeMin:
		return nil, fmt.Errorf("--step-time %s: use 0 <= MIN <= MAX", FormatStepTime(o.StepTimeMin, o.StepTimeMax))
	case o.RateLimit < 0:
		return nil, fmt.Errorf("--rate-limit must be positive, got %g", o.RateLimit)
	case o.RateBurst < 1:
		return nil, fmt.Errorf("--rate-burst must be at least 1, got %g", o.RateBurst)
	case o.RateFor < 0:
		return nil, fmt.Errorf("--rate-for must be positive, got %s", o.RateFor)
	}
	var workloads []string
	for _, w := range o.Workloads {
		if !slices.Contains(FlowWorkloads, w) {
			return nil, fmt.Errorf("--workload %q: %s", w, flowWorkloadsHint)
		}
		workloads = append(workloads, w)
		if w == "keyed" && !o.SkipUnkeyed && !slices.Contains(o.Workloads, "keyed-unkeyed") {
			workloads = append(workloads, "keyed-unkeyed")
		}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var out []FlowResult
	var errs []string
	for _, w := range workloads {
		res, err := runFlowWorkload(ctx, o, w)
		if res.Incomplete || err == nil {
			out = append(out, res)
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("workload %s: %s", w, oneLine(err)))
			if ctx.Err() != nil || !res.Incomplete {
				break
			}
		}
		if k := res.Keyed; k != nil && k.Keys > 0 && k.MaxRunningPerKey > k.Limit {
			errs = append(errs, fmt.Sprintf("workload %s: %d steps of one concurrency key ran at once, over its limit of %d (most by key: %v)",
				w, k.MaxRunningPerKey, k.Limit, k.MaxRunningByKey))
		}
	}
	linkUnkeyed(out)
	if len(errs) > 0 {
		return out, errors.New(strings.Join(errs, "; "))
	}
	return out, nil
}

// linkUnkeyed gives keyed's result keyed-unkeyed's children's rate and its
// share of it.
func linkUnkeyed(rs []FlowResult) {
	var keyed, unkeyed *KeyedFigures
	for i := range rs {
		switch rs[i].Workload {
		case "keyed":
			keyed = rs[i].Keyed
		case "keyed-unkeyed":
			unkeyed = rs[i].Keyed
		}
	}
	if keyed == nil || unkeyed == nil || unkeyed.ChildStepsPerSec == 0 {
		return
	}
	keyed.UnkeyedStepsPerSec = unkeyed.ChildStepsPerSec
	keyed.OfUnkeyed = keyed.ChildStepsPerSec / unkeyed.ChildStepsPerSec
}

func runFlowWorkload(ctx context.Context, o FlowOptions, workload string) (res FlowResult, err error) {
	res = FlowResult{Workload: workload, Instances: o.Instances, Runners: o.Runners}
	schema := o.Schema
	if schema == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		schema = "wharf_flowbench_" + hex.EncodeToString(b[:])
	}
	schema += "_" + strings.ReplaceAll(workload, "-", "_")
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return res, err
	}
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	cfg.ConnConfig.RuntimeParams["application_name"] = flowAppName
	cfg.MaxConns = int32(8 + 4*o.Runners)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	m, err := wharfmigrate.New(schema)
	if err != nil {
		return res, err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		return res, err
	}
	if !o.Keep {
		defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") }()
	}
	client, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return res, err
	}

	lat, span := &latencies{}, &latencies{}
	awaiting := &idQueue{ready: make(chan struct{}, 1), after: o.SignalAfter}
	var done atomic.Int64
	step := func(next string) wharfflow.StepFunc[benchState] {
		return func(_ context.Context, s *benchState, in wharfflow.Input) wharfflow.Outcome {
			now := time.Now().UnixNano()
			if len(in.Signals) > 0 {
				var sent int64
				_ = json.Unmarshal(in.Signals[0].Payload, &sent)
				lat.add(sent)
			} else {
				lat.add(s.Prev)
			}
			s.Prev = now
			if next == "" {
				done.Add(1)
				return wharfflow.Done(nil)
			}
			return wharfflow.Next(next)
		}
	}
	var defs []wharfflow.Definition
	var start func(i int) wharfflow.Start
	var isDone func() int64
	var keyed *keyedWorkload
	var rated *rateWorkload
	var rateLimits map[string]wharfflow.RateLimit
	switch workload {
	case "steps":
		f := wharfflow.New[benchState]("steps", nil).Step("a", step("b")).Step("b", step("c")).Step("c", step(""))
		defs = []wharfflow.Definition{f}
		start = func(int) wharfflow.Start { return f.Start(benchState{}, wharfflow.StartOptions{}) }
		res.StepsPerFlow = 3
		isDone = done.Load
	case "signal":
		f := wharfflow.New[benchState]("signal", nil).
			Step("a", func(_ context.Context, s *benchState, in wharfflow.Input) wharfflow.Outcome {
				awaiting.add(in.Instance)
				lat.add(s.Prev)
				s.Prev = time.Now().UnixNano()
				return wharfflow.Await("b", "go")
			}).
			Step("b", step("c")).Step("c", step(""))
		defs = []wharfflow.Definition{f}
		start = func(int) wharfflow.Start { return f.Start(benchState{}, wharfflow.StartOptions{}) }
		res.StepsPerFlow = 3
		isDone = done.Load
	case "children":
		var parentsDone atomic.Int64
		// Two step-to-step gaps: the spawning step's start to each child's
		// start (the child's state carries it), and the last child's start
		// to the join's (each child's result carries its start); spawn →
		// join, the two together, apart.
		child := wharfflow.New[benchState]("child", nil).Step("work", func(_ context.Context, s *benchState, in wharfflow.Input) wharfflow.Outcome {
			now := time.Now().UnixNano()
			lat.add(s.Prev)
			return wharfflow.Done(now)
		})
		parent := wharfflow.New[benchState]("parent", nil).
			Step("fan", func(_ context.Context, s *benchState, in wharfflow.Input) wharfflow.Outcome {
				s.Prev = time.Now().UnixNano()
				kids := make([]wharfflow.Child, 10)
				for i := range kids {
					kids[i] = child.Child(benchState{Prev: s.Prev}, wharfflow.Options{})
				}
				return wharfflow.Spawn("join", kids...)
			}).
			Step("join", func(_ context.Context, s *benchState, in wharfflow.Input) wharfflow.Outcome {
				var last int64
				for _, ch := range in.Children {
					var started int64
					_ = json.Unmarshal(ch.Result, &started)
					last = max(last, started)
				}
				lat.add(last)
				span.add(s.Prev) // spawn → all ten children done → join
				parentsDone.Add(1)
				return wharfflow.Done(nil)
			})
		defs = []wharfflow.Definition{parent, child}
		start = func(int) wharfflow.Start { return parent.Start(benchState{}, wharfflow.StartOptions{}) }
		res.StepsPerFlow = 12
		isDone = parentsDone.Load
	case "keyed", "keyed-unkeyed":
		// Parents spawning children of one step each (a sleep), under
		// concurrency keys for keyed; the step-to-step gaps are the
		// children's, as in children.
		keyed = newKeyedWorkload(o, workload == "keyed", lat, span)
		defs = []wharfflow.Definition{keyed.parent, keyed.child}
		start = keyed.start
		res.StepsPerFlow = keyedChildren + 2
		isDone = keyed.parentsDone.Load
	case "ratelimited":
		rated = newRateWorkload(o)
		rateLimits = map[string]wharfflow.RateLimit{rateKey: {PerSecond: o.RateLimit, Burst: o.RateBurst}}
		defs = []wharfflow.Definition{rated.flow}
		start = rated.start
		res.StepsPerFlow = rateSteps
		res.Instances = rated.instances(o.RateFor)
		isDone = rated.done.Load
		// Its steps' starts are the measure; a paced phase at half the
		// rate would say nothing more.
		o.Paced = -1
	}
	instances := res.Instances

	// Pre-fill the instances, then time the runners draining them.
	const batch = 1000
	for i := 0; i < instances; i += batch {
		var starts []wharfflow.Start
		for j := i; j < min(i+batch, instances); j++ {
			starts = append(starts, start(j))
		}
		if _, err := client.Start(ctx, starts...); err != nil {
			return res, err
		}
	}
	if keyed != nil {
		keyed.counting = false // the paced phase's draws are not the drain's
	}
	// The figures after the drain are read even when ctx ended it.
	mctx := context.WithoutCancel(ctx)
	commits := func() (n, deadlocks int64, err error) {
		err = pool.QueryRow(mctx, "SELECT xact_commit, deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n, &deadlocks)
		return n, deadlocks, err
	}
	_, _ = pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	c0, dl0, err := commits()
	if err != nil {
		return res, err
	}
	logger, logged := newCountingLogger(o.Logger)
	var runners []*wharfflow.Runner
	defer func() {
		for _, r := range runners {
			stopCtx, cancel := context.WithTimeout(mctx, time.Minute)
			_ = r.Stop(stopCtx)
			cancel()
		}
		// What the runners logged, stopping included.
		res.RunnerLog = logged.snapshot()
		_, _ = pool.Exec(mctx, "SELECT pg_stat_clear_snapshot()")
		if _, dl1, err := commits(); err == nil {
			res.RunnerLog.ServerDeadlocks = dl1 - dl0
		}
	}()
	stmts0, note := statementCalls(ctx, pool)
	res.StatementsNote = note
	rt0 := rt.n.Load()
	server := newServerCPU(ctx, pool, flowAppName)
	cpu0, _, _ := procstat.CPU(os.Getpid())
	if rated != nil {
		rt.grants.Store(true)
	}
	t0 := time.Now()
	for range o.Runners {
		r, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Flows: defs, MaxInFlight: o.MaxInFlight,
			LeaseTTL: o.LeaseTTL, RateLimits: rateLimits, Logger: logger})
		if err != nil {
			return res, err
		}
		if err := r.Start(ctx); err != nil {
			return res, err
		}
		runners = append(runners, r)
	}
	senderCtx, stopSender := context.WithCancel(ctx)
	senderDone := make(chan error, 1)
	if workload == "signal" {
		go func() { senderDone <- sendSignals(senderCtx, client, awaiting) }()
	} else {
		close(senderDone)
	}
	stopSenderWait := func() error {
		stopSender()
		if err := <-senderDone; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	target := int64(instances)
	var timeout <-chan time.Time
	if o.DrainTimeout > 0 {
		tm := time.NewTimer(o.DrainTimeout)
		defer tm.Stop()
		timeout = tm.C
	}
	// The end is looked for every 2 ms (a drain of a few seconds is timed
	// to within a fraction of a percent); progress and the server's CPU
	// every 100 ms.
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var stopped error
drain:
	for n := 0; isDone() < target; n++ {
		select {
		case <-ctx.Done():
			stopped = ctx.Err()
			break drain
		case <-timeout:
			stopped = fmt.Errorf("stuck or slow: %d of %d flows done when the drain timeout (%s) passed", isDone(), target, o.DrainTimeout)
			break drain
		case <-tick.C:
			if n%50 == 0 {
				fmt.Fprintf(o.Progress, "\r%s: %d/%d flows done", workload, isDone(), target)
				server.note(ctx, pool)
			}
		}
	}
	elapsed := time.Since(t0)
	cpu1, _, _ := procstat.CPU(os.Getpid())
	server.note(mctx, pool)
	rt1 := rt.n.Load()
	_, _ = pool.Exec(mctx, "SELECT pg_stat_clear_snapshot()")
	c1, _, err := commits()
	if err != nil {
		return res, err
	}
	if stopped != nil {
		res.Incomplete, res.FlowsDone, res.StopReason = true, isDone(), oneLine(stopped)
		fmt.Fprintf(o.Progress, "\r%s: stopped with %d/%d flows done after %s\n", workload, res.FlowsDone, target, elapsed.Round(time.Millisecond))
	} else {
		fmt.Fprintf(o.Progress, "\r%s: %d flows drained in %s\n", workload, target, elapsed.Round(time.Millisecond))
	}
	var steps int64
	for _, r := range runners {
		steps += r.Stats().Steps()
	}
	res.Steps = steps
	signalled := func() (n int64) {
		for _, r := range runners {
			n += r.Stats().Signalled()
		}
		return n
	}
	sig0 := signalled()
	if workload == "signal" {
		res.SignalLeasedDrain = float64(sig0) / float64(target)
	}
	res.Seconds = elapsed.Seconds()
	res.StepsPerSec = float64(steps) / elapsed.Seconds()
	res.FlowsPerSec = float64(isDone()) / elapsed.Seconds()
	if steps > 0 {
		res.RoundTripsPerStep = float64(rt1-rt0) / float64(steps)
		res.CommitsPerStep = float64(c1-c0) / float64(steps)
		res.ProcessCPUPerStepUs = float64((cpu1 - cpu0).Microseconds()) / float64(steps)
		if d, ok := server.total(); ok {
			res.ServerCPUPerStepUs = float64(d.Microseconds()) / float64(steps)
		}
	}
	if keyed != nil {
		keyed.figures(&res, elapsed)
		// The tracker's maxima are read again after the paced phase.
		defer keyed.tracker.figures(res.Keyed)
	}
	if rated != nil {
		rt.grants.Store(false)
		rt.mu.Lock()
		granted := slices.Clone(rt.granted)
		rt.mu.Unlock()
		rated.figures(&res, granted)
	}
	if stopped != nil {
		_ = stopSenderWait()
		return res, stopped
	}
	if stmts0 != nil {
		stmts1, note := statementCalls(ctx, pool)
		if stmts1 == nil {
			res.StatementsNote = note
		} else {
			res.Statements = statementsPerStep(stmts0, stmts1, steps)
		}
	}

	// Latency at half the drained rate.
	if o.Paced > 0 {
		rate := res.FlowsPerSec / 2
		res.PacedRate = rate
		lat.on.Store(true)
		span.on.Store(true)
		rt.timing.Store(true)
		base := isDone()
		interval := 10 * time.Millisecond
		perTick := rate * interval.Seconds()
		pacedStart := time.Now()
		var owed float64
		var started int64
		tk := time.NewTicker(interval)
		end := time.Now().Add(o.Paced)
		for time.Now().Before(end) {
			<-tk.C
			owed += perTick
			n := int(owed)
			owed -= float64(n)
			if n == 0 {
				continue
			}
			starts := make([]wharfflow.Start, n)
			for i := range starts {
				starts[i] = start(i)
			}
			if _, err := client.Start(ctx, starts...); err != nil {
				tk.Stop()
				_ = stopSenderWait()
				return res, err
			}
			started += int64(n)
		}
		tk.Stop()
		for isDone()-base < started {
			select {
			case <-ctx.Done():
				_ = stopSenderWait()
				return res, ctx.Err()
			case <-tick.C:
			}
		}
		lat.on.Store(false)
		span.on.Store(false)
		rt.timing.Store(false)
		res.Calls = rt.callTimes()
		res.P99PerSecondMs = lat.perSecond(pacedStart, int((o.Paced+time.Second-1)/time.Second))
		res.Samples, res.P50Ms, res.P99Ms = lat.summary()
		res.SpanSamples, res.SpanP50Ms, res.SpanP99Ms = span.summary()
		if workload == "signal" && started > 0 {
			res.SignalLeasedPaced = float64(signalled()-sig0) / float64(started)
		}
	}
	if err := stopSenderWait(); err != nil {
		return res, err
	}
	return res, nil
}

// idQueue hands the instances whose step "a" ran (and returns Await) to
// the signal sender, each once after has passed since.
type idQueue struct {
	after time.Duration
	mu    sync.Mutex
	ids   []int64
	at    []time.Time // when each id is due
	ready chan struct{}
}

func (q *idQueue) add(id int64) {
	q.mu.Lock()
	q.ids = append(q.ids, id)
	q.at = append(q.at, time.Now().Add(q.after))
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns up to n ids that are due, and when the next one is (zero
// when none is queued).
func (q *idQueue) take(n int) ([]int64, time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	k := 0
	for k < min(n, len(q.ids)) && !q.at[k].After(now) {
		k++
	}
	out := slices.Clone(q.ids[:k])
	q.ids, q.at = q.ids[k:], q.at[k:]
	var next time.Time
	if len(q.at) > 0 {
		next = q.at[0]
	}
	return out, next
}

// sendSignals signals the instances whose first step ran, SignalAfter
// later, as an application that learns of them would (DBOS's harness sends
// to a workflow once it started), in batches of up to 500 per transaction,
// the payload carrying the send time. A signal may commit before its await
// does (it is kept, and the await's write makes the instance due) or after
// (the signal wakes it); with SignalAfter 0 most race the await's write.
// It looked the instances up in the database before, and that scan of the
// claim index, a cost of the bench and not of flows, was up to a third of
// the server's time in this workload.
func sendSignals(ctx context.Context, client *wharfflow.Client, q *idQueue) error {
	for ctx.Err() == nil {
		ids, next := q.take(500)
		if len(ids) == 0 {
			wait := time.Hour
			if !next.IsZero() {
				wait = time.Until(next)
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-q.ready:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		sigs := make([]wharfflow.Signal, len(ids))
		now := time.Now().UnixNano()
		for i, id := range ids {
			sigs[i] = wharfflow.Signal{Instance: id, Name: "go", Payload: now, DedupKey: "go"}
		}
		if _, err := client.Send(ctx, sigs...); err != nil && !errors.Is(err, wharfflow.ErrNoInstance) {
			return err
		}
	}
	return ctx.Err()
}

// stmtKey is a pg_stat_statements entry: a statement is counted apart at
// top level and inside functions.
type stmtKey struct {
	id       int64
	topLevel bool
}

type stmtCalls struct {
	query string
	calls int64
}

// statementCalls reads this database's pg_stat_statements calls; nil and
// a note when the server does not load the extension. The extension is
// created in the database when the server loads its library.
func statementCalls(ctx context.Context, pool *pgxpool.Pool) (map[stmtKey]stmtCalls, string) {
	var loaded bool
	if err := pool.QueryRow(ctx, "SELECT 'pg_stat_statements' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))").
		Scan(&loaded); err != nil {
		return nil, "statements per step: reading shared_preload_libraries: " + oneLine(err)
	}
	if !loaded {
		return nil, "statements per step: not measured: this server does not load pg_stat_statements (shared_preload_libraries); " +
			"without --database-url the throwaway cluster loads it when installed"
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return nil, "statements per step: not measured: CREATE EXTENSION pg_stat_statements: " + oneLine(err)
	}
	rows, err := pool.Query(ctx, `SELECT queryid, toplevel, query, calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`)
	if err != nil {
		return nil, "statements per step: not measured: reading pg_stat_statements: " + oneLine(err)
	}
	defer rows.Close()
	out := map[stmtKey]stmtCalls{}
	for rows.Next() {
		var k stmtKey
		var c stmtCalls
		if err := rows.Scan(&k.id, &k.topLevel, &c.query, &c.calls); err != nil {
			return nil, "statements per step: not measured: reading pg_stat_statements: " + oneLine(err)
		}
		out[k] = c
	}
	if err := rows.Err(); err != nil {
		return nil, "statements per step: not measured: reading pg_stat_statements: " + oneLine(err)
	}
	return out, ""
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// stmtKinds name the top-level statements of a flow run by what they call.
var stmtKinds = []struct{ match, kind string }{
	{"claim_flow_steps(", "claim"},
	{"complete_flow_steps(", "outcome"},
	{"signal_flows(", "signal"},
	{"wake_flows(", "wake"},
	{"flow_leased_steps(", "leased read"},
	{"start_flows(", "start"},
	{"renew_flow_leases(", "renew"},
	{"release_flow_leases(", "release"},
	{"enqueue", "enqueue"},
	{"flow_instances WHERE status IN", "bench: awaiting lookup"},
}

// stmtKind classifies a statement; "" for the bench's own measuring.
func stmtKind(query string, topLevel bool) string {
	if !topLevel {
		return "in functions"
	}
	for _, k := range stmtKinds {
		if strings.Contains(query, k.match) {
			return k.kind
		}
	}
	q := strings.ToUpper(strings.TrimSpace(query))
	switch {
	case strings.Contains(q, "PG_STAT_"):
		return ""
	case strings.HasPrefix(q, "BEGIN"), strings.HasPrefix(q, "COMMIT"), strings.HasPrefix(q, "ROLLBACK"):
		return "begin/commit"
	case strings.HasPrefix(q, "LISTEN"), strings.HasPrefix(q, "UNLISTEN"):
		return "listen"
	}
	return "other"
}

// statementsPerStep is the calls between two snapshots per step, by kind,
// with "total" the top-level statements.
func statementsPerStep(before, after map[stmtKey]stmtCalls, steps int64) map[string]float64 {
	out := map[string]float64{}
	if steps == 0 {
		return out
	}
	for k, a := range after {
		n := a.calls - before[k].calls
		kind := stmtKind(a.query, k.topLevel)
		if n <= 0 || kind == "" {
			continue
		}
		per := float64(n) / float64(steps)
		out[kind] += per
		if k.topLevel {
			out["total"] += per
		}
	}
	return out
}

// WriteFlowSummary prints the flow workloads' figures.
func WriteFlowSummary(w io.Writer, rs []FlowResult) error {
	_, err := fmt.Fprintf(w, "%-13s %9s %10s %10s %9s %9s %10s %10s %10s %10s %s\n", "workload", "flows", "steps/s", "flows/s",
		"rt/step", "tx/step", "cpu µs/st", "server µs", "p50 ms", "p99 ms", "(latency at flows/s)")
	if err != nil {
		return err
	}
	for _, r := range rs {
		server := "-"
		if r.ServerCPUPerStepUs > 0 {
			server = fmt.Sprintf("%.1f", r.ServerCPUPerStepUs)
		}
		if _, err := fmt.Fprintf(w, "%-13s %9d %10.0f %10.0f %9.3f %9.3f %10.1f %10s %10.2f %10.2f %.0f\n", r.Workload, r.Instances,
			r.StepsPerSec, r.FlowsPerSec, r.RoundTripsPerStep, r.CommitsPerStep, r.ProcessCPUPerStepUs, server,
			r.P50Ms, r.P99Ms, r.PacedRate); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if r.Incomplete {
			if _, err := fmt.Fprintf(w, "%s: INCOMPLETE: %d of %d flows done in %.1f s, the figures are over that time (%s)\n",
				r.Workload, r.FlowsDone, r.Instances, r.Seconds, r.StopReason); err != nil {
				return err
			}
		}
	}
	for _, r := range rs {
		if err := writeKeyedSummary(w, r); err != nil {
			return err
		}
		if err := writeRateSummary(w, r); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if err := writeRunnerLog(w, r); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if r.Statements == nil {
			if r.StatementsNote != "" {
				if _, err := fmt.Fprintf(w, "%s: %s\n", r.Workload, r.StatementsNote); err != nil {
					return err
				}
			}
			continue
		}
		if _, err := fmt.Fprintf(w, "%s: statements per step (pg_stat_statements): %s\n", r.Workload, formatStatements(r.Statements)); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if len(r.P99PerSecondMs) == 0 {
			continue
		}
		secs := make([]string, len(r.P99PerSecondMs))
		for i, v := range r.P99PerSecondMs {
			secs[i] = fmt.Sprintf("%.1f", v)
		}
		if _, err := fmt.Fprintf(w, "%s: step-to-step p99 in each second of the paced phase, ms: %s (median %.1f)\n",
			r.Workload, strings.Join(secs, " "), median(slices.Clone(r.P99PerSecondMs))); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if r.SpanP99Ms == 0 {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s: spawn → join (two step-to-step gaps), ms p50/p99: %.2f/%.2f\n", r.Workload, r.SpanP50Ms, r.SpanP99Ms); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if r.Workload != "signal" {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s: resumed steps leased by their signal (no claim): %.0f%% in the drain, %.0f%% paced\n",
			r.Workload, 100*r.SignalLeasedDrain, 100*r.SignalLeasedPaced); err != nil {
			return err
		}
	}
	for _, r := range rs {
		if len(r.Calls) == 0 {
			continue
		}
		kinds := slices.Sorted(maps.Keys(r.Calls))
		parts := make([]string, len(kinds))
		for i, k := range kinds {
			c := r.Calls[k]
			parts[i] = fmt.Sprintf("%s %.2f/%.2f/%.1f (%d)", k, c.P50Ms, c.P99Ms, c.MaxMs, c.Calls)
		}
		if _, err := fmt.Fprintf(w, "%s: paced calls, ms p50/p99/max (calls): %s\n", r.Workload, strings.Join(parts, ", ")); err != nil {
			return err
		}
	}
	return nil
}

// formatStatements lists the kinds by calls, then the top-level total and
// the statements run inside functions.
func formatStatements(m map[string]float64) string {
	var kinds []string
	for k := range m {
		if k != "total" && k != "in functions" {
			kinds = append(kinds, k)
		}
	}
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
	parts := make([]string, 0, len(kinds)+2)
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.4f", k, m[k]))
	}
	parts = append(parts, fmt.Sprintf("total %.4f", m["total"]))
	if v, ok := m["in functions"]; ok {
		parts = append(parts, fmt.Sprintf("(+ %.3f inside functions)", v))
	}
	return strings.Join(parts, ", ")
}
