package bench

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// histogram counts latencies in microseconds in log-linear buckets: exact
// below 256 µs, then 128 buckets per power of two (under 1 % error), so
// percentiles cost a fixed 32 KB whatever the message count.
type histogram struct {
	counts []uint64
	n      uint64
	max    uint64 // exact, µs
}

const (
	subBits    = 7
	subBuckets = 1 << subBits
	maxBucket  = 4096 // clamps latencies above about 2^31 µs (35 minutes)
)

func newHistogram() *histogram { return &histogram{counts: make([]uint64, maxBucket)} }

func bucketOf(us uint64) int {
	if us < 2*subBuckets {
		return int(us)
	}
	e := bits.Len64(us) - (subBits + 1)
	return min(maxBucket-1, e*subBuckets+int(us>>e))
}

// bucketValue is the middle of bucket b, in µs.
func bucketValue(b int) uint64 {
	if b < 2*subBuckets {
		return uint64(b)
	}
	e := b/subBuckets - 1
	m := uint64(b - e*subBuckets)
	return m<<e + (uint64(1)<<e)/2
}

func (h *histogram) add(d time.Duration) {
	us := uint64(max(0, d.Microseconds()))
	h.counts[bucketOf(us)]++
	h.n++
	h.max = max(h.max, us)
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	if o == nil {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the latency below which a fraction q of the samples lie,
// in milliseconds (0 when empty).
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return float64(h.max) / 1000
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			return float64(min(bucketValue(b), h.max)) / 1000
		}
	}
	return float64(h.max) / 1000
}

// latency summarises h; nil when it holds no samples.
func (h *histogram) latency() *Latency {
	if h.n == 0 {
		return nil
	}
	return &Latency{P50: h.quantile(0.50), P95: h.quantile(0.95), P99: h.quantile(0.99), Max: h.quantile(1), Count: int64(h.n)}
}

// tracker matches commit times (recorded by the producers) with ack times
// (recorded by the probe sink) by message id. Ids come from an identity
// column, so they are dense: slots live in chunks of 65,536 ids, and a chunk
// whose every id was both committed and acknowledged is freed, which bounds
// memory by the id span of the backlog rather than by the run's length.
type tracker struct {
	start  time.Time
	warmup time.Duration

	mu       sync.Mutex
	chunks   map[int64]*chunk
	freed    map[int64]bool
	total    *histogram // acknowledged after the warm-up
	interval *histogram // since the last sample
	dups     int64

	// windowEnd, when set, ends the measurement window (after the warm-up):
	// the latencies acknowledged inside it are also kept per second of
	// acknowledgement, as each second's p99 (perSecond), for a verdict
	// that one stall cannot decide.
	windowEnd time.Duration
	secIdx    int64
	sec       *histogram
	perSecond []float64

	acked atomic.Int64 // distinct ids acknowledged
}

const chunkBits = 16

// Slot states: 0 nothing seen; > 0 committed at (value-1) ns after start;
// < 0 (but not doneSlot) acknowledged at (-value-1) ns before the producer
// recorded the commit; doneSlot both seen.
const doneSlot = math.MinInt64

type chunk struct {
	slots [1 << chunkBits]int64
	done  int
}

func newTracker(start time.Time, warmup time.Duration) *tracker {
	return &tracker{start: start, warmup: warmup, chunks: map[int64]*chunk{}, freed: map[int64]bool{},
		total: newHistogram(), interval: newHistogram()}
}

// slot returns id's slot, or nil when its chunk was already freed.
func (t *tracker) slot(id int64) (*chunk, *int64) {
	ci := id >> chunkBits
	c := t.chunks[ci]
	if c == nil {
		if t.freed[ci] {
			return nil, nil
		}
		c = &chunk{}
		t.chunks[ci] = c
	}
	return c, &c.slots[id&(1<<chunkBits-1)]
}

func (t *tracker) finish(c *chunk, id int64, s *int64, commitNs, ackNs int64) {
	*s = doneSlot
	// The relay can acknowledge before the producer's Commit call returned:
	// that counts as zero latency.
	lat := time.Duration(max(0, ackNs-commitNs))
	if time.Duration(ackNs) >= t.warmup {
		t.total.add(lat)
		if time.Duration(ackNs) < t.windowEnd {
			t.addSecond(time.Duration(ackNs)-t.warmup, lat)
		}
	}
	t.interval.add(lat)
	c.done++
	if c.done == len(c.slots) {
		ci := id >> chunkBits
		delete(t.chunks, ci)
		t.freed[ci] = true
	}
}

// committed records that ids committed at time at.
func (t *tracker) committed(ids []int64, at time.Time) {
	ns := int64(at.Sub(t.start))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		c, s := t.slot(id)
		switch {
		case s == nil || *s == doneSlot || *s > 0:
		case *s == 0:
			*s = ns + 1
		default: // acknowledged first
			t.finish(c, id, s, ns, -*s-1)
		}
	}
}

// ackedIDs records that ids were acknowledged at time at.
func (t *tracker) ackedIDs(ids []int64, at time.Time) {
	ns := int64(at.Sub(t.start))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		c, s := t.slot(id)
		switch {
		case s == nil || *s < 0: // redelivery (doneSlot is negative too)
			t.dups++
		case *s == 0:
			*s = -(ns + 1)
			t.acked.Add(1)
		default:
			t.acked.Add(1)
			t.finish(c, id, s, *s-1, ns)
		}
	}
}

// takeInterval returns the latencies recorded since the previous call.
func (t *tracker) takeInterval() *histogram {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.interval
	t.interval = newHistogram()
	return h
}

// addSecond adds lat, acknowledged at sinceWarmup into the window, to its
// second's histogram, closing the previous second first.
func (t *tracker) addSecond(sinceWarmup, lat time.Duration) {
	i := int64(sinceWarmup / time.Second)
	if t.sec == nil {
		t.sec, t.secIdx = newHistogram(), i
	}
	if i > t.secIdx { // acknowledgements arrive in time order, give or take a lock wait
		t.closeSecond()
		t.secIdx = i
	}
	t.sec.add(lat)
}

func (t *tracker) closeSecond() {
	if t.sec != nil && t.sec.n > 0 {
		t.perSecond = append(t.perSecond, t.sec.quantile(0.99))
		clear(t.sec.counts)
		t.sec.n, t.sec.max = 0, 0
	}
}

func (t *tracker) summary() (*Latency, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.total.latency()
	if l != nil && t.windowEnd > 0 {
		t.closeSecond()
		l.P99PerSecond = median(t.perSecond)
		l.Seconds = len(t.perSecond)
	}
	return l, t.dups
}

// median of xs (0 when empty); xs is sorted in place.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}
