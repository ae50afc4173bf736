package main

// The keyed workload on DBOS, as Wharf's bench runs it (wharf bench --mode
// flow --workload keyed): a parent workflow enqueues 3 child workflows of
// one step each, the step a sleep drawn uniformly from --step-time, each
// child under one of --concurrency-keys keys, and awaits their results.
//
// Per-key concurrency is a partitioned queue: DBOS Transact Go v1.8.0
// partitions a queue by the partition key given on enqueue
// (WithQueuePartitionKey), and WithPartitionConcurrency(L) admits at most L
// workflows of one partition running at once across all executors. (The
// v1.8.0 API also keeps WithPartitionQueue, under which WithGlobalConcurrency
// and WithWorkerConcurrency apply per partition; it is deprecated in favour
// of the partition limits, and the two cannot be combined.) A DBOS child
// workflow holds one step, so the workflows of a partition running at once
// are its steps running at once, which the step function counts, per key,
// as Wharf's bench does: the most seen must not exceed L.
//
// The keys and step times are drawn from the same generator, seed and order
// as Wharf's bench, so both run the same children. keyed-unkeyed starts the
// same children as plain child workflows (no queue), as Wharf's runs them
// without keys.
//
// DBOS polls: its queue runner looks for work every --queue-poll (DBOS's
// default is 1s; 10ms here, or the queue, not DBOS's engine, would be the
// bound), and a parent awaiting a queued child polls its status every
// --result-poll (DBOS's default, 1s). The children's rate is therefore
// given twice: over the whole run (parents' start to their last result),
// and over the children's window (the first child step's start to the
// last one's end), which the parents' polling of results does not stretch.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
)

type keyedFlags struct {
	keys, limit           int
	stepTime              string
	lo, hi                time.Duration
	queuePoll, resultPoll time.Duration
	executors             int
}

func (f *keyedFlags) parse() error {
	a, b, isRange := strings.Cut(f.stepTime, "-")
	if !isRange {
		b = a
	}
	var err error
	f.lo, err = time.ParseDuration(strings.TrimSpace(a))
	if err == nil {
		f.hi, err = time.ParseDuration(strings.TrimSpace(b))
	}
	switch {
	case err != nil || f.lo < 0 || f.hi < f.lo:
		return fmt.Errorf("--step-time %q: use MIN-MAX with 0 <= MIN <= MAX, e.g. 2ms-10ms", f.stepTime)
	case f.keys < 1:
		return fmt.Errorf("--concurrency-keys must be at least 1, got %d", f.keys)
	case f.limit < 1:
		return fmt.Errorf("--concurrency-limit must be at least 1, got %d", f.limit)
	case f.queuePoll <= 0:
		return fmt.Errorf("--queue-poll must be above 0, got %s", f.queuePoll)
	case f.resultPoll <= 0:
		return fmt.Errorf("--result-poll must be above 0, got %s", f.resultPoll)
	case f.executors < 1:
		return fmt.Errorf("--executors must be at least 1, got %d", f.executors)
	}
	return nil
}

// keyTracker counts the children's steps running, by key, as Wharf's bench
// does.
type keyTracker struct {
	mu         sync.Mutex
	running    []int
	maxByKey   []int
	total      int
	maxTotal   int
	steps      int64
	stepNanos  int64
	first      time.Time // first step's start
	last       time.Time // last step's end
	lastEnter  time.Time
	longestGap time.Duration
}

func (t *keyTracker) enter(key int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.first.IsZero() {
		t.first = now
	}
	if !t.lastEnter.IsZero() {
		t.longestGap = max(t.longestGap, now.Sub(t.lastEnter))
	}
	t.lastEnter = now
	if key >= 0 {
		t.running[key]++
		t.maxByKey[key] = max(t.maxByKey[key], t.running[key])
	}
	t.total++
	t.maxTotal = max(t.maxTotal, t.total)
}

func (t *keyTracker) exit(key int, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key >= 0 {
		t.running[key]--
	}
	t.total--
	t.steps++
	t.stepNanos += int64(took)
	t.last = time.Now()
}

var (
	// keyedQueue is the partitioned queue of the keyed children.
	keyedQueue dbos.Queue
	// tracker counts the running keyed children's steps.
	tracker *keyTracker
	// resultPoll is the parents' GetResult polling interval.
	resultPoll time.Duration
)

type keyedChildInput struct {
	Key   int   `json:"key"` // -1: no key (no queue)
	Sleep int64 `json:"sleep_ns"`
}

type keyedParentInput struct {
	Keys  []int   `json:"keys"`
	Sleep []int64 `json:"sleep_ns"`
}

func keyedChild(ctx dbos.Context, in keyedChildInput) (int64, error) {
	return dbos.RunAsStep(ctx, func(context.Context) (int64, error) {
		t0 := time.Now()
		tracker.enter(in.Key)
		time.Sleep(time.Duration(in.Sleep))
		tracker.exit(in.Key, time.Since(t0))
		return t0.UnixNano(), nil
	})
}

func keyedParent(ctx dbos.Context, in keyedParentInput) (string, error) {
	hs := make([]dbos.WorkflowHandle[int64], 0, len(in.Keys))
	for i, k := range in.Keys {
		var opts []dbos.WorkflowOption
		if k >= 0 {
			opts = []dbos.WorkflowOption{dbos.WithQueue(keyedQueue), dbos.WithQueuePartitionKey("key" + strconv.Itoa(k))}
		}
		h, err := dbos.RunWorkflow(ctx, keyedChild, keyedChildInput{Key: k, Sleep: in.Sleep[i]}, opts...)
		if err != nil {
			return "", err
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		if _, err := h.GetResult(dbos.WithHandlePollingInterval(resultPoll)); err != nil {
			return "", err
		}
	}
	return "done", nil
}

// keyedChildren is how many children each parent enqueues.
const keyedChildren = 3

// drawParents draws the parents' children's keys and step times: the
// generator, seed and order of Wharf's bench (internal/bench/flow_keyed.go).
func drawParents(n int, f keyedFlags, keyed bool) ([]keyedParentInput, time.Duration) {
	rng := rand.New(rand.NewPCG(1, 0x6b65796564))
	var sum time.Duration
	out := make([]keyedParentInput, n)
	for p := range out {
		in := keyedParentInput{Keys: make([]int, keyedChildren), Sleep: make([]int64, keyedChildren)}
		for i := range keyedChildren {
			k := rng.IntN(f.keys)
			d := f.lo
			if f.hi > f.lo {
				d += time.Duration(rng.Int64N(int64(f.hi-f.lo) + 1))
			}
			if !keyed {
				k = -1
			}
			in.Keys[i], in.Sleep[i] = k, int64(d)
			sum += d
		}
		out[p] = in
	}
	return out, sum / time.Duration(n*keyedChildren)
}

// runKeyed runs n keyed parents with c in flight and prints the figures.
func runKeyed(ctx dbos.Context, url, w string, n, c int, f keyedFlags, logs *logCounts) error {
	keyed := w == "keyed"
	tracker = &keyTracker{running: make([]int, f.keys), maxByKey: make([]int, f.keys)}
	resultPoll = f.resultPoll
	if keyed && keyedQueue == nil {
		q, err := dbos.RegisterQueue(ctx, "keyed", dbos.WithPartitionConcurrency(f.limit), dbos.WithQueueBasePollingInterval(f.queuePoll))
		if err != nil {
			return fmt.Errorf("registering the partitioned queue: %w", err)
		}
		keyedQueue = q
		if f.executors > 1 {
			// The other executors find the queue in the database on
			// their next reconcile (every second).
			time.Sleep(1500 * time.Millisecond)
		}
	}
	parents, mean := drawParents(n, f, keyed)
	dl0 := serverDeadlocks(url)
	logs0 := logs.snapshot()
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for range min(c, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				h, err := dbos.RunWorkflow(ctx, keyedParent, parents[i])
				if err == nil {
					_, err = h.GetResult()
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	t := tracker
	t.mu.Lock()
	defer t.mu.Unlock()
	children := float64(n * keyedChildren)
	wall := children / el.Seconds()
	window := children / t.last.Sub(t.first).Seconds()
	measured := time.Duration(t.stepNanos / max(1, t.steps))
	fmt.Printf("%-13s %7d %10.0f %10.0f %9s %9s\n", w, n, float64(n*(keyedChildren+2))/el.Seconds(), float64(n)/el.Seconds(), "-", "-")
	fmt.Printf("%s: children %.0f steps/s over the run, %.0f/s over the children's window (step time %s, mean %.2f ms drawn, %.2f ms measured; queue poll %s, result poll %s, %d executor(s))\n",
		w, wall, window, f.stepTime, msOf(mean), msOf(measured), f.queuePoll, f.resultPoll, f.executors)
	if keyed {
		ideal := float64(f.keys*f.limit) / mean.Seconds()
		byKey := make([]string, len(t.maxByKey))
		for i, m := range t.maxByKey {
			byKey[i] = strconv.Itoa(m)
		}
		verdict := "within the limit"
		if slices.Max(t.maxByKey) > f.limit {
			verdict = "OVER THE LIMIT"
		}
		fmt.Printf("%s: limit-bound ideal %.0f/s (%d keys × %d ÷ %.2f ms): %.2f of it over the run, %.2f over the window\n",
			w, ideal, f.keys, f.limit, msOf(mean), wall/ideal, window/ideal)
		fmt.Printf("%s: most running at once: %d of one key, limit %d, %s (by key %s); %d of all keys (%d slots); longest gap between two children's starts %.0f ms\n",
			w, slices.Max(t.maxByKey), f.limit, verdict, strings.Join(byKey, " "), t.maxTotal, f.keys*f.limit, msOf(t.longestGap))
	} else {
		fmt.Printf("%s: at most %d running at once; longest gap between two children's starts %.0f ms\n", w, t.maxTotal, msOf(t.longestGap))
	}
	l := logs.snapshot()
	fmt.Printf("%s: DBOS log: %d warnings, %d errors; server deadlocks %d\n", w, l.warnings-logs0.warnings, l.errors-logs0.errors, serverDeadlocks(url)-dl0)
	if keyed && slices.Max(t.maxByKey) > f.limit {
		return fmt.Errorf("%d workflows of one partition ran at once, over its limit of %d", slices.Max(t.maxByKey), f.limit)
	}
	return nil
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// serverDeadlocks is the deadlocks the server counted in the database (-1
// when it cannot be read).
func serverDeadlocks(url string) int64 {
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		return -1
	}
	defer conn.Close(context.Background())
	var n int64
	if err := conn.QueryRow(context.Background(), "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		return -1
	}
	return n
}

// logCounts is a slog handler counting DBOS's warnings and errors.
type logCounts struct {
	mu               sync.Mutex
	warnings, errors int64
}

type logSnapshot struct{ warnings, errors int64 }

func (c *logCounts) snapshot() logSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return logSnapshot{c.warnings, c.errors}
}

func (c *logCounts) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (c *logCounts) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Level >= slog.LevelError {
		c.errors++
	} else {
		c.warnings++
	}
	return nil
}

func (c *logCounts) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCounts) WithGroup(string) slog.Handler      { return c }
