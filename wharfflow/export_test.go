package wharfflow

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LeaseStart is when r took the lease that instance id's running step runs
// on, as its lease renewals count from it (false: no step of id is running).
func LeaseStart(r *Runner, id int64) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.inflight[id]
	if !ok {
		return time.Time{}, false
	}
	return s.claim, true
}

// GaugeQuery is the metrics collector's query for schema.
func GaugeQuery(schema string) string { return gaugeQuery(schema) }

// SweepDeadRunners runs r's sweep of dead runners once (its cleanup loop
// does, every CleanupInterval).
func SweepDeadRunners(r *Runner) { r.sweepDeadRunners(context.Background()) }

// ParseIDs reads a notification naming instances ('L' leased steps, 'W'
// signalled instances) as the listener of the runner with key does: the
// ids, and whether it was addressed to that key.
func ParseIDs(payload string, key int64) (ids []int64, mine bool, err error) {
	return parseIDs(payload, key)
}

// StepsCounter is wharf_flow_steps_total for flow and outcome.
func (m *Metrics) StepsCounter(flow, outcome string) prometheus.Counter {
	return m.steps.WithLabelValues(flow, outcome)
}
