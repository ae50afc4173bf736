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
// (recorded by the probe sink) by message seq. It has two layouts.
//
// Dense (newTracker), for a table outbox, whose seqs come from an identity
// column: slots live in chunks of 65,536 seqs, and a chunk whose every seq
// was both committed and acknowledged is freed, which bounds memory by the
// seq span of the backlog rather than by the run's length. An ack of a seq
// whose chunk was freed, or whose slot is done, is a redelivery.
//
// Sparse (newSparseTracker), for a WAL outbox, whose seqs are WAL positions
// (walmsg.FirstSeq): consecutive within one enqueue call, hundreds of bytes
// to kilobytes apart between calls, so dense chunks would hold a few used
// slots each and never be freed. The sparse layout keeps one map entry per
// message that is enqueued but not yet both committed and acknowledged, and
// deletes it when both are: its memory is bounded by the messages in flight
// (the producers' open transactions plus the backlog), whatever the run's
// length, and the map is rebuilt when it has shrunk to a fraction of its
// peak (Go maps keep their buckets). Redeliveries are recognised without
// remembering finished seqs because the producers register every seq
// (enqueued) after the enqueue statement returned and before their Commit:
// the relay cannot deliver a message before its transaction commits, so a
// first acknowledgement always finds the seq's entry, and an ack that finds
// none is of a finished message, a redelivery. Its limits: an ack of a seq
// this tracker was never told about (a message enqueued by someone else,
// or left over from before the tracker started) counts as a redelivery too,
// not as a delivery; a producer that records commits without registering
// first (committed alone) gets no redelivery detection for an ack that
// races ahead of its commit record (that ack is counted as a redelivery and
// the commit entry stays until the end); and a transaction that is rolled
// back after registering must call forget, or its entries stay.
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
	// perSecondAcks counts the messages acknowledged in each second of
	// the window, empty seconds included (for the worst second).
	perSecondAcks []int64

	acked atomic.Int64 // distinct ids acknowledged
	// backlogAcked counts the pre-filled messages (prefilled) among acked:
	// they have no commit time, so no latency, but count as processed
	// (and in perSecondAcks).
	backlogAcked atomic.Int64

	// sparse selects the sparse layout: pending holds the seqs enqueued
	// and not yet done, in the slot encoding below (0: registered only);
	// peak is its largest size since it was last rebuilt.
	sparse  bool
	pending map[int64]int64
	peak    int
}

const chunkBits = 16

// Slot states: 0 nothing seen; > 0 committed at (value-1) ns after start;
// < 0 (but not doneSlot) acknowledged at (-value-1) ns before the producer
// recorded the commit; doneSlot both seen.
const doneSlot = math.MinInt64

// prefillSlot marks a pre-filled message not acknowledged yet (--backlog):
// it was committed before the tracker started and has no commit time. No
// acknowledgement offset encodes to it.
const prefillSlot = math.MinInt64 + 1

type chunk struct {
	slots [1 << chunkBits]int64
	done  int
}

func newTracker(start time.Time, warmup time.Duration) *tracker {
	return &tracker{start: start, warmup: warmup, chunks: map[int64]*chunk{}, freed: map[int64]bool{},
		total: newHistogram(), interval: newHistogram()}
}

// newSparseTracker is a tracker for seqs that are not dense (a WAL
// outbox's): see tracker.
func newSparseTracker(start time.Time, warmup time.Duration) *tracker {
	return &tracker{start: start, warmup: warmup, sparse: true, pending: map[int64]int64{},
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
	// record's body, repeated: the dense path is the table outbox's hot
	// path, and the call costs it about 5 %.
	lat := time.Duration(max(0, ackNs-commitNs))
	if time.Duration(ackNs) >= t.warmup {
		t.total.add(lat)
		if time.Duration(ackNs) < t.windowEnd {
			t.addSecond(time.Duration(ackNs)-t.warmup, lat)
		}
	}
	t.interval.add(lat)
	t.slotDone(c, id, s)
}

// slotDone marks id's slot done and frees its chunk once every slot is.
func (t *tracker) slotDone(c *chunk, id int64, s *int64) {
	*s = doneSlot
	c.done++
	if c.done == len(c.slots) {
		ci := id >> chunkBits
		delete(t.chunks, ci)
		t.freed[ci] = true
	}
}

// record adds the latency of a message committed and acknowledged at these
// offsets from start.
func (t *tracker) record(commitNs, ackNs int64) {
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
}

// committed records that ids committed at time at.
func (t *tracker) committed(ids []int64, at time.Time) {
	ns := int64(at.Sub(t.start))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sparse {
		t.committedSparse(ids, ns)
		return
	}
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
	if t.sparse {
		t.ackedSparse(ids, ns)
		return
	}
	for _, id := range ids {
		c, s := t.slot(id)
		switch {
		case s != nil && *s == prefillSlot:
			t.backlogAck(ns)
			t.slotDone(c, id, s)
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

// settledIDs records that ids were worked off at time at without an
// acknowledgement (dead-lettered): they count as acknowledged for the
// backlog, and their latency is not recorded (one settled before the
// producer recorded its commit, which a retry schedule makes unlikely,
// records a latency of 0, as an ack before the commit does).
func (t *tracker) settledIDs(ids []int64, at time.Time) {
	ns := int64(at.Sub(t.start))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if t.sparse {
			v, ok := t.pending[id]
			if !ok {
				continue
			}
			if v < 0 { // acknowledged already
				continue
			}
			t.acked.Add(1)
			if v > 0 { // committed: done
				delete(t.pending, id)
			} else { // its commit is not recorded yet: as an ack before the commit
				t.pending[id] = -(ns + 1)
			}
			continue
		}
		c, s := t.slot(id)
		switch {
		case s == nil || *s < 0:
		case *s == 0:
			// Not committed yet as far as the producer recorded: the
			// commit finishes it, with no latency (ack before commit).
			*s = -(ns + 1)
			t.acked.Add(1)
		default:
			t.acked.Add(1)
			t.slotDone(c, id, s)
		}
	}
}

// prefilled registers seqs committed before the tracker started (the
// --backlog pre-fill): their first acknowledgement counts as processed, with
// no latency, and a later one as a redelivery. Call it before the relay
// starts.
func (t *tracker) prefilled(seqs []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range seqs {
		if t.sparse {
			t.pending[id] = prefillSlot
			continue
		}
		if _, s := t.slot(id); s != nil && *s == 0 {
			*s = prefillSlot
		}
	}
	t.peak = max(t.peak, len(t.pending))
}

// backlogAck counts the first acknowledgement, at ns after start, of a
// pre-filled message; the caller holds mu.
func (t *tracker) backlogAck(ns int64) {
	t.acked.Add(1)
	t.backlogAcked.Add(1)
	if d := time.Duration(ns); d >= t.warmup && d < t.windowEnd {
		t.countSecond(d - t.warmup)
	}
}

// enqueued registers seqs written by a transaction that has not committed
// yet (sparse layout; a no-op in the dense one, which needs no
// registration). The producers call it between the enqueue statement and
// their Commit.
func (t *tracker) enqueued(seqs []int64) {
	if !t.sparse {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range seqs {
		if _, ok := t.pending[s]; !ok {
			t.pending[s] = 0
		}
	}
	t.peak = max(t.peak, len(t.pending))
}

// forget drops the registrations of seqs whose transaction did not commit
// (sparse layout).
func (t *tracker) forget(seqs []int64) {
	if !t.sparse {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range seqs {
		if v, ok := t.pending[s]; ok && v == 0 {
			delete(t.pending, s)
		}
	}
	t.shrink()
}

// committedSparse is committed for the sparse layout; the caller holds mu.
func (t *tracker) committedSparse(seqs []int64, ns int64) {
	for _, s := range seqs {
		v, ok := t.pending[s]
		switch {
		case !ok || v == 0: // registered (or not: see tracker)
			t.pending[s] = ns + 1
		case v > 0: // recorded already
		default: // acknowledged first
			delete(t.pending, s)
			t.record(ns, -v-1)
		}
	}
	t.peak = max(t.peak, len(t.pending))
	t.shrink()
}

// ackedSparse is ackedIDs for the sparse layout; the caller holds mu.
func (t *tracker) ackedSparse(seqs []int64, ns int64) {
	for _, s := range seqs {
		v, ok := t.pending[s]
		switch {
		case ok && v == prefillSlot:
			delete(t.pending, s)
			t.backlogAck(ns)
		case !ok || v < 0: // done, or acknowledged already: a redelivery
			t.dups++
		case v == 0: // before the producer recorded the commit
			t.pending[s] = -(ns + 1)
			t.acked.Add(1)
		default:
			delete(t.pending, s)
			t.acked.Add(1)
			t.record(v-1, ns)
		}
	}
	t.shrink()
}

// sparseRebuildMin is the peak below which the sparse map is never rebuilt.
const sparseRebuildMin = 1 << 12

// shrink rebuilds the sparse map once it holds under an eighth of its peak,
// so that a backlog that was worked off gives its memory back (Go maps keep
// their buckets when entries are deleted). Amortised, each entry is copied
// at most a few times.
func (t *tracker) shrink() {
	if t.peak < sparseRebuildMin || len(t.pending) > t.peak/8 {
		return
	}
	m := make(map[int64]int64, len(t.pending))
	for k, v := range t.pending {
		m[k] = v
	}
	t.pending, t.peak = m, len(m)
}

// inFlight is how many seqs the sparse layout holds (0 in the dense one).
func (t *tracker) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
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
	i := t.countSecond(sinceWarmup)
	if t.sec == nil {
		t.sec, t.secIdx = newHistogram(), i
	}
	if i > t.secIdx { // acknowledgements arrive in time order, give or take a lock wait
		t.closeSecond()
		t.secIdx = i
	}
	t.sec.add(lat)
}

// countSecond counts a message acknowledged at sinceWarmup into the window
// in its second's acknowledgements and returns the second.
func (t *tracker) countSecond(sinceWarmup time.Duration) int64 {
	i := int64(sinceWarmup / time.Second)
	for int64(len(t.perSecondAcks)) <= i {
		t.perSecondAcks = append(t.perSecondAcks, 0)
	}
	t.perSecondAcks[i]++
	return i
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
	if l != nil {
		l.WorstSecondAt = -1
	}
	if l != nil && t.windowEnd > 0 {
		t.closeSecond()
		l.P99PerSecond = median(t.perSecond)
		l.Seconds = len(t.perSecond)
		l.WorstSecond, l.WorstSecondAt = t.worstSecond()
	}
	return l, t.dups
}

// secondsAcked returns the acknowledgements of each whole second of the
// window (nil when it has none).
func (t *tracker) secondsAcked() []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	whole := int((t.windowEnd - t.warmup) / time.Second)
	if whole < 1 {
		return nil
	}
	out := make([]int64, whole)
	copy(out, t.perSecondAcks)
	return out
}

// worst is worstSecond under the lock.
func (t *tracker) worst() (int64, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.worstSecond()
}

// worstSecond is the fewest messages acknowledged in one whole second of
// the window and that second's start, in seconds into the window (-1 when
// the window has no whole second).
func (t *tracker) worstSecond() (int64, int) {
	whole := int((t.windowEnd - t.warmup) / time.Second)
	if whole < 1 {
		return 0, -1
	}
	worst, at := int64(-1), -1
	for i := range whole {
		var n int64
		if i < len(t.perSecondAcks) {
			n = t.perSecondAcks[i]
		}
		if worst < 0 || n < worst {
			worst, at = n, i
		}
	}
	return worst, at
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
