package wharf

import (
	"context"
	"maps"
)

// Tracer instruments enqueue and delivery, for distributed tracing (the
// wharfotel package implements it with OpenTelemetry). Config.Tracer is nil by
// default, and then none of this costs anything.
type Tracer interface {
	// Enqueue is called for each message before it is inserted, with the
	// enqueuing caller's context; it may add headers (the trace context).
	// The headers map is the message's own copy.
	Enqueue(ctx context.Context, m *Message)
	// Publish wraps one sink call of the relay: it returns the context to
	// publish with and a function the relay calls with the results. It may
	// change the messages' headers (the delivery's trace context), which
	// every sink carries in the destination's native headers.
	Publish(ctx context.Context, sink string, msgs []*Message) (context.Context, func(errs []error))
}

// traceEnqueue gives each message its own headers map and lets the tracer
// add to it.
func (c *Client) traceEnqueue(ctx context.Context, msgs []Message) []Message {
	out := make([]Message, len(msgs))
	for i := range msgs {
		out[i] = msgs[i]
		out[i].Headers = maps.Clone(msgs[i].Headers)
		if out[i].Headers == nil {
			out[i].Headers = map[string]string{}
		}
		c.cfg.Tracer.Enqueue(ctx, &out[i])
	}
	return out
}
