package wharfflow_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

type poisonState struct {
	Poison string `json:"poison"` // "", "state" (a NUL in the state) or "key" (a NUL in an emitted message's key)
	Note   string `json:"note"`
}

// holdRow makes the runner's next outcome write wait: it locks the row of
// a running instance (the blocker's) and returns the function that
// releases it, once the write is seen waiting for the lock.
func holdRow(t *testing.T, b *testBundle, id int64) (waitBlocked func(), unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+b.schema+".flow_instances WHERE id = $1 FOR UPDATE", id)
	require.NoError(t, err)
	waitBlocked = func() {
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND strpos(query, $1 || '.complete_flow_steps') > 0 AND datname = current_database()`, b.schema).Scan(&n))
			return n > 0
		}, 30*time.Second, 5*time.Millisecond, "the outcome write never waited for the held row")
	}
	unlock = func() { _ = tx.Rollback(ctx) }
	t.Cleanup(unlock)
	return waitBlocked, unlock
}

// H1. One outcome the database cannot take (a state holding a NUL
// character, which jsonb rejects as \u0000; or an emitted message whose Key
// holds a NUL, which EnqueueTx rejects) fails the whole batch it is written
// in: Runner.write retries the batch as is, gives up, and every step of the
// batch "runs again after its lease". Its batch-mates' steps are executed a
// second time (double side effects), and the poisoned instance itself never
// fails: it runs again after each lease, for ever, poisoning each batch it
// lands in.
//
// The test holds the runner's first write (the blocker's) on a row lock so
// that 20 innocent instances and one poisoned one finish meanwhile and are
// written in one batch. Fixed: the runner refuses, when it builds the
// outcome, what the database would refuse (state, key), and a batch the
// database refuses all the same (here a CHECK constraint on the state) is
// written in halves down to the one refused outcome: each innocent step
// runs once, and the poisoned instance ran once and failed with the reason.
func TestPoisonedOutcomeFailsItsInstanceAlone(t *testing.T) {
	for poison, reason := range map[string]string{
		"state":    "the step's state cannot be saved: it holds a NUL character",
		"key":      "Emit: message 0: Key holds a NUL character",
		"database": `violates check constraint "no_refused_note"`,
	} {
		t.Run(poison, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var mu sync.Mutex
			runs := map[int64]int{}
			var ran atomic.Int32
			blockerStarted, blockerGo := make(chan struct{}, 1), make(chan struct{})
			f := wharfflow.New[poisonState]("poison", &wharfflow.FlowConfig{MaxAttempts: 2}).
				Step("a", func(ctx context.Context, s *poisonState, in wharfflow.Input) wharfflow.Outcome {
					if s.Poison == "blocker" {
						blockerStarted <- struct{}{}
						<-blockerGo
						return wharfflow.Done(nil)
					}
					mu.Lock()
					runs[in.Instance]++
					mu.Unlock()
					ran.Add(1)
					o := wharfflow.Done(nil)
					switch s.Poison {
					case "state":
						s.Note = "a NUL \x00 in user data"
					case "key":
						o = o.Emit(wharf.Message{Topic: "t", Key: "k\x00", Payload: []byte("x")})
					case "database":
						s.Note = "refused"
					}
					return o
				})
			_, err := b.pool.Exec(ctx, "ALTER TABLE "+b.schema+".flow_instances ADD CONSTRAINT no_refused_note CHECK (state->>'note' IS DISTINCT FROM 'refused')")
			require.NoError(t, err)
			b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, MaxInFlight: 64, LeaseTTL: time.Second})

			blocker, err := b.client.Start(ctx, f.Start(poisonState{Poison: "blocker"}, wharfflow.StartOptions{}))
			require.NoError(t, err)
			<-blockerStarted
			waitBlocked, unlock := holdRow(t, b, blocker[0])
			close(blockerGo)
			waitBlocked()

			starts := []wharfflow.Start{f.Start(poisonState{Poison: poison}, wharfflow.StartOptions{})}
			for range 20 {
				starts = append(starts, f.Start(poisonState{}, wharfflow.StartOptions{}))
			}
			ids, err := b.client.Start(ctx, starts...)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return ran.Load() >= 21 }, 30*time.Second, 5*time.Millisecond)
			unlock() // the next write holds all 21 outcomes

			for _, id := range ids[1:] {
				b.waitStatus(t, id, "done")
			}
			mu.Lock()
			twice := 0
			for _, id := range ids[1:] {
				if runs[id] > 1 {
					twice++
				}
			}
			bad := runs[ids[0]]
			mu.Unlock()
			assert.Zero(t, twice, "innocent instances whose step ran more than once (batched with the poisoned outcome)")
			assert.Eventually(t, func() bool { return b.status(t, ids[0]) == "failed" }, time.Minute, 20*time.Millisecond,
				"the poisoned instance never failed: status %s after %d runs", b.status(t, ids[0]), bad)
			d, err := b.client.Get(ctx, ids[0])
			require.NoError(t, err)
			require.Contains(t, d.Error, reason)
			require.Equal(t, []string{"a/0/fail"}, b.history(t, ids[0]))
			mu.Lock()
			require.Equal(t, 1, runs[ids[0]], "the poisoned step ran once")
			mu.Unlock()
			mu.Lock()
			t.Logf("poisoned instance ran %d times; innocent steps ran more than once: %d of 20", runs[ids[0]], twice)
			mu.Unlock()
		})
	}
}
