package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wharfhq/wharf/internal/bench"
	"github.com/wharfhq/wharf/internal/pgembed"
)

func addFlowBenchFlags(fl *pflag.FlagSet, f *benchFlags) {
	fl.StringSliceVar(&f.flowWorkloads, "workload", bench.DefaultFlowWorkloads, "flow: workloads to run, comma-separated: "+
		"steps (3 empty steps), signal (3 steps awaiting one signal), children (a parent spawning 10 one-step children and joining them), "+
		"keyed (a parent spawning 3 children of one step, a sleep drawn from --step-time, each child under one of --concurrency-keys keys "+
		"with --concurrency-limit; checks no key ever runs more steps at once and compares the rate with the limit-bound ideal "+
		"and, unless --skip-unkeyed, with the same children without keys, run next as keyed-unkeyed), "+
		"ratelimited (3 empty steps per flow under one rate key of --rate-limit/s and --rate-burst, --rate-for long; "+
		"checks the steps started in any 1 s and 100 ms window against rate × window + burst)")
	fl.IntVar(&f.flow.Instances, "flows", 20000, "flow: instances per workload to pre-start and drain (keyed: parents; not for ratelimited, see --rate-for)")
	fl.IntVar(&f.flow.Runners, "runners", 1, "flow: runners in this process")
	fl.IntVar(&f.flow.MaxInFlight, "max-in-flight", 512, "flow: steps each runner runs at once")
	fl.DurationVar(&f.flow.LeaseTTL, "lease-ttl", 0, "flow: the runners' lease TTL (0: the runner's default, 30s); rows waiting on a concurrency key wake at the latest when a running step's lease ends")
	fl.DurationVar(&f.flow.Paced, "paced", 0, "flow: how long to start flows at half the drained rate for step-to-step latency (default 5s; negative = skip)")
	fl.DurationVar(&f.flow.SignalAfter, "signal-after", 20*time.Millisecond,
		"flow: signal workload: how long after an instance's first step ran it is signalled (0: at once, racing the write of its await)")
	fl.IntVar(&f.flow.ConcurrencyKeys, "concurrency-keys", 4, "flow: keyed workload: concurrency keys the children are spread over (each child one, drawn at random)")
	fl.IntVar(&f.flow.ConcurrencyLimit, "concurrency-limit", 2, "flow: keyed workload: each key's ConcurrencyLimit (steps of one key running at once)")
	f.flow.StepTimeMin, f.flow.StepTimeMax = 2*time.Millisecond, 10*time.Millisecond
	fl.Var(stepTimeFlag{&f.flow.StepTimeMin, &f.flow.StepTimeMax}, "step-time",
		"flow: keyed workload: each child's step sleeps a time drawn uniformly from MIN-MAX (fixed seed), or one duration; 0: no sleep")
	fl.BoolVar(&f.flow.SkipUnkeyed, "skip-unkeyed", false, "flow: keyed workload: do not run keyed-unkeyed (the same children without keys) after it")
	fl.Float64Var(&f.flow.RateLimit, "rate-limit", 200, "flow: ratelimited workload: the rate key's steps per second (Config.RateLimits PerSecond)")
	fl.Float64Var(&f.flow.RateBurst, "rate-burst", 10, "flow: ratelimited workload: the rate key's burst (at least 1)")
	fl.DurationVar(&f.flow.RateFor, "rate-for", 10*time.Second, "flow: ratelimited workload: pre-start enough flows for this long at --rate-limit after the burst")
	fl.DurationVar(&f.flow.DrainTimeout, "drain-timeout", 10*time.Minute,
		"flow: stop a workload's drain after this long, report how far it got and exit non-zero (0: no limit)")
}

// stepTimeFlag is --step-time: MIN-MAX or one duration.
type stepTimeFlag struct{ lo, hi *time.Duration }

func (v stepTimeFlag) String() string {
	if v.lo == nil {
		return ""
	}
	return bench.FormatStepTime(*v.lo, *v.hi)
}

func (v stepTimeFlag) Set(s string) error {
	lo, hi, err := bench.ParseStepTime(s)
	if err != nil {
		return err
	}
	*v.lo, *v.hi = lo, hi
	return nil
}

func (stepTimeFlag) Type() string { return "range" }

// runFlowBench is `wharf bench --mode flow`.
func runFlowBench(ctx context.Context, g *globals, f *benchFlags, cmd *cobra.Command) error {
	o := f.flow
	o.Workloads = f.flowWorkloads
	switch {
	case o.Instances < 1:
		return usageError{fmt.Errorf("--flows must be at least 1, got %d", o.Instances)}
	case o.Runners < 1:
		return usageError{fmt.Errorf("--runners must be at least 1, got %d", o.Runners)}
	case o.MaxInFlight < 1:
		return usageError{fmt.Errorf("--max-in-flight must be at least 1, got %d", o.MaxInFlight)}
	case o.SignalAfter < 0:
		return usageError{fmt.Errorf("--signal-after must not be negative, got %s", o.SignalAfter)}
	case o.ConcurrencyKeys < 1:
		return usageError{fmt.Errorf("--concurrency-keys must be at least 1, got %d", o.ConcurrencyKeys)}
	case o.ConcurrencyLimit < 1:
		return usageError{fmt.Errorf("--concurrency-limit must be at least 1, got %d", o.ConcurrencyLimit)}
	case !(o.RateLimit > 0):
		return usageError{fmt.Errorf("--rate-limit must be above 0, got %g", o.RateLimit)}
	case !(o.RateBurst >= 1):
		return usageError{fmt.Errorf("--rate-burst must be at least 1, got %g", o.RateBurst)}
	case o.RateFor <= 0:
		return usageError{fmt.Errorf("--rate-for must be above 0, got %s", o.RateFor)}
	case o.LeaseTTL != 0 && o.LeaseTTL < 100*time.Millisecond:
		return usageError{fmt.Errorf("--lease-ttl must be at least 100ms, got %s", o.LeaseTTL)}
	case o.DrainTimeout < 0:
		return usageError{fmt.Errorf("--drain-timeout must not be negative, got %s", o.DrainTimeout)}
	}
	if o.StepTimeMax == 0 {
		o.StepTimeMax = -1 // 0 on the command line: no sleep
	}
	for _, w := range o.Workloads {
		if !slices.Contains(bench.FlowWorkloads, w) {
			return usageError{fmt.Errorf("--workload %q: use steps, signal, children, keyed, keyed-unkeyed or ratelimited", w)}
		}
	}
	if o.Paced < 0 {
		o.Paced = -1
	}
	if cmd.Flags().Changed("schema") {
		o.Schema = g.schema
	}
	o.Keep = f.opts.Keep
	o.Progress = g.stderr
	o.Logger = g.log
	// A throwaway cluster loads pg_stat_statements when the server has it,
	// for the statements per step.
	_, stopDB, err := g.throwawayDatabaseWith(ctx, func(binDir string) map[string]string {
		if !pgembed.HasLibrary(binDir, "pg_stat_statements") {
			return nil
		}
		return map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
	})
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
	rs, runErr := bench.RunFlow(ctx, o)
	// What ran is reported even when a workload failed: a drain that
	// timed out, or a concurrency key over its limit.
	if len(rs) > 0 {
		if err := writeFlowResults(g, f, rs); err != nil {
			return err
		}
	}
	if runErr != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		return runErr
	}
	return nil
}

// writeFlowResults writes the summary, and the JSON when --json is given.
func writeFlowResults(g *globals, f *benchFlags, rs []bench.FlowResult) error {
	if err := bench.WriteFlowSummary(g.stdout, rs); err != nil {
		return err
	}
	if f.jsonPath != "" {
		b, err := json.MarshalIndent(rs, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(f.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "wrote %s\n", f.jsonPath)
	}
	return nil
}
