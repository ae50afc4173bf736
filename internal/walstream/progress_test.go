package walstream

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProgressConfirmsOnlyASettledPrefix(t *testing.T) {
	var p Progress
	a, err := p.Add(100, time.Time{}, 2)
	require.NoError(t, err)
	b, err := p.Add(200, time.Time{}, 1)
	require.NoError(t, err)
	_, err = p.Add(300, time.Time{}, 0) // nothing of this outbox: settled at once, but behind b
	require.NoError(t, err)
	require.Equal(t, LSN(0), p.Confirmable())

	require.NoError(t, p.Settle(b))
	require.Equal(t, LSN(0), p.Confirmable(), "a later transaction settled first does not move past an earlier one")
	require.NoError(t, p.Settle(a))
	require.Equal(t, LSN(0), p.Confirmable(), "a has a message left")
	require.NoError(t, p.Settle(a))
	require.Equal(t, LSN(300), p.Confirmable(), "a, b and the empty one are settled")
	require.Equal(t, 0, p.Pending())

	_, err = p.Add(400, time.Time{}, 0)
	require.NoError(t, err)
	require.Equal(t, LSN(400), p.Confirmable(), "an empty transaction with nothing before it passes at once")
}

func TestProgressRefusesWhatCannotHappen(t *testing.T) {
	var p Progress
	a, err := p.Add(100, time.Time{}, 1)
	require.NoError(t, err)
	_, err = p.Add(100, time.Time{}, 1)
	require.ErrorContains(t, err, "must be added in stream order")
	_, err = p.Add(200, time.Time{}, -1)
	require.ErrorContains(t, err, "a transaction of -1 messages")
	require.ErrorContains(t, p.Settle(a+5), "not pending")
	require.NoError(t, p.Settle(a))
	require.ErrorContains(t, p.Settle(a), "not pending", "a passed transaction")
	b, err := p.Add(300, time.Time{}, 1)
	require.NoError(t, err)
	_, err = p.Add(400, time.Time{}, 2)
	require.NoError(t, err)
	require.NoError(t, p.Settle(b+1))
	require.NoError(t, p.Settle(b+1))
	require.ErrorContains(t, p.Settle(b+1), "settled more often than it has messages")
	_, err = p.Add(250, time.Time{}, 1)
	require.ErrorContains(t, err, "must be added in stream order")
}

// Against a model that rescans every transaction: random sizes, settles in a
// random order interleaved with adds.
func TestProgressAgreesWithAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 200 {
		var p Progress
		type mtx struct {
			end  LSN
			open int
		}
		var model []mtx
		var unsettled []Tx // one entry per unsettled message
		end := LSN(0)
		for step := 0; step < 300; step++ {
			if len(unsettled) == 0 || rng.IntN(3) == 0 {
				end += LSN(1 + rng.IntN(50))
				n := rng.IntN(4)
				tx, err := p.Add(end, time.Time{}, n)
				require.NoError(t, err)
				require.Equal(t, Tx(len(model)), tx)
				model = append(model, mtx{end, n})
				for range n {
					unsettled = append(unsettled, tx)
				}
			} else {
				i := rng.IntN(len(unsettled))
				tx := unsettled[i]
				unsettled = append(unsettled[:i], unsettled[i+1:]...)
				require.NoError(t, p.Settle(tx))
				model[tx].open--
			}
			want := LSN(0)
			for _, m := range model {
				if m.open > 0 {
					break
				}
				want = m.end
			}
			require.Equal(t, want, p.Confirmable(), "round %d step %d", round, step)
		}
	}
}

// Passing transactions one at a time in front of a long queue (a held
// message pinned the head while 100,000 more streamed in): amortized
// constant per transaction, not a copy of the queue each time.
//
//	go test -run '^$' -bench ProgressPass ./internal/walstream/
func BenchmarkProgressPassOneAtATime(b *testing.B) {
	const queue = 100_000
	for b.Loop() {
		var p Progress
		for i := range queue {
			if _, err := p.Add(LSN(i+1), time.Time{}, 1); err != nil {
				b.Fatal(err)
			}
		}
		for tx := range Tx(queue) {
			if err := p.Settle(tx); err != nil {
				b.Fatal(err)
			}
		}
		if p.Confirmable() != queue {
			b.Fatalf("confirmable %s", p.Confirmable())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*queue), "ns/tx")
}

// Oldest is the commit time of the oldest transaction holding an unsettled
// message: transactions settled, or with no message, do not count.
func TestProgressOldestUnsettledCommit(t *testing.T) {
	var p Progress
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.True(t, p.Oldest().IsZero())
	_, err := p.Add(100, t0, 0)
	require.NoError(t, err)
	require.True(t, p.Oldest().IsZero(), "a transaction without messages is settled")
	a, err := p.Add(200, t0.Add(time.Second), 1)
	require.NoError(t, err)
	b, err := p.Add(300, t0.Add(2*time.Second), 1)
	require.NoError(t, err)
	require.Equal(t, t0.Add(time.Second), p.Oldest())
	require.NoError(t, p.Settle(b))
	require.Equal(t, t0.Add(time.Second), p.Oldest(), "a is still open")
	require.NoError(t, p.Settle(a))
	require.True(t, p.Oldest().IsZero())
}
