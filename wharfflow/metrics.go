package wharfflow

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the flows' Prometheus metrics: what runners did (give the
// same Metrics to each runner of the process as Config.Metrics) and, read
// from the database at each scrape, what waits. Register it with a
// prometheus.Registerer.
//
//	wharf_flow_steps_total{flow,outcome}          step outcomes committed (rate: steps/s)
//	wharf_flow_outcomes_lost_total{flow}          outcomes not committed (lease lost, cancelled)
//	wharf_flow_step_seconds{flow}                 step function duration (histogram)
//	wharf_flow_runnable{flow}                     steps due now and not running
//	wharf_flow_oldest_runnable_seconds{flow}      how long the oldest of them has been due
//	wharf_flow_running{flow}                      steps leased to a runner
//	wharf_flow_awaiting{flow}                     instances awaiting a signal
//	wharf_flow_failed{flow}                       failed instances (retryable)
//
// The database gauges come from one grouped count over the active and the
// failed instances, read through their partial indexes (not the ended
// instances kept for the retention period), bounded by a 5-second timeout
// per scrape.
type Metrics struct {
	pool   *pgxpool.Pool
	schema string

	steps    *prometheus.CounterVec
	lost     *prometheus.CounterVec
	duration *prometheus.HistogramVec

	runnable, oldest, running, awaiting, failed *prometheus.Desc
}

// NewMetrics returns the metrics of the flows in schema; pool may be nil to
// leave out the database gauges.
func NewMetrics(pool *pgxpool.Pool, schema string) *Metrics {
	return &Metrics{
		pool: pool, schema: schema,
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wharf_flow_steps_total",
			Help: "Step outcomes committed, by flow and outcome (next, retry, await, spawn, done, fail, paused)."}, []string{"flow", "outcome"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wharf_flow_outcomes_lost_total",
			Help: "Step outcomes not committed: the lease was lost or the instance cancelled."}, []string{"flow"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "wharf_flow_step_seconds",
			Help: "Duration of step functions, in seconds.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12)}, []string{"flow"}),
		runnable: prometheus.NewDesc("wharf_flow_runnable", "Steps due now and not running.", []string{"flow"}, nil),
		oldest:   prometheus.NewDesc("wharf_flow_oldest_runnable_seconds", "Seconds since the oldest runnable step became due.", []string{"flow"}, nil),
		running:  prometheus.NewDesc("wharf_flow_running", "Steps leased to a runner.", []string{"flow"}, nil),
		awaiting: prometheus.NewDesc("wharf_flow_awaiting", "Instances awaiting a signal.", []string{"flow"}, nil),
		failed:   prometheus.NewDesc("wharf_flow_failed", "Failed instances, waiting to be retried or cancelled.", []string{"flow"}, nil),
	}
}

func (m *Metrics) observe(res result, applied bool) {
	if m == nil {
		return
	}
	if !applied {
		m.lost.WithLabelValues(res.c.Flow).Inc()
		return
	}
	m.steps.WithLabelValues(res.c.Flow, res.w.Kind).Inc()
	m.duration.WithLabelValues(res.c.Flow).Observe(res.elapsed.Seconds())
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.steps.Describe(ch)
	m.lost.Describe(ch)
	m.duration.Describe(ch)
	for _, d := range []*prometheus.Desc{m.runnable, m.oldest, m.running, m.awaiting, m.failed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.steps.Collect(ch)
	m.lost.Collect(ch)
	m.duration.Collect(ch)
	if m.pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := m.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.runnable, err)
		return
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		ch <- prometheus.NewInvalidMetric(m.runnable, err)
		return
	}
	rows, err := tx.Query(ctx, gaugeQuery(m.schema))
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.runnable, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var flow string
		var runnable, running, awaiting, failed int64
		var oldest float64
		if err := rows.Scan(&flow, &runnable, &oldest, &running, &awaiting, &failed); err != nil {
			ch <- prometheus.NewInvalidMetric(m.runnable, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(m.runnable, prometheus.GaugeValue, float64(runnable), flow)
		ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, oldest, flow)
		ch <- prometheus.MustNewConstMetric(m.running, prometheus.GaugeValue, float64(running), flow)
		ch <- prometheus.MustNewConstMetric(m.awaiting, prometheus.GaugeValue, float64(awaiting), flow)
		ch <- prometheus.MustNewConstMetric(m.failed, prometheus.GaugeValue, float64(failed), flow)
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(m.runnable, err)
	}
}

// gaugeQuery counts, per flow, the instances the database gauges report:
// the active ones (ready, running, awaiting: the claim's partial index) and
// the failed ones (their own partial index). The table keeps every ended
// instance for the retention period, so a scrape that read it whole (as
// "status NOT IN ('done', 'cancelled')" must) would cost more every day; the
// collector runs it with sequential scans off, since without statistics the
// planner may prefer the table to an index over most of it.
func gaugeQuery(schema string) string {
	return `SELECT flow,
  count(*) FILTER (WHERE status <> 'failed' AND run_at <= now()),
  coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE status <> 'failed' AND run_at <= now())), 0),
  count(*) FILTER (WHERE status = 'running' AND run_at > now()),
  count(*) FILTER (WHERE status = 'awaiting'),
  count(*) FILTER (WHERE status = 'failed')
FROM (SELECT flow, status, run_at FROM ` + schema + `.flow_instances WHERE status IN ('ready', 'running', 'awaiting')
      UNION ALL
      SELECT flow, status, run_at FROM ` + schema + `.flow_instances WHERE status = 'failed') i
GROUP BY flow`
}
