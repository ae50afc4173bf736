// Command dbos-bench runs the workloads of `wharf bench --mode flow` on DBOS
// Transact Go, on the same PostgreSQL, for a comparison in one sitting. It is
// a module of its own so that DBOS is never a dependency of Wharf.
//
//	go run . --database-url postgres://postgres@127.0.0.1:5432/test --flows 2000 --concurrency 64
//
// It works in a schema of its own, dbos_bench_<n>, dropped at the end.
//
// Workloads, as Wharf's: steps (a workflow of three empty steps), signal (a
// step, a Recv of one message sent by the driver once the workflow started,
// then two steps), children (a workflow starting ten child workflows of one
// step each and awaiting their results). Steps are counted as Wharf counts
// them: 3, 3 and 12 per flow.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
)

func empty(context.Context) (string, error) { return "", nil }

func stepsWorkflow(ctx dbos.Context, _ string) (string, error) {
	for range 3 {
		if _, err := dbos.RunAsStep(ctx, empty); err != nil {
			return "", err
		}
	}
	return "done", nil
}

func signalWorkflow(ctx dbos.Context, _ string) (string, error) {
	if _, err := dbos.RunAsStep(ctx, empty); err != nil {
		return "", err
	}
	if _, err := dbos.Recv[string](ctx, "go", time.Minute); err != nil {
		return "", err
	}
	for range 2 {
		if _, err := dbos.RunAsStep(ctx, empty); err != nil {
			return "", err
		}
	}
	return "done", nil
}

func childWorkflow(ctx dbos.Context, _ string) (string, error) {
	return dbos.RunAsStep(ctx, empty)
}

func parentWorkflow(ctx dbos.Context, _ string) (string, error) {
	var hs []dbos.WorkflowHandle[string]
	for range 10 {
		h, err := dbos.RunWorkflow(ctx, childWorkflow, "")
		if err != nil {
			return "", err
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		if _, err := h.GetResult(); err != nil {
			return "", err
		}
	}
	return "done", nil
}

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flows := flag.Int("flows", 2000, "workflows per workload")
	concurrency := flag.Int("concurrency", 64, "workflows in flight")
	workloads := flag.String("workload", "steps,signal,children", "workloads, comma-separated")
	flag.Parse()
	if *url == "" {
		fmt.Fprintln(os.Stderr, "dbos-bench: --database-url is required")
		os.Exit(2)
	}
	schema := fmt.Sprintf("dbos_bench_%d", time.Now().UnixNano()%1_000_000)
	ctx, err := dbos.NewContext(context.Background(), dbos.Config{DatabaseURL: *url, AppName: "dbos-bench",
		DatabaseSchema: schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbos-bench:", err)
		os.Exit(1)
	}
	dbos.RegisterWorkflow(ctx, stepsWorkflow)
	dbos.RegisterWorkflow(ctx, signalWorkflow)
	dbos.RegisterWorkflow(ctx, childWorkflow)
	dbos.RegisterWorkflow(ctx, parentWorkflow)
	if err := dbos.Launch(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "dbos-bench:", err)
		os.Exit(1)
	}
	defer func() {
		dbos.Shutdown(ctx, 10*time.Second)
		if conn, err := pgx.Connect(context.Background(), *url); err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
	}()
	fmt.Printf("%-9s %7s %10s %10s %9s %9s  (DBOS Transact Go v1.8.0, %d in flight)\n", "workload", "flows", "steps/s", "flows/s", "p50 ms", "p99 ms", *concurrency)
	for _, w := range strings.Split(*workloads, ",") {
		if err := run(ctx, w, *flows, *concurrency); err != nil {
			fmt.Fprintln(os.Stderr, "dbos-bench:", w+":", err)
			os.Exit(1)
		}
	}
}

// run runs n workflows of workload w with c in flight; latency is each
// workflow's start to result, divided by its steps (a step-to-step average).
func run(ctx dbos.Context, w string, n, c int) error {
	var wf func(dbos.Context, string) (string, error)
	steps := 3
	switch w {
	case "steps":
		wf = stepsWorkflow
	case "signal":
		wf = signalWorkflow
	case "children":
		wf, steps = parentWorkflow, 12
	default:
		return fmt.Errorf("unknown workload %q (steps, signal, children)", w)
	}
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				h, err := dbos.RunWorkflow(ctx, wf, "")
				if err == nil && w == "signal" {
					err = dbos.Send(ctx, h.GetWorkflowID(), "go", "go")
				}
				if err == nil {
					_, err = h.GetResult()
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				lat = append(lat, time.Since(t0)/time.Duration(steps))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	fmt.Printf("%-9s %7d %10.0f %10.0f %9.2f %9.2f\n", w, n, float64(n*steps)/el.Seconds(), float64(n)/el.Seconds(), q(0.5), q(0.99))
	return nil
}
