package wharf_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// BenchmarkRelayDrain drains a backlog (WHARF_BENCH_MESSAGES, default
// 200,000 messages of 200 bytes over 1,000 keys, committed 100 per
// transaction) with one relay into a handler that only counts, from the
// outbox table and from the WAL, on the same cluster (wal_level=logical) in
// the same run. It reports messages per second from the relay's start to
// the last delivery, the time to the first delivery (registration and
// the first lease round), the peak of the process's live heap objects and
// of what the WAL store counts as held (sampled every 10 ms); b.N is
// ignored (run it with -benchtime 1x).
func BenchmarkRelayDrain(b *testing.B) {
	n := 200_000
	if v := os.Getenv("WHARF_BENCH_MESSAGES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
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
			for i := 0; i < n; i += 100 {
				msgs := make([]wharf.Message, min(100, n-i))
				for j := range msgs {
					msgs[j] = wharf.Message{Topic: "bench", Key: fmt.Sprintf("k%d", (i+j)%1000), Payload: payload}
				}
				_, err := c.Enqueue(ctx, msgs...)
				require.NoError(b, err)
			}
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
					metrics.Read(sample)
					peakHeap = max(peakHeap, sample[0].Value.Uint64())
					peakHeld = max(peakHeld, uint64(relay.Metrics().WALHeldBytes.Load()))
				case <-time.After(10 * time.Minute):
					b.Fatalf("%d of %d delivered", got.Load(), n)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			require.NoError(b, relay.Stop(ctx))
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msg/s")
			b.ReportMetric(float64(time.Unix(0, first.Load()).Sub(start).Milliseconds()), "ms-to-first")
			b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(peakHeld)/(1<<20), "peak-held-MiB")
			b.ReportMetric(0, "ns/op")
		})
	}
}
