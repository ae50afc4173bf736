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
//
// keyed is Wharf's keyed workload (see keyed.go): a parent enqueues 3 child
// workflows of one step each (a 2-10 ms sleep) on a queue partitioned by
// key, K keys with L running per key, and awaits them; keyed-unkeyed runs
// the same children without the queue.
//
//	go run . --database-url postgres://postgres@127.0.0.1:5432/test --workload keyed --flows 750 --concurrency 750
package main

import (
	"context"
	"flag"
	"fmt"
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
	concurrency := flag.Int("concurrency", 64, "workflows in flight (keyed: parents; give --flows to start them all at once, as Wharf's bench pre-starts them)")
	workloads := flag.String("workload", "steps,signal,children", "workloads, comma-separated: steps, signal, children, keyed, keyed-unkeyed")
	kf := keyedFlags{}
	flag.IntVar(&kf.keys, "concurrency-keys", 4, "keyed: partition keys the children are spread over (each child one, drawn at random)")
	flag.IntVar(&kf.limit, "concurrency-limit", 2, "keyed: workflows of one partition running at once (WithPartitionConcurrency)")
	flag.StringVar(&kf.stepTime, "step-time", "2ms-10ms", "keyed: each child's step sleeps a time drawn uniformly from MIN-MAX (fixed seed, the draws of Wharf's bench)")
	flag.DurationVar(&kf.queuePoll, "queue-poll", 10*time.Millisecond, "keyed: the queue's base polling interval (WithQueueBasePollingInterval; DBOS's default is 1s)")
	flag.DurationVar(&kf.resultPoll, "result-poll", time.Second, "keyed: the parents' GetResult polling interval for their queued children (DBOS's default is 1s)")
	flag.IntVar(&kf.executors, "executors", 1, "keyed: DBOS executors in this process (distinct executor IDs, one schema); parents start on the first, any dequeues children")
	flag.Parse()
	if *url == "" {
		fmt.Fprintln(os.Stderr, "dbos-bench: --database-url is required")
		os.Exit(2)
	}
	if err := kf.parse(); err != nil {
		fmt.Fprintln(os.Stderr, "dbos-bench:", err)
		os.Exit(2)
	}
	schema := fmt.Sprintf("dbos_bench_%d", time.Now().UnixNano()%1_000_000)
	logs := &logCounts{}
	var ctxs []dbos.Context
	defer func() {
		for _, c := range ctxs {
			dbos.Shutdown(c, 10*time.Second)
		}
		if conn, err := pgx.Connect(context.Background(), *url); err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
	}()
	for i := range max(1, kf.executors) {
		c, err := dbos.NewContext(context.Background(), dbos.Config{DatabaseURL: *url, AppName: "dbos-bench",
			DatabaseSchema: schema, ExecutorID: fmt.Sprintf("bench-%d", i), Logger: slog.New(logs)})
		if err != nil {
			fmt.Fprintln(os.Stderr, "dbos-bench:", err)
			os.Exit(1)
		}
		dbos.RegisterWorkflow(c, stepsWorkflow)
		dbos.RegisterWorkflow(c, signalWorkflow)
		dbos.RegisterWorkflow(c, childWorkflow)
		dbos.RegisterWorkflow(c, parentWorkflow)
		dbos.RegisterWorkflow(c, keyedChild)
		dbos.RegisterWorkflow(c, keyedParent)
		if err := dbos.Launch(c); err != nil {
			fmt.Fprintln(os.Stderr, "dbos-bench:", err)
			os.Exit(1)
		}
		ctxs = append(ctxs, c)
	}
	ctx := ctxs[0]
	fmt.Printf("%-13s %7s %10s %10s %9s %9s  (DBOS Transact Go v1.8.0, %d in flight)\n", "workload", "flows", "steps/s", "flows/s", "p50 ms", "p99 ms", *concurrency)
	for _, w := range strings.Split(*workloads, ",") {
		var err error
		if w == "keyed" || w == "keyed-unkeyed" {
			err = runKeyed(ctx, *url, w, *flows, *concurrency, kf, logs)
		} else {
			err = run(ctx, w, *flows, *concurrency)
		}
		if err != nil {
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
	fmt.Printf("%-13s %7d %10.0f %10.0f %9.2f %9.2f\n", w, n, float64(n*steps)/el.Seconds(), float64(n)/el.Seconds(), q(0.5), q(0.99))
	return nil
}
