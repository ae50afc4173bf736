package wharf

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Stats holds the relay's counters and histograms. The engine updates them
// with atomic operations only, so reading them (for metrics) costs the hot
// path nothing but the increments. Read them with [Client.Metrics].
type Stats struct {
	Delivered      atomic.Int64 // messages acknowledged and removed
	Duplicates     atomic.Int64 // acknowledged by the sink as already held
	FailedAttempts atomic.Int64 // deliveries that failed (retried or dead-lettered)
	DeadLettered   atomic.Int64 // messages moved to the dead-letter table
	Resent         atomic.Int64 // taken by a sink after an earlier message of their key failed: sent again
	SinkErrors     atomic.Int64 // Publish calls with at least one failed message
	DBErrors       atomic.Int64 // failed fetches, result writes and lease rounds
	LeaseRenewals  atomic.Int64
	LeaseLosses    atomic.Int64
	Rewinds        atomic.Int64 // the database went back in time; lanes were read again

	// OldestDue is when (database clock, Unix nanoseconds) the oldest
	// message this relay holds that is due or retrying became due (its
	// DeliverAt, or its enqueue when it had none)
	// (scheduled messages not yet due excluded); 0 when it holds none.
	// Refreshed every RebalanceInterval.
	OldestDue atomic.Int64
	// LastLoop is when the engine loop last ran (Unix nanoseconds): a
	// loop that stops advancing is wedged.
	LastLoop atomic.Int64
	// LastDBOK is when a fetch or lease round last succeeded.
	LastDBOK atomic.Int64

	InFlight      atomic.Int64 // messages at a sink
	Buffered      atomic.Int64 // messages loaded in memory
	BufferedBytes atomic.Int64 // their payload bytes
	Held          atomic.Int64 // messages kept as positions (held keys, scheduled, retrying)
	LanesOwned    atomic.Int64
	Uncovered     atomic.Int64 // lanes no live relay owns (as of the last lease round)
	// WALLagBytes is, for an outbox in WAL mode, the WAL written past the
	// slot's confirmed position, read by the relay that streams the slot at
	// each lease round: what a relay starting now would read again or for
	// the first time (every database's writes count). WALLag (a
	// time.Duration) is, at the same round, the age of the oldest commit
	// the relay streamed and has not settled, on the database's clock; 0
	// when it holds nothing unsettled (WAL it has not streamed yet shows in
	// the bytes only). WALHeldBytes is what the relay holds in memory of
	// what it streamed and has not settled (payloads plus a per-message
	// estimate). All are 0 for a table outbox.
	WALLagBytes  atomic.Int64
	WALLag       atomic.Int64
	WALHeldBytes atomic.Int64
	// WALSlotGone is 1 while the relay that streams a WAL outbox finds its
	// replication slot missing or lost (invalidated): producers' enqueues
	// are refused until `wharf migrate up --mode wal` creates it again. 0
	// otherwise, and for a table outbox or a standby.
	WALSlotGone atomic.Int64

	FetchSeconds   Histogram // duration of one fetch round trip
	FetchRows      Histogram // rows per fetch
	PublishSeconds Histogram // duration of one sink Publish call
	LatencySeconds Histogram // commit (transaction start) to acknowledgement written
	RemovalSize    Histogram // acknowledgements per result write
	// ResultWriteSeconds is the duration of one write of delivery results
	// (removals, retries, dead-letter moves: one transaction).
	ResultWriteSeconds Histogram

	topics  sync.Map // topic -> *TopicStats
	ntopics atomic.Int32
	mu      sync.Mutex
	sinks   []*SinkStats
}

// Histogram counts observations in fixed buckets (cumulative counts are
// computed when read).
type Histogram struct {
	Bounds []float64
	counts []atomic.Int64 // len(Bounds)+1: the last is +Inf
	sum    atomic.Uint64  // sum in micro-units, to stay atomic
	scale  float64
}

func newHistogram(scale float64, bounds ...float64) Histogram {
	return Histogram{Bounds: bounds, counts: make([]atomic.Int64, len(bounds)+1), scale: scale}
}

func (h *Histogram) observe(v float64) {
	i := 0
	for i < len(h.Bounds) && v > h.Bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(uint64(max(0, v) * h.scale))
}

// Snapshot returns the cumulative bucket counts (one per bound, then the
// total), and the sum of the observations.
func (h *Histogram) Snapshot() (cumulative []uint64, sum float64) {
	cumulative = make([]uint64, len(h.counts))
	var c uint64
	for i := range h.counts {
		c += uint64(h.counts[i].Load())
		cumulative[i] = c
	}
	return cumulative, float64(h.sum.Load()) / h.scale
}

func newStats() *Stats {
	secs := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	sizes := []float64{1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000}
	return &Stats{
		FetchSeconds:   newHistogram(1e6, secs...),
		FetchRows:      newHistogram(1, sizes...),
		PublishSeconds: newHistogram(1e6, secs...),
		LatencySeconds: newHistogram(1e6, append(secs, 60, 300, 900, 3600)...),
		RemovalSize:    newHistogram(1, sizes...),

		ResultWriteSeconds: newHistogram(1e6, secs...),
	}
}

func (s *Stats) observeFetch(d time.Duration, rows int) {
	s.FetchSeconds.observe(d.Seconds())
	s.FetchRows.observe(float64(rows))
}

func (s *Stats) observePublish(d time.Duration) { s.PublishSeconds.observe(d.Seconds()) }

func (s *Stats) observeLatency(d time.Duration) { s.LatencySeconds.observe(d.Seconds()) }

func (s *Stats) observeRemoval(n int) { s.RemovalSize.observe(float64(n)) }

// MaxTopicLabels is how many distinct topics get counters of their own; the
// messages of any further topic are counted under OtherTopics, so a topic
// built from user input cannot grow the metrics without bound.
const MaxTopicLabels = 100

// OtherTopics names the counters of topics past MaxTopicLabels.
const OtherTopics = "_other"

// TopicStats are one topic's counters.
type TopicStats struct {
	Delivered      atomic.Int64
	FailedAttempts atomic.Int64
	DeadLettered   atomic.Int64
}

// SinkStats are one sink's counters (one per route sink with a Router).
type SinkStats struct {
	Name           string // the sink's package, e.g. "wharfkafka"
	Publishes      atomic.Int64
	FailedMessages atomic.Int64
	PublishSeconds Histogram
}

// Topic returns the counters of topic (those of OtherTopics past the
// MaxTopicLabels-th topic).
func (s *Stats) Topic(topic string) *TopicStats {
	if t, ok := s.topics.Load(topic); ok {
		return t.(*TopicStats)
	}
	if s.ntopics.Load() >= MaxTopicLabels {
		topic = OtherTopics
	}
	t, loaded := s.topics.LoadOrStore(topic, &TopicStats{})
	if !loaded && topic != OtherTopics {
		s.ntopics.Add(1)
	}
	return t.(*TopicStats)
}

// Topics calls f for every topic with counters.
func (s *Stats) Topics(f func(topic string, t *TopicStats)) {
	s.topics.Range(func(k, v any) bool { f(k.(string), v.(*TopicStats)); return true })
}

// Sinks returns the counters of the running (or last) relay's sinks.
func (s *Stats) Sinks() []*SinkStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*SinkStats(nil), s.sinks...)
}

func (s *Stats) setSinks(names []string) []*SinkStats {
	secs := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sinks = s.sinks[:0]
	for _, n := range names {
		s.sinks = append(s.sinks, &SinkStats{Name: n, PublishSeconds: newHistogram(1e6, secs...)})
	}
	return append([]*SinkStats(nil), s.sinks...)
}

// sinkName is a sink's package name: "wharfkafka" for a *wharfkafka.Sink.
func sinkName(s Sink) string {
	if n, ok := s.(interface{ Name() string }); ok {
		return n.Name()
	}
	n := fmt.Sprintf("%T", s)
	n = strings.TrimPrefix(n, "*")
	if i := strings.IndexByte(n, '.'); i > 0 {
		n = n[:i]
	}
	return n
}
