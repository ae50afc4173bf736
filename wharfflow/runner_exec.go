package wharfflow

import (
	"context"
	"slices"
	"time"

	"github.com/wharfhq/wharf"
)

type result struct {
	c       claimed
	w       wireOutcome
	emit    []wharf.Message
	elapsed time.Duration
	chain   int
	// baton is the reserved step of the same concurrency key named in the
	// outcome (w.BatonID); batonStarted: the runner started it already.
	baton        *claimed
	batonStarted bool
}

// run executes one leased step in a goroutine and hands its outcome to the
// completer. r.mu is held. A step of a flow the runner does not run (a
// lease the database gave this runner's id for another process's flows) is
// handed back, not run.
func (r *Runner) run(ctx context.Context, c claimed, chain int) {
	def := r.flows[c.Flow]
	if def == nil {
		r.cfg.Logger.Warn("wharfflow: handing back a step of a flow this runner does not run; give each process its own RunnerID",
			"instance", c.ID, "flow", c.Flow, "step", c.Step)
		go r.handBack(ctx, []claimed{c})
		return
	}
	stepCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	if c.leased.IsZero() {
		c.leased = time.Now()
	}
	r.inflight[c.ID] = &running{token: c.Token, claim: c.leased, chain: chain, cancel: cancel, unconverted: c.baton}
	if c.ckey != "" {
		r.keyRunning[c.ckey]++
	}
	r.steps.Add(1)
	r.workers.do(func() {
		defer r.steps.Done()
		in := Input{Instance: c.ID, Flow: c.Flow, Step: c.Step, Attempt: c.Attempt, Signals: c.Signals,
			Children: c.Children, IdempotencyKey: idempotencyKey(c.ID, c.Step, c.Attempt)}
		start := time.Now()
		runCtx, endSpan := r.traceStep(stepCtx, c)
		state, o := def.run(runCtx, c.State, in)
		res := result{c: c, w: encode(def, &c, state, &o, start), emit: o.emit, elapsed: time.Since(start), chain: chain}
		res.emit = endSpan(res.w, res.emit)
		if res.w.refused {
			res.emit = nil // an outcome encode refused commits no message
		}
		res.w.Cont = res.w.Kind == "next" && res.w.RunAt == nil && chain+1 < continueChain && ctx.Err() == nil
		r.mu.Lock()
		if c.ckey != "" {
			if r.keyRunning[c.ckey]--; r.keyRunning[c.ckey] <= 0 {
				delete(r.keyRunning, c.ckey)
			}
		}
		if s := r.inflight[c.ID]; s != nil && s.token == c.Token && (s.unconverted || s.dropped) {
			// A baton whose conversion has not been written yet: its result
			// waits for it (and passes a baton on then, release), or is
			// dropped when the write did not make it running.
			if s.dropped {
				delete(r.inflight, c.ID)
				s.cancel(nil)
			} else {
				r.deferred[c.ID] = res
			}
			if c.ckey != "" {
				r.spareBatons(ctx, c.ckey)
			}
			r.mu.Unlock()
			return
		}
		if c.ckey != "" {
			r.passBaton(ctx, &res)
			r.spareBatons(ctx, c.ckey)
		}
		r.mu.Unlock()
		r.results <- res
	})
}

// passBaton hands the slot the ending step of a concurrency key frees to a
// baton of the key reserved to the runner, if it holds one: the outcome
// names it, and the runner starts it now when it has a free slot (the
// ending step still counts), else once the write makes it running. r.mu is
// held.
func (r *Runner) passBaton(ctx context.Context, res *result) {
	key := res.c.ckey
	if res.w.Kind == "paused" && res.w.PauseKey == key {
		return // the key is paused: its next step waits
	}
	var b claimed
	for {
		bs := r.batons[key]
		if len(bs) == 0 {
			return
		}
		b = bs[0] // in the order reserved: the key's priority order
		if len(bs) == 1 {
			delete(r.batons, key)
		} else {
			r.batons[key] = bs[1:]
		}
		// A reservation not renewed for two thirds of a lease (renewals
		// failing) may have ended and its row gone to another runner.
		if time.Since(b.leased) < 2*r.cfg.LeaseTTL/3 {
			break
		}
		go r.handBack(ctx, []claimed{b})
	}
	res.baton = &b
	if r.closing || ctx.Err() != nil || r.freeSlots() <= 0 {
		return
	}
	b.baton = true
	r.stats.leased.Add(1)
	r.run(ctx, b, 0)
	res.batonStarted = true
}

// batonsPerStep is how many batons a runner holds for each step of a key
// that may pass one on (flow_key_free reserves two per step it makes
// running).
const batonsPerStep = 2

// spareBatons hands back the batons of key beyond batonsPerStep for each
// step of the key that may still pass one on (executing, or ended with its
// result deferred without one): they would wait out their reservation.
// r.mu is held.
func (r *Runner) spareBatons(ctx context.Context, key string) {
	bs := r.batons[key]
	passers := r.keyRunning[key]
	for _, d := range r.deferred {
		if d.c.ckey == key && d.baton == nil {
			passers++
		}
	}
	spare := len(bs) - batonsPerStep*passers
	if spare <= 0 {
		return
	}
	// The last reserved go back: the first are next in the key's order.
	back := slices.Clone(bs[len(bs)-spare:])
	if spare == len(bs) {
		delete(r.batons, key)
	} else {
		r.batons[key] = bs[:len(bs)-spare]
	}
	go r.handBack(ctx, back)
}
