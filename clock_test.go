package wharf_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A relay whose clock is an hour ahead of or behind the database's delivers a
// scheduled message when the database's clock reaches its deliver_at, waits a
// retry's backoff by the database's clock (and stores its next attempt in
// it), and keeps its leases: every time it compares with a database time goes
// through the offset it measures on each read, and leases run on durations.
func TestSkewedRelayClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			b := setupDB(t)
			ctx := context.Background()
			cfg := testConfig(b.schema)
			cfg.RelayID = "skewed"
			wharf.SetClock(cfg, func() time.Time { return time.Now().Add(skew) })
			var mu sync.Mutex
			got := map[string][]time.Time{} // key -> attempts, on the test's (the database's) clock
			cfg.Handler = func(_ context.Context, m *wharf.Message) error {
				mu.Lock()
				defer mu.Unlock()
				got[m.Key] = append(got[m.Key], time.Now())
				if m.Key == "retry" && len(got[m.Key]) == 1 {
					return wharf.RetryAfter(1500*time.Millisecond, errors.New("try again later"))
				}
				return nil
			}
			client, err := wharf.NewClient(b.pool, cfg)
			require.NoError(t, err)
			at := time.Now().Add(2 * time.Second)
			_, err = client.Enqueue(ctx,
				wharf.Message{Topic: "t", Key: "sched", Payload: []byte(`1`), DeliverAt: at},
				wharf.Message{Topic: "t", Key: "retry", Payload: []byte(`2`)},
				wharf.Message{Topic: "t", Key: "plain", Payload: []byte(`3`)})
			require.NoError(t, err)
			require.NoError(t, client.Start(ctx))
			defer func() { require.NoError(t, client.Stop(ctx)) }()

			// While the retry waits, its next attempt is stored on the
			// database's clock.
			var next time.Time
			require.Eventually(t, func() bool {
				err := b.pool.QueryRow(ctx, "SELECT next_attempt_at FROM "+b.schema+".retries").Scan(&next)
				return err == nil
			}, time.Minute, 10*time.Millisecond, "no retry record was written")
			// The skew is an hour: minutes of slack keep the check about the
			// clock, not about how fast a loaded machine runs.
			const late = 10 * time.Minute
			require.WithinDuration(t, time.Now(), next, late, "next_attempt_at is not on the database's clock")

			require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, got["plain"], 1)
			require.Len(t, got["sched"], 1)
			require.Len(t, got["retry"], 2)
			const slack = 100 * time.Millisecond // the offset is measured to half a round trip
			require.False(t, got["sched"][0].Before(at.Add(-slack)), "scheduled message delivered %s before its deliver_at", at.Sub(got["sched"][0]))
			require.Less(t, got["sched"][0].Sub(at), late, "scheduled message delivered late")
			wait := got["retry"][1].Sub(got["retry"][0])
			require.GreaterOrEqual(t, wait, 1500*time.Millisecond-slack, "retried before its backoff")
			require.Less(t, wait, late, "retried late")

			// A loaded machine may delay a renewal past the lease; the relay
			// then claims its lanes again, on durations, whatever its clock.
			require.Eventually(t, func() bool { return leasedLanes(t, b, cfg.RelayID) == 64 }, time.Minute, 20*time.Millisecond,
				"the relay does not hold its leases")
		})
	}
}
