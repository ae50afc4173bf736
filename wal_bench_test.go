package wharf_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/procstat"
)

// BenchmarkRelayDrain drains a backlog (WHARF_BENCH_MESSAGES, default
// 200,000 messages of 200 bytes over 1,000 keys, committed
// WHARF_BENCH_PER_TX, default 100, per transaction: 1 is an application
// that sends one event per business transaction) with one relay into a
// handler that only counts, from the outbox table and from the WAL, on the
// same cluster (wal_level=logical) in the same run. It reports messages per
// second from the relay's start to the last delivery, the time to the first
// delivery (registration and the first lease round), the CPU this process
// and the outbox's backends (the walsender in WAL mode) used over the relay
// phase per message, the peak of the process's live heap objects and of
// what the WAL store counts as held (sampled every 10 ms), and the bytes
// and allocations of the relay phase per message; b.N is ignored
// (run it with -benchtime 1x). WHARF_BENCH_CPUPROFILE=path writes a CPU
// profile of the relay phase alone to path.table and path.wal.
func BenchmarkRelayDrain(b *testing.B) {
	n := 200_000
	if v := os.Getenv("WHARF_BENCH_MESSAGES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	perTx := 100
	if v := os.Getenv("WHARF_BENCH_PER_TX"); v != "" {
		var err error
		perTx, err = strconv.Atoi(v)
		require.NoError(b, err)
		require.Positive(b, perTx, "WHARF_BENCH_PER_TX")
	}
	wharf.CheckInvariants(false)
	defer wharf.CheckInvariants(true)
	for _, mode := range []string{"table", "wal"} {
		b.Run(mode, func(b *testing.B) {
			bundle := logicalDB(b)
			if mode == "wal" {
				bundle = walDB(b)
			}
			ctx := context.Background()
			c, err := wharf.NewClient(bundle.pool, &wharf.Config{Schema: bundle.schema})
			require.NoError(b, err)
			payload := make([]byte, 200)
			// Four producers, each transaction with synchronous_commit
			// off (the pre-fill is not measured).
			var fill errgroup.Group
			for p := range 4 {
				fill.Go(func() error {
					for i := p * perTx; i < n; i += 4 * perTx {
						msgs := make([]wharf.Message, min(perTx, n-i))
						for j := range msgs {
							msgs[j] = wharf.Message{Topic: "bench", Key: fmt.Sprintf("k%d", (i+j)%1000), Payload: payload}
						}
						err := pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
							if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
								return err
							}
							_, err := c.EnqueueTx(ctx, tx, msgs...)
							return err
						})
						if err != nil {
							return err
						}
					}
					return nil
				})
			}
			require.NoError(b, fill.Wait())
			if mode == "table" {
				_, err := bundle.pool.Exec(ctx, "VACUUM ANALYZE "+bundle.schema+".outbox")
				require.NoError(b, err)
			}
			var got, first atomic.Int64
			done := make(chan struct{})
			cfg := &wharf.Config{Schema: bundle.schema, Logger: testLogger(), Handler: func(context.Context, *wharf.Message) error {
				first.CompareAndSwap(0, time.Now().UnixNano())
				if got.Add(1) == int64(n) {
					close(done)
				}
				return nil
			}}
			relay, err := wharf.NewClient(bundle.pool, cfg)
			require.NoError(b, err)
			runtime.GC()
			b.ResetTimer()
			if path := os.Getenv("WHARF_BENCH_CPUPROFILE"); path != "" {
				// The relay phase only, one file per layout.
				f, err := os.Create(path + "." + mode)
				require.NoError(b, err)
				require.NoError(b, pprof.StartCPUProfile(f))
				defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
			}
			backends := map[int]time.Duration{} // the outbox's backends' CPU, by pid, when the relay started
			noteBackends(ctx, b, bundle, backends, true)
			cpu0 := processCPU(b)
			var mem0, mem1 runtime.MemStats
			runtime.ReadMemStats(&mem0)
			start := time.Now()
			require.NoError(b, relay.Start(ctx))
			var peakHeap, peakHeld uint64
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		wait:
			for {
				select {
				case <-done:
					break wait
				case <-tick.C:
					noteBackends(ctx, b, bundle, backends, false)
					metrics.Read(sample)
					peakHeap = max(peakHeap, sample[0].Value.Uint64())
					peakHeld = max(peakHeld, uint64(relay.Metrics().WALHeldBytes.Load()))
				case <-time.After(10 * time.Minute):
					b.Fatalf("%d of %d delivered", got.Load(), n)
				}
			}
			elapsed := time.Since(start)
			cpu := processCPU(b) - cpu0
			runtime.ReadMemStats(&mem1)
			pprof.StopCPUProfile()
			var server time.Duration
			for pid, first := range backends {
				if now := backendCPU(pid); now > first { // 0 once it ended
					server += now - first
				}
			}
			b.StopTimer()
			require.NoError(b, relay.Stop(ctx))
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msg/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "relay-cpu-ns/msg")
			b.ReportMetric(float64(server.Nanoseconds())/float64(n), "backend-cpu-ns/msg")
			b.ReportMetric(float64(time.Unix(0, first.Load()).Sub(start).Milliseconds()), "ms-to-first")
			b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(peakHeld)/(1<<20), "peak-held-MiB")
			// What the relay phase allocated (the sampling above included),
			// per message: the GC's work, which the CPU figure hides in noise.
			b.ReportMetric(float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(n), "relay-B/msg")
			b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/float64(n), "relay-allocs/msg")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// processCPU is the user and system CPU this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// noteBackends records each backend of the bench's database that it sees
// for the first time (the walsender included: pg_stat_activity lists
// walsenders of logical slots with their database) with the CPU it had
// used before the relay started: none for one that started since, its
// CPU at the first sample for one that was there before (the pool's, the
// pre-fill's, the one asking). A backend that ends between two samples loses what it used
// since the last; the relay's stream and connections live through the
// drain.
func noteBackends(ctx context.Context, b *testing.B, bundle *testBundle, seen map[int]time.Duration, before bool) {
	rows, err := bundle.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type IN ('client backend', 'walsender')")
	require.NoError(b, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(b, err)
	for _, pid := range pids {
		if _, ok := seen[int(pid)]; !ok {
			seen[int(pid)] = 0
			if before {
				seen[int(pid)] = backendCPU(int(pid))
			}
		}
	}
}

// backendCPU is the CPU a process of this machine has used (0 when it has
// ended or runs elsewhere).
func backendCPU(pid int) time.Duration {
	used, _, _ := procstat.CPU(pid)
	return used
}
