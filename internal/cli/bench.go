package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wharfhq/wharf/internal/bench"
	"github.com/wharfhq/wharf/internal/pgembed"
)

type benchFlags struct {
	opts          bench.Options
	flow          bench.FlowOptions
	flowWorkloads []string
	mode          string
	recordsPerKey int
	jsonPath      string
	reportDir     string
	cpuProfile    string
}

func newBenchCmd(g *globals) *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput, sustainable rate, latency and stability (drain, baseline, steady, sweep, soak)",
		Long: `Runs the benchmark in a fresh schema wharf_bench_<random>,
dropped at the end unless --keep is given. Without a database URL it starts a
throwaway PostgreSQL (fsync on) from the local server binaries.

Modes:
  drain     pre-fill --messages with COPY, then time --relays relays emptying the outbox
  baseline  Wharf beside the server's physical limits, in one run: the producers
            enqueue flat out for --duration with no relay; a bare multi-row INSERT
            of the same messages into a one-index table (the insert limit); the
            relays drain what the producers wrote; a bare DELETE ... WHERE id IN
            (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING loop over as many
            rows (the removal limit). Wharf's rates are shown as fractions of them
  steady    producers at --rate msgs/s for --warmup + --duration with the relays
            running, from an emptied outbox (VACUUM (ANALYZE), REINDEX, CHECKPOINT).
            Sustainable when the producers reached 99 % of the rate; the backlog
            did not grow faster than max(10 msg/s, 0.1 % of the rate) with 95 %
            confidence (least-squares slope over the window, standard error
            corrected for autocorrelation, one-sided t test); the backlog at the
            producers' stop is at most 2 s of load; and p99 commit→ack is within
            --max-p99 when given. With --backlog N the outbox holds N messages
            (COPY, or Enqueue calls in WAL mode) before the relay and the
            producers start: an overload run, reporting the rate offered over
            the window (outstanding at its start + produced in it, per
            second), the rate processed, whether the relay had work all
            along, and the worst second
  sweep     a reference run at --min-rate, bisection runs below --max-rate (at the
            geometric mean, until within 5 % or --sweep-steps), then --confirm
            repeats of the winner (a failed repeat bisects below it again, three
            times at most, then steps down 10 % at a time). Every run starts
            from an emptied, vacuumed, reindexed and checkpointed outbox. Latency
            is judged on the median of the window's per-second p99s, which must
            stay within max(--p99-floor, 3 × the same median at the highest
            passing rate below); the window's own p99 is reported beside it.
            Reports the highest rate sustainable in every run, with the evidence
            of each run
  flow      durable flows (wharfflow): per --workload (steps: 3 empty steps; signal:
            3 steps awaiting one signal, sent --signal-after the first step ran; children:
            a parent spawning 10 one-step children and joining them; keyed: a parent
            spawning 3 children of one --step-time step on --concurrency-keys keys of
            --concurrency-limit, against the limit-bound ideal and the same children
            without keys; ratelimited: steps on a --rate-limit/--rate-burst bucket, the
            rate achieved and the most granted in any second), --flows
            instances pre-started and drained by --runners runners (steps/s,
            client round trips and commits per step, and statements per step
            by kind from pg_stat_statements when the server loads it: the
            throwaway cluster does, when the library is installed), then
            --paced of flows started at half the drained rate (step-to-step
            p50/p99, the p99 of each second, and p50/p99/max of the claim,
            outcome, signal, start, wake and leased-read calls: the parts of
            a step-to-step gap)
  soak      a long steady run (e.g. --rate at half the sustainable rate,
            --duration 30m) with the relay in this process; samples the process's
            resident memory, Go heap and goroutines, the p99 of each interval and
            the outbox's dead tuples (in WAL mode: the WAL the slot retains and
            the bytes the relay holds), and fails when any of them rises faster
            than its tolerance per hour with 95 % confidence (same trend test as
            the backlog's growth)

One relay runs in this process by default, behind a probe sink that records when the
sink acknowledged each message: that gives commit-to-ack latency. With --relays > 1
(or --in-process=false) relays run as 'wharf relay' processes; latency is then not
measured. A live progress line goes to stderr, the summary to stdout; --json and
--report DIR (samples.csv and a self-contained index.html with charts) keep the results.

With --outbox-mode wal the outbox is in WAL mode (needs wal_level=logical): each
enqueue call is one logical decoding message, streamed by one relay (--relays 1)
from the replication slot named after the schema. A drained outbox is a slot
confirmed up to the WAL position; steady and sweep runs start from one (the slot
is advanced) and run the relay in this process for latency. Baseline also
measures the emit limit: the same payloads, one bare pg_logical_emit_message
each, its rate and WAL bytes per message beside Wharf's. Not with soak.`,
		Example: `  wharf bench --mode drain --messages 1000000
  wharf bench --mode baseline --duration 10s
  wharf bench --mode steady --rate 20000 --duration 30s --report out/
  wharf bench --mode steady --rate 50000 --backlog 250000 --warmup 0 --duration 5s --tail-wait 0
  wharf bench --mode sweep --records-per-key 10 --producer-batch 100 --payload-bytes 200 --json sweep.json
  wharf bench --mode drain --relays 2 --relay-arg=--fetch-batch=8000
  wharf bench --mode soak --rate 10000 --duration 30m --report soak/
  wharf bench --mode flow --workload steps,signal,children --flows 20000
  wharf bench --mode flow --workload keyed --flows 750 --runners 2
  wharf bench --mode baseline --outbox-mode wal --database-url postgres://.../db
  wharf bench --mode steady --outbox-mode wal --rate 20000 --limits --database-url postgres://.../db`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return runBench(ctx, g, f, cmd)
		},
	}
	o := &f.opts
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", "drain", "what to measure: drain, baseline, steady, sweep, soak, or flow (durable flows, package wharfflow)")
	fl.StringVar(&o.OutboxMode, "outbox-mode", "table", "where the bench's outbox keeps messages: table, or wal (needs wal_level=logical and --relays 1; steady, sweep and soak run the relay in this process, drain and baseline as a process; baseline adds the emit limit)")
	fl.IntVar(&o.Messages, "messages", 200000, "drain: messages to pre-fill")
	fl.DurationVar(&o.Duration, "duration", 10*time.Second, "baseline, steady, soak and each sweep step: how long the producers run after the warm-up")
	fl.DurationVar(&o.Warmup, "warmup", 5*time.Second, "steady, soak and sweep: warm-up before --duration, excluded from the rates, slope and latency (0 = none)")
	fl.IntVar(&o.Rate, "rate", 0, "steady and soak: target msgs/s")
	fl.IntVar(&o.Backlog, "backlog", 0, "steady: pre-fill the outbox with this many messages before the relay and the producers start, so the relay is offered --rate plus the backlog (overload: reports offered and processed rate over the window and the worst second)")
	fl.IntVar(&o.MinRate, "min-rate", 10000, "sweep: lowest rate in msgs/s")
	fl.IntVar(&o.MaxRate, "max-rate", 400000, "sweep: highest rate in msgs/s")
	fl.IntVar(&o.SweepSteps, "sweep-steps", 8, "sweep: most bisection runs after the reference run at --min-rate (it stops once the bracket is within 5 %)")
	fl.IntVar(&o.Confirm, "confirm", 2, "sweep: repeats of the winning rate, each of which must be sustainable (at least 2)")
	fl.DurationVar(&o.MaxP99, "max-p99", 0, "steady: fail the run when p99 commit→ack exceeds this (0 = latency not judged)")
	fl.DurationVar(&o.P99Floor, "p99-floor", 50*time.Millisecond, "sweep: a run fails when the median of its per-second p99s commit→ack exceeds max(this, 3 × the same median at the highest passing rate below)")
	fl.BoolVar(&o.Limits, "limits", false, "drain, steady, sweep: also measure the physical limit in the same run (removal limit for drain, table outbox only; insert limit otherwise, plus the emit limit with --outbox-mode wal); baseline always does")
	fl.IntVar(&o.Producers, "producers", 4, "producer connections")
	fl.IntVar(&o.ProducerBatch, "producer-batch", 100, "messages per producer transaction (also --messages-per-tx); drain: messages per pre-fill transaction through Enqueue, in WAL mode each one logical message (default 1000 there; a table outbox is pre-filled with one COPY unless this is given; 1 = one message per transaction)")
	fl.BoolVar(&o.AsyncCommit, "async-commit", false, "steady, sweep, soak, baseline: producers commit with synchronous_commit off (no wait for the WAL flush), so one message per transaction is not held to the disk's flush rate")
	fl.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "messages-per-tx" {
			name = "producer-batch"
		}
		return pflag.NormalizedName(name)
	})
	fl.IntVar(&f.recordsPerKey, "records-per-key", 10, "consecutive messages per key before a new key is used; 0 = no keys (NULL)")
	fl.IntVar(&o.Keys, "keys", 0, "instead of --records-per-key, cycle over this many keys (message i gets key k<i mod keys>)")
	fl.IntVar(&o.PayloadBytes, "payload-bytes", 200, "payload size in bytes")
	fl.IntVar(&o.Relays, "relays", 1, "relays to run (baseline runs them for its drain phase only)")
	fl.BoolVar(&o.InProcess, "in-process", true, "run the relay in this process to measure latency (only with --relays 1; default true when --relays is 1)")
	fl.StringVar(&o.Sink, "sink", "null:", "sink URL: null:, stdout:, file:///path.jsonl (docs/relay.md, Sinks)")
	fl.Float64Var(&o.PoisonPercent, "poison-percent", 0, "steady, sweep, soak (relay in this process): this share of the messages fails every attempt and is dead-lettered (3 attempts, 50ms first backoff unless --relay-arg sets --max-attempts or --retry-backoff)")
	fl.StringArrayVar(&o.RelayArgs, "relay-arg", nil, "extra relay flag, repeatable, e.g. --relay-arg=--fetch-batch=8000 (applies to in-process and process relays)")
	fl.StringVar(&f.jsonPath, "json", "", "write the result as JSON to this file")
	fl.StringVar(&f.reportDir, "report", "", "write samples.csv and index.html (charts) into this directory")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile (go tool pprof) of this process over the run: the relay in this process, with the producers and the pre-fill; not with relay processes; in flow mode, the runners and the bench")
	fl.BoolVar(&o.Keep, "keep", false, "keep the bench schema at the end")
	fl.DurationVar(&o.SampleInterval, "sample-interval", 0, "fixed sampling period (0 = adapt: 100 ms, 250 ms with relay processes, doubling past 240 samples)")
	fl.DurationVar(&o.TailWait, "tail-wait", 10*time.Second, "steady: after the producers stop, wait at most this long for the relays to catch up (0 = do not wait; a sweep always waits for an empty outbox, up to 2m)")
	fl.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "drain, baseline: give up a drain or the removal limit after this long")
	addFlowBenchFlags(fl, f)
	return cmd
}

// logicalThrowaway is throwawayDatabase with wal_level=logical, which an
// outbox in WAL mode needs.
func logicalThrowaway(ctx context.Context, g *globals) (func(), error) {
	dir, err := pgembed.FindBinaries()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(g.stderr, "No database URL given: starting a throwaway PostgreSQL (fsync on, wal_level=logical) from %s ...\n", dir)
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cluster, err := pgembed.Start(startCtx, pgembed.Options{Fsync: true, Logger: g.log, Settings: map[string]string{"wal_level": "logical"}})
	cancel()
	if err != nil {
		return nil, err
	}
	g.databaseURL = cluster.URL()
	return func() {
		if err := cluster.Stop(); err != nil {
			g.log.Warn("wharf: removing the throwaway PostgreSQL failed", "err", err)
		}
	}, nil
}

// parseRelayArgs checks --relay-arg values against the relay's own flags and
// returns the settings they make, for the in-process relay.
func parseRelayArgs(args []string) (relayFlags, error) {
	var rf relayFlags
	tmp := &cobra.Command{Use: "relay"}
	rf.register(tmp, "")
	fs := tmp.Flags()
	if err := fs.Parse(args); err != nil {
		return rf, fmt.Errorf("--relay-arg: %w", err)
	}
	if fs.NArg() > 0 {
		return rf, fmt.Errorf("--relay-arg: %q is not a flag (write --relay-arg=--name=value)", fs.Args()[0])
	}
	for _, name := range []string{"sink", "drain"} {
		if fs.Changed(name) {
			return rf, fmt.Errorf("--relay-arg: --%s is set by the bench (use the bench's own --sink)", name)
		}
	}
	if err := checkRanges(fs, nil); err != nil {
		return rf, fmt.Errorf("--relay-arg: %w", err)
	}
	return rf, nil
}

func runBench(ctx context.Context, g *globals, f *benchFlags, cmd *cobra.Command) error {
	if f.mode == "flow" {
		return runFlowBench(ctx, g, f, cmd)
	}
	o := f.opts
	o.Mode = bench.Mode(f.mode)
	switch {
	case f.recordsPerKey < 0:
		return usageError{fmt.Errorf("--records-per-key must not be negative, got %d", f.recordsPerKey)}
	case f.recordsPerKey == 0:
		o.RecordsPerKey = -1
	default:
		o.RecordsPerKey = f.recordsPerKey
	}
	// In Options zero means the default; on the command line 0 means none.
	for _, d := range []struct {
		name string
		v    *time.Duration
	}{{"--warmup", &o.Warmup}, {"--tail-wait", &o.TailWait}} {
		switch {
		case *d.v < 0:
			return usageError{fmt.Errorf("%s must not be negative, got %s", d.name, *d.v)}
		case *d.v == 0:
			*d.v = -1
		}
	}
	if !cmd.Flags().Changed("producer-batch") {
		o.ProducerBatch = 0 // the mode's default
	} else if o.Mode == bench.ModeDrain && o.OutboxMode != "wal" {
		o.EnqueueFill = true
	}
	if !cmd.Flags().Changed("in-process") {
		o.InProcess = o.Relays == 1
	}
	rf, err := parseRelayArgs(o.RelayArgs)
	if err != nil {
		return usageError{err}
	}
	if rf.cfg.RelayID != "" && o.Relays > 1 {
		return usageError{errors.New("--relay-arg: --relay-id would give every relay process the same name; leave it out with --relays > 1")}
	}
	o.RelayConfig = rf.cfg
	if cmd.Flags().Changed("schema") {
		o.Schema = g.schema
	}
	o.Progress = g.stderr
	o.RelayStderr = g.stderr
	o.Logger = g.log
	if !cmd.Flags().Changed("log-level") {
		// The relay's info lines would break up the progress line.
		o.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// Check the flags before starting a throwaway cluster.
	if err := o.Validate(); err != nil {
		return usageError{err}
	}
	if f.cpuProfile != "" && !o.RelayInProcess() {
		return usageError{errors.New("--cpuprofile profiles this process, and this run's relays run as processes (--in-process=false, --relays above 1, or a drain or baseline with --outbox-mode wal): profile a run with the relay in this process")}
	}

	var stopDB func()
	if o.OutboxMode == "wal" && g.databaseURL == "" {
		stopDB, err = logicalThrowaway(ctx, g)
	} else {
		_, stopDB, err = g.throwawayDatabase(ctx)
	}
	if err != nil {
		return err
	}
	defer stopDB()
	o.DatabaseURL = g.databaseURL

	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	res, err := bench.Run(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		if strings.HasPrefix(err.Error(), "--") {
			return usageError{err}
		}
		return err
	}
	if err := bench.WriteSummary(g.stdout, res); err != nil {
		return err
	}
	if f.jsonPath != "" {
		if err := bench.WriteJSONFile(f.jsonPath, res); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "wrote %s\n", f.jsonPath)
	}
	if f.reportDir != "" {
		if err := bench.WriteReport(f.reportDir, res); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "wrote %s/samples.csv and %s/index.html\n", f.reportDir, f.reportDir)
	}
	return nil
}

// startCPUProfile starts a CPU profile into path; stop ends it and closes
// the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
