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
	fl.StringSliceVar(&f.flowWorkloads, "workload", bench.FlowWorkloads, "flow: workloads to run (steps, signal, children), comma-separated")
	fl.IntVar(&f.flow.Instances, "flows", 20000, "flow: instances per workload to pre-start and drain")
	fl.IntVar(&f.flow.Runners, "runners", 1, "flow: runners in this process")
	fl.IntVar(&f.flow.MaxInFlight, "max-in-flight", 512, "flow: steps each runner runs at once")
	fl.DurationVar(&f.flow.Paced, "paced", 0, "flow: how long to start flows at half the drained rate for step-to-step latency (default 5s; negative = skip)")
	fl.DurationVar(&f.flow.SignalAfter, "signal-after", 20*time.Millisecond,
		"flow: signal workload: how long after an instance's first step ran it is signalled (0: at once, racing the write of its await)")
}

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
	}
	for _, w := range o.Workloads {
		if !slices.Contains(bench.FlowWorkloads, w) {
			return usageError{fmt.Errorf("--workload %q: use steps, signal or children", w)}
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
	rs, err := bench.RunFlow(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		return err
	}
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
