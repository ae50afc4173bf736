package observe

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfprom"
)

// BenchmarkDrainScraped measures what serving metrics costs the relay: the
// drain rate of a pre-filled outbox into the null sink with the wharfprom
// handler scraped every second, against the same drain without it. Each
// iteration is a pair of drains, one of each, in alternating order (off-on,
// on-off, ...) so that a drift of this shared machine's speed falls on both
// alike. It reports both rates over all drains and the cost in percent of
// the unscraped rate: over the totals, and the median of the pairs' costs,
// which one disturbed drain cannot move:
//
//	go test -run '^$' -bench DrainScraped -benchtime 10x ./internal/e2e/observe/
//
// WHARF_BENCH_MESSAGES sets the messages per drain (200000 by default, about
// a second here, with two scrapes; 1000000 makes each drain span several).
func BenchmarkDrainScraped(b *testing.B) {
	n := 200_000
	if s := os.Getenv("WHARF_BENCH_MESSAGES"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(b, err, "WHARF_BENCH_MESSAGES must be a number")
		n = v
	}
	var off, on time.Duration
	var costs []float64
	for i := range b.N {
		var a, c time.Duration // unscraped, scraped
		if i%2 == 0 {
			a = drainOnce(b, n, false)
			c = drainOnce(b, n, true)
		} else {
			c = drainOnce(b, n, true)
			a = drainOnce(b, n, false)
		}
		off += a
		on += c
		costs = append(costs, 100*(1-a.Seconds()/c.Seconds()))
	}
	offRate := float64(n*b.N) / off.Seconds()
	onRate := float64(n*b.N) / on.Seconds()
	slices.Sort(costs)
	b.ReportMetric(offRate, "msgs/s-unscraped")
	b.ReportMetric(onRate, "msgs/s-scraped")
	b.ReportMetric(100*(1-onRate/offRate), "%cost-total")
	b.ReportMetric(costs[len(costs)/2], "%cost-median")
}

// drainOnce pre-fills a fresh outbox with n messages (10 per key) and
// returns how long a relay took to drain it.
func drainOnce(b *testing.B, n int, scraped bool) time.Duration {
	ctx := context.Background()
	pool, schema, drop := migratedDrop(b, databaseURL, 8)
	defer drop()
	payload := []byte(`{"order":"` + strings.Repeat("x", 180) + `"}`)
	i := 0
	copied, err := pool.CopyFrom(ctx, pgx.Identifier{schema, "outbox"}, []string{"topic", "key", "payload"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= n {
				return nil, nil
			}
			i++
			return []any{"bench", strconv.Itoa(i % (n / 10)), payload}, nil
		}))
	require.NoError(b, err)
	require.Equal(b, int64(n), copied)
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+schema+".outbox")
	require.NoError(b, err)

	sink, err := sinkurl.Open(ctx, "null:")
	require.NoError(b, err)
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Sink: sink, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	scrapes := 0
	if scraped {
		base := "http://" + serve(b, wharfprom.Handler(client))
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				// Scrape at once, then every second, as Prometheus does.
				if code, _, err := tryGet(base + "/metrics"); err != nil || code != 200 {
					b.Errorf("scrape: %d %v", code, err)
					return
				}
				scrapes++
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	start := time.Now()
	require.NoError(b, client.Drain(ctx))
	took := time.Since(start)
	close(stop)
	wg.Wait()
	require.Equal(b, int64(n), client.Metrics().Delivered.Load())
	b.Logf("scraped=%v: %d messages in %s (%.0f msgs/s, %d scrapes)", scraped, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), scrapes)
	return took
}
