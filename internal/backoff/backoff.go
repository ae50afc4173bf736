// Package backoff is the relay's retry schedule: exponential with equal
// jitter, shared by the engine (a message's retries, a failing fetch or
// write) and the WAL store (a failing stream).
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay is the wait before the attempt-th retry: base doubled per earlier
// attempt, capped at maxD, then drawn uniformly from its upper half.
func Delay(attempt int, base, maxD time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	return d/2 + rand.N(d/2+1)
}

// State is the backoff of a loop's failing round trips: 100 ms after the
// first failure, doubling up to 5 s.
type State struct {
	Errs int       // failures in a row
	At   time.Time // not before this time again
}

// Fail notes a failure at now and returns the wait before the next try.
func (s *State) Fail(now time.Time) time.Duration {
	s.Errs++
	d := Delay(s.Errs, 100*time.Millisecond, 5*time.Second)
	s.At = now.Add(d)
	return d
}

// OK notes a success: the next failure waits the least again.
func (s *State) OK() { *s = State{} }
