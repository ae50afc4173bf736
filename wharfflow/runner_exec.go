package wharfflow

import (
	"context"
	"time"

	"github.com/wharfhq/wharf"
)

type result struct {
	c       claimed
	w       wireOutcome
	emit    []wharf.Message
	elapsed time.Duration
	chain   int
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
	r.inflight[c.ID] = &running{token: c.Token, claim: c.leased, chain: chain, cancel: cancel}
	r.steps.Add(1)
	go func() {
		defer r.steps.Done()
		in := Input{Instance: c.ID, Flow: c.Flow, Step: c.Step, Attempt: c.Attempt, Signals: c.Signals,
			Children: c.Children, IdempotencyKey: idempotencyKey(c.ID, c.Step, c.Attempt)}
		start := time.Now()
		runCtx, endSpan := r.traceStep(stepCtx, c)
		state, o := def.run(runCtx, c.State, in)
		res := result{c: c, w: encode(def, c, state, o, start), emit: o.emit, elapsed: time.Since(start), chain: chain}
		res.emit = endSpan(res.w, res.emit)
		if res.w.Kind == "fail" {
			res.emit = nil // a failed outcome commits no messages
		}
		res.w.Cont = res.w.Kind == "next" && res.w.RunAt == nil && chain+1 < continueChain && ctx.Err() == nil
		r.results <- res
	}()
}
