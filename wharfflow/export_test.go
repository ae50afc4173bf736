package wharfflow

import (
	"context"
	"time"
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

// LeasedStep is a step a lease notification carried, as the runner reads it.
type LeasedStep struct {
	ID, Token  int64
	Flow, Step string
	Attempt    int
	Until      time.Time
	State      []byte
	Signals    []ReceivedSignal
}

// ParseLeased reads a lease notification's payload as the listener of the
// runner with key does: the steps it carried, the ids it named, and
// whether it was addressed to that key.
func ParseLeased(payload string, key int64) (steps []LeasedStep, ids []int64, mine bool, err error) {
	cs, ids, mine, err := parseLeased(payload, key)
	for _, c := range cs {
		steps = append(steps, LeasedStep{ID: c.ID, Token: c.Token, Flow: c.Flow, Step: c.Step, Attempt: c.Attempt,
			Until: c.Until, State: c.State, Signals: c.Signals})
	}
	return steps, ids, mine, err
}

// ParseLate reads a notification of instances a signal could not resume
// as the listener of the runner with key does: the ids, and whether they
// were addressed to that key (or to every runner).
func ParseLate(payload string, key int64) (ids []int64, mine bool, err error) {
	return parseLate(payload, key)
}
