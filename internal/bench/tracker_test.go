package bench

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// walSeqs are the seqs of calls enqueue calls of n messages each, spaced
// like a WAL outbox's: call i's messages end at a WAL position gap bytes
// after call i-1's (walmsg.FirstSeq).
func walSeqs(calls, n int, gap int64) [][]int64 {
	out := make([][]int64, calls)
	end := int64(0x1000000)
	for i := range out {
		end += gap
		seqs := make([]int64, n)
		for j := range seqs {
			seqs[j] = end - int64(n) + int64(j)
		}
		out[i] = seqs
	}
	return out
}

func TestSparseTracker(t *testing.T) {
	start := time.Now()
	tr := newSparseTracker(start, 0)
	calls := walSeqs(3, 2, 5000)
	a, b, c := calls[0], calls[1], calls[2]

	// Registered before the Commit, committed, then acknowledged.
	tr.enqueued(a)
	tr.committed(a, start.Add(10*time.Millisecond))
	tr.ackedIDs(a, start.Add(30*time.Millisecond))
	// Acknowledged before the producer recorded its Commit: zero latency.
	tr.enqueued(b)
	tr.ackedIDs(b, start.Add(31*time.Millisecond))
	require.Equal(t, 2, tr.inFlight(), "acknowledged, commit not recorded yet")
	tr.committed(b, start.Add(40*time.Millisecond))
	require.Zero(t, tr.inFlight())

	// Redeliveries: of finished messages, and of one acknowledged before
	// its commit was recorded.
	tr.enqueued(c)
	tr.ackedIDs(c[:1], start.Add(41*time.Millisecond))
	tr.ackedIDs(c[:1], start.Add(42*time.Millisecond))
	tr.ackedIDs([]int64{a[0], b[1]}, start.Add(50*time.Millisecond))
	require.EqualValues(t, 5, tr.acked.Load())
	lat, dups := tr.summary()
	require.EqualValues(t, 3, dups)
	require.EqualValues(t, 4, lat.Count)
	require.InDelta(t, 20, lat.Max, 0.5)

	// A rolled-back transaction's registrations are forgotten.
	tr.forget(c[1:])
	tr.committed(c[:1], start.Add(60*time.Millisecond))
	require.Zero(t, tr.inFlight())
	require.EqualValues(t, 5, tr.acked.Load())
}

// A long run's memory is bounded by the messages in flight, and a backlog
// that was worked off gives its memory back.
func TestSparseTrackerFreesMemory(t *testing.T) {
	start := time.Now()
	tr := newSparseTracker(start, 0)
	// 1M messages in calls of 100, 20 kB of WAL apart, acknowledged 50
	// calls behind the producers: never more than 5,100 in flight.
	calls := 10000
	lag := 50
	for i, seqs := range walSeqs(calls, 100, 20000) {
		tr.enqueued(seqs)
		tr.committed(seqs, start.Add(time.Duration(i)*time.Microsecond))
		if i >= lag {
			tr.ackedIDs(walSeqs(1, 100, int64(i-lag+1)*20000)[0], start.Add(time.Duration(i)*time.Microsecond+time.Millisecond))
		}
		require.LessOrEqual(t, tr.inFlight(), (lag+1)*100)
	}
	require.EqualValues(t, (calls-lag)*100, tr.acked.Load())
	lat, dups := tr.summary()
	require.Zero(t, dups)
	require.EqualValues(t, (calls-lag)*100, lat.Count)

	// A backlog of 500,000 messages, then worked off.
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	tr = newSparseTracker(start, 0)
	seqs := walSeqs(5000, 100, 20000)
	before := heap()
	for _, s := range seqs {
		tr.enqueued(s)
		tr.committed(s, start)
	}
	full := heap()
	require.Greater(t, full, before+8<<20, "500,000 entries take some memory")
	for _, s := range seqs {
		tr.ackedIDs(s, start.Add(time.Millisecond))
	}
	require.Zero(t, tr.inFlight())
	require.Less(t, heap(), before+2<<20, "the map was rebuilt once emptied")
	runtime.KeepAlive(tr)
}

// The dense layout holds WAL seqs in chunks it never frees (what the sparse
// one is for); table seqs it frees once a chunk is done.
func TestDenseTrackerChunks(t *testing.T) {
	start := time.Now()
	tr := newTracker(start, 0)
	for _, s := range walSeqs(100, 100, 1<<chunkBits) {
		tr.committed(s, start)
		tr.ackedIDs(s, start)
	}
	require.Len(t, tr.chunks, 100, "a chunk per call: none complete")
	tr.enqueued([]int64{1}) // a no-op in the dense layout
	tr.forget([]int64{1})
	require.Zero(t, tr.inFlight())
}

func benchmarkTracker(b *testing.B, tr *tracker, seqs [][]int64) {
	start := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	msgs := 0
	for i := range b.N {
		s := seqs[i%len(seqs)]
		if i > 0 && i%len(seqs) == 0 {
			// Next round: fresh seqs past the last ones.
			b.StopTimer()
			off := seqs[len(seqs)-1][0] + 1<<30
			for _, c := range seqs {
				for j := range c {
					c[j] += off
				}
			}
			b.StartTimer()
		}
		tr.enqueued(s)
		tr.committed(s, start)
		tr.ackedIDs(s, start)
		msgs += len(s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(msgs), "ns/msg")
}

// BenchmarkTracker times one enqueue call of 100 messages through each
// layout: registered (sparse only), committed, acknowledged.
func BenchmarkTracker(b *testing.B) {
	b.Run("dense", func(b *testing.B) {
		seqs := make([][]int64, 1000)
		for i := range seqs {
			seqs[i] = make([]int64, 100)
			for j := range seqs[i] {
				seqs[i][j] = int64(100*i + j + 1)
			}
		}
		benchmarkTracker(b, newTracker(time.Now(), 0), seqs)
	})
	b.Run("sparse", func(b *testing.B) {
		benchmarkTracker(b, newSparseTracker(time.Now(), 0), walSeqs(1000, 100, 20000))
	})
}
