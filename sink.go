package wharf

import "context"

// Sink delivers batches of messages. Implementations must acknowledge a
// message (nil error) only once the destination durably accepted it.
//
// Ordering contract: a batch may hold several messages of the same ordering
// key ([Message.OrderingKey]), in Seq order. A sink must deliver them in that
// order, and once one of them fails it must not start delivering the later
// ones of that key in the batch (report them with [ErrNotAttempted]); [Results]
// does this bookkeeping. A sink that pipelines sends cannot take back a later
// message it already sent when an earlier one fails: the relay then sends the
// later one again after the earlier one, so the destination's last copy of a
// key is in order.
//
// Publish is called from several goroutines at once (Config.SinkConcurrency),
// never with two batches holding the same ordering key at the same time.
type Sink interface {
	// Publish delivers msgs and returns one error per message, in the same
	// order, or a nil slice when all were acknowledged. Classify failures
	// with [Permanent] and [RetryAfter]; [ErrDuplicate] reports a message the
	// destination already held; any other error is retried with
	// exponential backoff. Publish must return once ctx is done.
	//
	// ctx ends when a lease of the messages' lanes ends (another relay may
	// then deliver them); its Err reports that at the moment of the call,
	// even in a process that was paused and has just resumed. Check
	// ctx.Err() right before each write to the destination, not only on
	// entry, and send nothing once it is non-nil.
	Publish(ctx context.Context, msgs []*Message) []error
	// Close releases the sink's resources.
	Close() error
}

// HandlerFunc handles one message in-process. Returning nil acknowledges it.
type HandlerFunc func(ctx context.Context, msg *Message) error

// Results collects one Publish call's per-message results and keeps the Sink
// ordering contract: once a message failed, the later messages of its ordering
// key are not attempted. It is not safe for concurrent use.
//
//	res := wharf.NewResults(msgs)
//	for i, m := range msgs {
//		if res.Blocked(i) {
//			continue
//		}
//		res.Set(i, send(ctx, m))
//	}
//	return res.Errors()
type Results struct {
	msgs    []*Message
	errs    []error
	done    []bool
	blocked map[string]struct{}
	failed  bool
}

// NewResults returns the results of publishing msgs, none recorded yet.
func NewResults(msgs []*Message) *Results {
	return &Results{msgs: msgs, errs: make([]error, len(msgs)), done: make([]bool, len(msgs))}
}

// Blocked reports whether message i must not be attempted because an earlier
// message of its ordering key failed; if so it records [ErrNotAttempted] for it.
func (r *Results) Blocked(i int) bool {
	if r.blocked == nil {
		return false
	}
	k := r.msgs[i].OrderingKey()
	if k == "" {
		return false
	}
	if _, ok := r.blocked[k]; !ok {
		return false
	}
	r.errs[i], r.done[i], r.failed = ErrNotAttempted, true, true
	return true
}

// Set records message i's result: nil (or [ErrDuplicate]) acknowledges it,
// any other error fails it and blocks the rest of its ordering key.
func (r *Results) Set(i int, err error) {
	r.done[i] = true
	r.errs[i] = err
	if err == nil {
		return
	}
	r.failed = true
	if err == ErrDuplicate { //nolint:errorlint // the sentinel itself, never wrapped
		return
	}
	if k := r.msgs[i].OrderingKey(); k != "" {
		if r.blocked == nil {
			r.blocked = map[string]struct{}{}
		}
		r.blocked[k] = struct{}{}
	}
}

// Fail records err for message i and blocks the rest of its ordering key.
func (r *Results) Fail(i int, err error) {
	if err == nil {
		err = ErrNotAttempted
	}
	r.Set(i, err)
}

// Done reports whether message i has a result.
func (r *Results) Done(i int) bool { return r.done[i] }

// FailRest records err for every message that has no result yet (a whole
// batch that could not be sent: broker down, context cancelled).
func (r *Results) FailRest(err error) {
	for i := range r.msgs {
		if !r.done[i] {
			r.Fail(i, err)
		}
	}
}

// Errors returns the per-message results, or nil when every message was
// acknowledged. A message never given a result counts as not attempted.
func (r *Results) Errors() []error {
	for i := range r.msgs {
		if !r.done[i] {
			r.errs[i], r.failed = ErrNotAttempted, true
		}
	}
	if !r.failed {
		return nil
	}
	return r.errs
}

// FailAll returns n copies of err: the result of a Publish whose whole batch
// failed (broker down, write error, context cancelled).
func FailAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// Pinger is implemented by sinks that can check that their destination is
// reachable (a connection is up, the broker answers). [Client.Health] uses it
// for readiness; a [Router] pings every sink it routes to.
type Pinger interface {
	Ping(ctx context.Context) error
}
