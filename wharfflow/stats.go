package wharfflow

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Stats are a runner's counters since it was created. Read them with the
// methods; they are safe for concurrent use.
type Stats struct {
	steps      atomic.Int64
	claimed    atomic.Int64
	leased     atomic.Int64
	signalled  atomic.Int64
	handedBack atomic.Int64
	lost       atomic.Int64
	failed     atomic.Int64
	stepNanos  atomic.Int64
	byOutcome  [kindPaused + 1]atomic.Int64
}

func newStats() *Stats { return &Stats{} }

var kindByName = map[string]kind{"next": kindNext, "retry": kindRetry, "await": kindAwait, "spawn": kindSpawn,
	"done": kindDone, "fail": kindFail, "paused": kindPaused}

func (s *Stats) observe(res result, applied bool) {
	if !applied {
		s.lost.Add(1)
		return
	}
	s.steps.Add(1)
	s.stepNanos.Add(int64(res.elapsed))
	k := kindByName[res.w.Kind]
	s.byOutcome[k].Add(1)
	if k == kindFail {
		s.failed.Add(1)
	}
}

// Steps is how many step outcomes the runner committed.
func (s *Stats) Steps() int64 { return s.steps.Load() }

// Claimed is how many steps the runner's claims leased. Steps continued on
// their lease, children and joins its outcome writes leased to it (Leased)
// and steps signals leased to it (Signalled) ran without a claim and are
// not counted.
func (s *Stats) Claimed() int64 { return s.claimed.Load() }

// Leased is how many instances the runner's outcome writes leased to it:
// children of its spawns, and parents at their join step whose last child
// it ended. Each ran without a claim.
func (s *Stats) Leased() int64 { return s.leased.Load() }

// Signalled is how many steps signals leased to the runner: instances that
// awaited a signal, resumed by it on the runner that wrote their await,
// without a claim.
func (s *Stats) Signalled() int64 { return s.signalled.Load() }

// HandedBack is how many steps leased to the runner it released unrun,
// due at once for any runner's claim: a signal leased them while every
// slot was taken, or the runner was stopping, or they were of a flow it
// does not run.
func (s *Stats) HandedBack() int64 { return s.handedBack.Load() }

// Lost is how many outcomes were not committed because the step's lease was
// lost, its instance was cancelled, or the write failed.
func (s *Stats) Lost() int64 { return s.lost.Load() }

// Failed is how many committed outcomes failed their instance.
func (s *Stats) Failed() int64 { return s.failed.Load() }

// StepTime is the total time spent in step functions whose outcome
// committed.
func (s *Stats) StepTime() time.Duration { return time.Duration(s.stepNanos.Load()) }

// Outcomes returns the committed outcomes by kind (next, retry, await,
// spawn, done, fail, paused).
func (s *Stats) Outcomes() map[string]int64 {
	out := map[string]int64{}
	for name, k := range kindByName {
		out[name] = s.byOutcome[k].Load()
	}
	return out
}

// String is the counters on one line, for logs: "steps=13 claimed=3
// leased=8 signalled=2 handed_back=0 lost=0 failed=1 step_time=1.2s
// outcomes: await=1 done=3 next=9".
func (s *Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "steps=%d claimed=%d leased=%d signalled=%d handed_back=%d lost=%d failed=%d step_time=%s outcomes:",
		s.Steps(), s.Claimed(), s.Leased(), s.Signalled(), s.HandedBack(), s.Lost(), s.Failed(), s.StepTime().Round(time.Millisecond))
	outcomes := s.Outcomes()
	names := slices.Sorted(maps.Keys(outcomes))
	for _, name := range names {
		if n := outcomes[name]; n > 0 {
			fmt.Fprintf(&b, " %s=%d", name, n)
		}
	}
	return b.String()
}
