package wharfprom

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wharfhq/wharf"
)

const modulePath = "github.com/wharfhq/wharf"

// Option configures [NewCollector] and [Handler].
type Option func(*options)

type options struct {
	version         string
	backlogInterval time.Duration
	backlogTimeout  time.Duration
	healthTimeout   time.Duration
	logger          *slog.Logger
	now             func() time.Time
}

func newOptions(opts []Option) options {
	o := options{
		backlogInterval: 5 * time.Second,
		backlogTimeout:  time.Second,
		healthTimeout:   5 * time.Second,
		now:             time.Now,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.version == "" {
		o.version = buildVersion()
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// WithVersion sets the version label of wharf_relay_info. By default it is
// the wharf module's version from the binary's build information ("devel"
// when built from a work tree).
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// WithBacklogInterval sets how long a read of the backlog estimate
// (wharf_backlog_messages) is reused before the next scrape reads it again.
// Defaults to 5s; values below 1s are raised to 1s, so that frequent scrapes
// never add load to the database.
func WithBacklogInterval(d time.Duration) Option {
	return func(o *options) { o.backlogInterval = max(d, time.Second) }
}

// WithHealthTimeout bounds how long /readyz waits for the database and the
// sinks to answer [wharf.Client.Health]. Defaults to 5s (and to the probe's
// own deadline when that is shorter).
func WithHealthTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.healthTimeout = d
		}
	}
}

// WithLogger receives the errors of reading the backlog estimate and of
// encoding metrics (at debug and warn level). Defaults to discarding them.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// buildVersion is the wharf module's version in this binary: the main
// module's when wharf is the program being built, else the dependency's.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := ""
	if bi.Main.Path == modulePath {
		v = bi.Main.Version
	} else {
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				v = d.Version
				if d.Replace != nil && d.Replace.Version != "" {
					v = d.Replace.Version
				}
				break
			}
		}
	}
	if v == "" || v == "(devel)" {
		return "devel"
	}
	return v
}

// desc describes a metric without constant labels: instance and job come
// from the scrape configuration.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

type collector struct {
	c    *wharf.Client
	opts options

	info                                                   *prometheus.Desc
	delivered, failures, dead                              *prometheus.Desc
	duplicates, resent, failedPublishes                    *prometheus.Desc
	sinkFailed, sinkSeconds                                *prometheus.Desc
	latency, fetchSeconds, fetchRows, removal, resultWrite *prometheus.Desc
	inFlight, buffered, bufferedBytes, held                *prometheus.Desc
	lanesOwned, uncovered                                  *prometheus.Desc
	walLag, walLagSeconds, walHeld                         *prometheus.Desc
	walSlotGone                                            *prometheus.Desc
	renewals, losses, dbErrors, rewinds                    *prometheus.Desc
	oldestDue, backlog, loopAge, dbSuccessAge              *prometheus.Desc

	backlogMu sync.Mutex // held while reading the estimate
	cacheMu   sync.Mutex // guards the cached result below
	backlogN  int64
	backlogOK bool
	backlogAt time.Time
}

// NewCollector returns a collector of c's metrics (see the package
// documentation for the list). Register it with a prometheus.Registerer, or
// serve it with [Handler]. It reads c.Metrics() at every scrape, so it
// covers every relay the client runs, one after the other.
func NewCollector(c *wharf.Client, opts ...Option) prometheus.Collector {
	return newCollector(c, newOptions(opts))
}

func newCollector(c *wharf.Client, o options) *collector {
	return &collector{
		c:    c,
		opts: o,
		info: desc("wharf_relay_info", "Always 1; labels give the wharf version and the relay's id.", "version", "relay_id"),

		delivered: desc("wharf_messages_delivered_total", "Messages acknowledged by the sink and removed from the outbox.", "topic"),
		failures:  desc("wharf_delivery_failures_total", "Failed delivery attempts; each is retried or dead-lettered.", "topic"),
		dead:      desc("wharf_dead_lettered_total", "Messages moved to the dead-letter table.", "topic"),

		duplicates:      desc("wharf_duplicate_acks_total", "Deliveries the destination acknowledged as a duplicate of a message it holds (counted as delivered)."),
		resent:          desc("wharf_resent_total", "Messages sent again because an earlier message of their key failed after the sink took them."),
		failedPublishes: desc("wharf_failed_publishes_total", "Sink calls in which at least one message failed."),

		sinkFailed:  desc("wharf_sink_failed_messages_total", "Messages a sink failed (then retried or dead-lettered).", "sink"),
		sinkSeconds: desc("wharf_sink_publish_seconds", "Duration of one sink call (one batch), in seconds.", "sink"),

		latency:      desc("wharf_commit_to_ack_seconds", "Time from the start of the enqueuing transaction to the acknowledgement being written, in seconds."),
		fetchSeconds: desc("wharf_fetch_seconds", "Duration of one fetch from the outbox, in seconds."),
		resultWrite:  desc("wharf_result_write_seconds", "Duration of one write of delivery results (removals, retries, dead-letter moves), in seconds."),
		fetchRows:    desc("wharf_fetch_rows", "Rows read by one fetch."),
		removal:      desc("wharf_removal_batch_size", "Acknowledgements written by one result write."),

		inFlight:      desc("wharf_messages_in_flight", "Messages at a sink."),
		buffered:      desc("wharf_messages_buffered", "Messages loaded in memory."),
		bufferedBytes: desc("wharf_buffered_payload_bytes", "Payload bytes of the messages loaded in memory."),
		held:          desc("wharf_messages_held", "Messages kept as positions: behind a held key, scheduled for later or waiting for a retry."),
		lanesOwned:    desc("wharf_lanes_owned", "Lanes this relay owns."),
		uncovered:     desc("wharf_lanes_uncovered", "Lanes no live relay owns, as of this relay's last lease round."),
		walLag:        desc("wharf_wal_lag_bytes", "WAL mode: WAL written past the slot's confirmed position, read by the relay that streams the slot at each lease round; 0 for a table outbox or a standby."),
		walLagSeconds: desc("wharf_wal_lag_seconds", "WAL mode: age of the oldest commit the relay streamed and has not settled (database clock), read at each lease round; 0 when it holds nothing unsettled, for a table outbox or a standby."),
		walHeld:       desc("wharf_wal_held_bytes", "WAL mode: bytes of streamed, unsettled messages held in memory; 0 for a table outbox."),
		walSlotGone:   desc("wharf_wal_slot_gone", "WAL mode: 1 while the relay that streams the outbox finds its replication slot missing or lost, and enqueues are refused (run `wharf migrate up --mode wal`); 0 otherwise, for a table outbox or a standby."),

		renewals: desc("wharf_lease_renewals_total", "Lane leases renewed (one per lane per lease round)."),
		losses:   desc("wharf_lease_losses_total", "Lanes lost to another relay before this relay handed them back."),
		dbErrors: desc("wharf_database_errors_total", "Failed fetches, result writes and lease rounds."),
		rewinds:  desc("wharf_rewinds_total", "Times the database went back in time (failover, restore) and every lane was read again."),

		oldestDue:    desc("wharf_oldest_due_message_age_seconds", "How long the oldest message this relay holds that is due or waiting for a retry has been due (since its deliver_at, or its enqueue when it had none); 0 when there is none."),
		backlog:      desc("wharf_backlog_messages", "PostgreSQL's estimate of the messages in the outbox (table statistics: no count, lags a few seconds)."),
		loopAge:      desc("wharf_engine_last_loop_age_seconds", "Seconds since the relay's engine loop last ran."),
		dbSuccessAge: desc("wharf_database_last_success_age_seconds", "Seconds since a fetch or lease round last succeeded."),
	}
}

func (k *collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{
		k.info, k.delivered, k.failures, k.dead, k.duplicates, k.resent, k.failedPublishes,
		k.sinkFailed, k.sinkSeconds, k.latency, k.fetchSeconds, k.fetchRows, k.removal, k.resultWrite,
		k.inFlight, k.buffered, k.bufferedBytes, k.held, k.lanesOwned, k.uncovered, k.walLag, k.walLagSeconds, k.walHeld,
		k.walSlotGone, k.renewals, k.losses, k.dbErrors, k.rewinds, k.oldestDue, k.backlog, k.loopAge, k.dbSuccessAge,
	}
}

// Describe implements prometheus.Collector.
func (k *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range k.descs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (k *collector) Collect(ch chan<- prometheus.Metric) {
	s := k.c.Metrics()
	now := k.opts.now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	gauge(k.info, 1, k.opts.version, k.c.RelayID())

	s.Topics(func(topic string, t *wharf.TopicStats) {
		counter(k.delivered, t.Delivered.Load(), topic)
		counter(k.failures, t.FailedAttempts.Load(), topic)
		counter(k.dead, t.DeadLettered.Load(), topic)
	})
	counter(k.duplicates, s.Duplicates.Load())
	counter(k.resent, s.Resent.Load())
	counter(k.failedPublishes, s.SinkErrors.Load())

	for _, sk := range mergeSinks(s.Sinks()) {
		counter(k.sinkFailed, sk.failed, sk.name)
		ch <- prometheus.MustNewConstHistogram(k.sinkSeconds, sk.count, sk.sum, sk.buckets, sk.name)
	}

	histogram(ch, k.latency, &s.LatencySeconds)
	histogram(ch, k.fetchSeconds, &s.FetchSeconds)
	histogram(ch, k.resultWrite, &s.ResultWriteSeconds)
	histogram(ch, k.fetchRows, &s.FetchRows)
	histogram(ch, k.removal, &s.RemovalSize)

	gauge(k.inFlight, float64(s.InFlight.Load()))
	gauge(k.buffered, float64(s.Buffered.Load()))
	gauge(k.bufferedBytes, float64(s.BufferedBytes.Load()))
	gauge(k.held, float64(s.Held.Load()))
	gauge(k.lanesOwned, float64(s.LanesOwned.Load()))
	gauge(k.uncovered, float64(s.Uncovered.Load()))
	gauge(k.walLag, float64(s.WALLagBytes.Load()))
	gauge(k.walLagSeconds, time.Duration(s.WALLag.Load()).Seconds())
	gauge(k.walHeld, float64(s.WALHeldBytes.Load()))
	gauge(k.walSlotGone, float64(s.WALSlotGone.Load()))

	counter(k.renewals, s.LeaseRenewals.Load())
	counter(k.losses, s.LeaseLosses.Load())
	counter(k.dbErrors, s.DBErrors.Load())
	counter(k.rewinds, s.Rewinds.Load())

	gauge(k.oldestDue, ageSince(now, s.OldestDue.Load()))
	if t := s.LastLoop.Load(); t != 0 {
		gauge(k.loopAge, ageSince(now, t))
	}
	if t := s.LastDBOK.Load(); t != 0 {
		gauge(k.dbSuccessAge, ageSince(now, t))
	}
	if n, ok := k.backlogEstimate(now); ok {
		gauge(k.backlog, float64(n))
	}
}

// ageSince is the seconds from a Unix-nanosecond time to now; 0 for no time,
// and never negative (a clock step back would otherwise show one).
func ageSince(now time.Time, unixNano int64) float64 {
	if unixNano == 0 {
		return 0
	}
	return max(0, now.Sub(time.Unix(0, unixNano)).Seconds())
}

func histogram(ch chan<- prometheus.Metric, d *prometheus.Desc, h *wharf.Histogram) {
	cum, sum := h.Snapshot()
	ch <- prometheus.MustNewConstHistogram(d, cum[len(cum)-1], sum, buckets(h.Bounds, cum))
}

// buckets pairs the bounds with their cumulative counts; the last count
// (+Inf) is the histogram's total, which Prometheus takes separately.
func buckets(bounds []float64, cum []uint64) map[float64]uint64 {
	b := make(map[float64]uint64, len(bounds))
	for i, le := range bounds {
		b[le] = cum[i]
	}
	return b
}

type sinkSeries struct {
	name    string
	failed  int64
	count   uint64
	sum     float64
	buckets map[float64]uint64
}

// mergeSinks sums the sinks that share a name (two Kafka routes are both
// "wharfkafka" unless named): Prometheus refuses two series with the same
// labels in one scrape.
func mergeSinks(sinks []*wharf.SinkStats) []*sinkSeries {
	var out []*sinkSeries
	byName := map[string]*sinkSeries{}
	for _, sk := range sinks {
		cum, sum := sk.PublishSeconds.Snapshot()
		s := byName[sk.Name]
		if s == nil {
			s = &sinkSeries{name: sk.Name, buckets: map[float64]uint64{}}
			byName[sk.Name] = s
			out = append(out, s)
		}
		s.failed += sk.FailedMessages.Load()
		s.count += cum[len(cum)-1]
		s.sum += sum
		for i, le := range sk.PublishSeconds.Bounds {
			s.buckets[le] += cum[i]
		}
	}
	return out
}

// backlogEstimate returns the cached estimate, reading it again when it is
// older than the interval. One scrape reads at a time; a scrape arriving
// meanwhile uses the previous result rather than queue behind a database
// that may be slow to answer.
func (k *collector) backlogEstimate(now time.Time) (int64, bool) {
	k.cacheMu.Lock()
	n, ok, at := k.backlogN, k.backlogOK, k.backlogAt
	k.cacheMu.Unlock()
	if !at.IsZero() && now.Sub(at) < k.opts.backlogInterval {
		return n, ok
	}
	if !k.backlogMu.TryLock() {
		return n, ok
	}
	defer k.backlogMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.backlogTimeout)
	defer cancel()
	n, err := k.c.BacklogEstimate(ctx)
	if err != nil {
		k.opts.logger.Debug("wharfprom: backlog estimate not read; wharf_backlog_messages is left out of this scrape", "err", err)
	}
	k.cacheMu.Lock()
	// A failed read is cached too: while the database is down, each scrape
	// would otherwise wait for the timeout.
	k.backlogN, k.backlogOK, k.backlogAt = n, err == nil, now
	k.cacheMu.Unlock()
	return n, err == nil
}
