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

// run executes one claimed step in a goroutine and hands its outcome to the
// completer. r.mu is held.
func (r *Runner) run(ctx context.Context, c claimed, chain int) {
	stepCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	leased := c.leased
	if leased.IsZero() {
		leased = time.Now()
	}
	r.inflight[c.ID] = &running{token: c.Token, claim: leased, chain: chain, cancel: cancel}
	c.leased = leased
	r.steps.Add(1)
	go func() {
		defer r.steps.Done()
		def := r.flows[c.Flow]
		in := Input{Instance: c.ID, Flow: c.Flow, Step: c.Step, Attempt: c.Attempt, Signals: c.Signals,
			Children: c.Children, IdempotencyKey: idempotencyKey(c.ID, c.Step, c.Attempt)}
		start := time.Now()
		runCtx, endSpan := r.traceStep(stepCtx, c)
		state, o := def.run(runCtx, c.State, in)
		res := result{c: c, w: encode(def, c, state, o, start), emit: o.emit, elapsed: time.Since(start), chain: chain}
		if res.w.Kind == "fail" && state == nil {
			res.w.State = nil // keep the saved state
		}
		res.emit = endSpan(res.w, res.emit)
		res.w.Cont = res.w.Kind == "next" && res.w.RunAt == nil && chain+1 < continueChain && ctx.Err() == nil
		r.results <- res
	}()
}
