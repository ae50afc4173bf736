package wharfflow

import (
	"context"
	"errors"
	"maps"

	"github.com/wharfhq/wharf"
)

// Tracer instruments flows for distributed tracing; the wharfotel package
// implements it with OpenTelemetry (wharfotel.New() serves as this and as
// wharf.Config.Tracer). Nil by default, and then none of this costs
// anything.
type Tracer interface {
	// Inject writes the trace context of ctx into carrier. A client built
	// WithTracer stores it with each start, and every step of the instance
	// and of its children is traced under it.
	Inject(ctx context.Context, carrier map[string]string)
	// Step starts the span of one executed step, as a child of the trace
	// context in carrier (the start's; empty when none was stored). The
	// runner runs the step with the context it returns and calls end when
	// the step returns, with its outcome (next, retry, await, spawn, done,
	// fail, paused) and the error it carries (retry, fail), if any.
	Step(ctx context.Context, s StepInfo, carrier map[string]string) (stepCtx context.Context, end func(outcome string, err error))
}

// StepInfo describes one executed step, for [Tracer].
type StepInfo struct {
	Flow     string
	Instance int64
	Step     string
	Attempt  int
}

// ClientOption configures [NewClient].
type ClientOption func(*Client)

// WithTracer makes the client store the trace context of the caller's ctx
// with each start (StartTx, StartSQLTx, Start), so that the steps' spans
// join the starting request's trace.
func WithTracer(t Tracer) ClientOption { return func(c *Client) { c.tracer = t } }

// traceCarrier is the trace context of ctx as the client stores it with a
// start, nil when there is none.
func (c *Client) traceCarrier(ctx context.Context) map[string]string {
	if c.tracer == nil {
		return nil
	}
	carrier := map[string]string{}
	c.tracer.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}

// traceStep starts the step's span, when the runner has a tracer, and makes
// the messages the step emits carry its trace context when the tracer is
// also a wharf.Tracer (so their delivery spans are its children).
// The end function takes the outcome as it is written (a retry past its
// attempts is a fail, a malformed outcome a fail with the reason).
func (r *Runner) traceStep(ctx context.Context, c claimed) (context.Context, func(w wireOutcome, emit []wharf.Message) []wharf.Message) {
	t := r.cfg.Tracer
	if t == nil {
		return ctx, func(_ wireOutcome, emit []wharf.Message) []wharf.Message { return emit }
	}
	stepCtx, end := t.Step(ctx, StepInfo{Flow: c.Flow, Instance: c.ID, Step: c.Step, Attempt: c.Attempt}, c.Trace)
	return stepCtx, func(w wireOutcome, emit []wharf.Message) []wharf.Message {
		if wt, ok := t.(wharf.Tracer); ok && len(emit) > 0 {
			out := make([]wharf.Message, len(emit))
			for i := range emit {
				out[i] = emit[i]
				out[i].Headers = maps.Clone(emit[i].Headers)
				if out[i].Headers == nil {
					out[i].Headers = map[string]string{}
				}
				wt.Enqueue(stepCtx, &out[i])
			}
			emit = out
		}
		var err error
		if w.Error != "" {
			err = errors.New(w.Error)
		}
		end(w.Kind, err)
		return emit
	}
}

// loadTraces fills in the stored trace context of claimed instances: their
// own start's, or for a child its nearest ancestor's. One query per claim,
// only when the runner has a tracer.
func (r *Runner) loadTraces(ctx context.Context, cs []claimed) error {
	if r.cfg.Tracer == nil || len(cs) == 0 {
		return nil
	}
	ids := make([]int64, len(cs))
	for i := range cs {
		ids[i] = cs[i].ID
	}
	rows, err := r.pool.Query(ctx, `WITH RECURSIVE up AS (
    SELECT i.id AS leaf, i.parent_id, i.trace_context FROM `+r.cfg.Schema+`.flow_instances i WHERE i.id = ANY ($1)
    UNION ALL
    SELECT up.leaf, p.parent_id, p.trace_context FROM up JOIN `+r.cfg.Schema+`.flow_instances p ON p.id = up.parent_id
     WHERE up.trace_context IS NULL
) SELECT leaf, trace_context FROM up WHERE trace_context IS NOT NULL`, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	traces := map[int64]map[string]string{}
	for rows.Next() {
		var id int64
		var carrier map[string]string
		if err := rows.Scan(&id, &carrier); err != nil {
			return err
		}
		traces[id] = carrier
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range cs {
		cs[i].Trace = traces[cs[i].ID]
	}
	return nil
}
