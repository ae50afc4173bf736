package wharf_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
)

// fetches is how many fetches the relay has made.
func fetches(c *wharf.Client) uint64 {
	counts, _ := c.Metrics().FetchRows.Snapshot()
	return counts[len(counts)-1]
}

// A relay that keeps up with a stream of small commits waits FetchInterval
// from one fetch's start to the next instead of fetching back to back
// (hundreds of fetches a second, each of a few rows).
func TestRelayThatKeepsUpWaitsFetchInterval(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	const interval = 200 * time.Millisecond
	client, rec := recordingClient(t, b, func(cfg *wharf.Config) {
		cfg.FetchInterval, cfg.PollInterval = interval, time.Second
	})
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })

	// Wait until the relay holds its lanes and has fetched once.
	require.Eventually(t, func() bool { return fetches(client) > 0 }, time.Minute, 10*time.Millisecond)
	const window = 2 * time.Second
	before := fetches(client)
	// Four producers committing one message per transaction, over every
	// lane: rows are there whenever the relay looks, and no lane gets
	// more in an interval than its share of a fetch (which would make the
	// relay behind, and right to read again at once).
	var mu sync.Mutex
	var ids []string
	g, gctx := errgroup.WithContext(ctx)
	for p := range 4 {
		g.Go(func() error {
			for i, start := 0, time.Now(); time.Since(start) < window; i++ {
				got, err := client.Enqueue(gctx, wharf.Message{Topic: "t", Key: fmt.Sprintf("k%d-%d", p, i%250), Payload: []byte("x")})
				if err != nil {
					return err
				}
				mu.Lock()
				ids = append(ids, got...)
				mu.Unlock()
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	n := fetches(client) - before
	// One fetch per 200ms is 10 in the window; twice that leaves room for
	// the lease loop's wake-ups and the window's edges. Back to back it was
	// hundreds.
	require.LessOrEqual(t, n, 2*uint64(window/interval), "fetches in %s with FetchInterval %s", window, interval)
	t.Logf("%d fetches in %s, %d messages", n, window, len(ids))
	requireAllDelivered(t, rec, ids)
}

// A relay that is behind fetches again as soon as a fetch returns, whatever
// FetchInterval says: a backlog of 6,000 messages read 64 rows at a time
// (about a hundred fetches) drains in seconds with a 2 s interval, where
// pacing every fetch would take minutes.
func TestRelayThatIsBehindFetchesBackToBack(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	ids := enqueueKeyed(t, b, 6000, 500)
	client, rec := recordingClient(t, b, func(cfg *wharf.Config) {
		cfg.FetchBatch, cfg.MaxBuffered = 64, 64
		cfg.FetchInterval, cfg.PollInterval = 2*time.Second, 2*time.Second
	})
	dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, client.Drain(dctx), "a drain paced at 2 s per fetch would need about 200 s")
	took := time.Since(start)
	require.GreaterOrEqual(t, fetches(client), uint64(6000/64), "the drain read the backlog in FetchBatch-sized fetches")
	requireAllDelivered(t, rec, ids)
	t.Logf("drained 6000 messages in %d fetches, %s", fetches(client), took.Round(time.Millisecond))
}

// FetchInterval longer than PollInterval is refused: the idle poll's backoff
// starts from it. Left unset, it is 5ms, or PollInterval when that is
// shorter (a configuration with a 2ms poll keeps working).
func TestFetchIntervalAbovePollIntervalIsRefused(t *testing.T) {
	t.Parallel()
	_, err := wharf.NewClient(nil, &wharf.Config{FetchInterval: time.Second, PollInterval: 100 * time.Millisecond})
	require.ErrorContains(t, err, "Config.FetchInterval (1s) must not be longer than Config.PollInterval (100ms)")
	_, err = wharf.NewClient(nil, &wharf.Config{FetchInterval: -time.Millisecond})
	require.ErrorContains(t, err, "Config.FetchInterval must not be negative")
	_, err = wharf.NewClient(nil, &wharf.Config{PollInterval: 2 * time.Millisecond})
	require.NoError(t, err, "an unset FetchInterval follows a short PollInterval")
}
