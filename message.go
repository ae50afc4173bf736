// Package wharf is a transactional outbox for PostgreSQL.
//
// An application enqueues messages with [Client.EnqueueTx] (or the SQL function
// wharf.enqueue) inside the same transaction as its business data; a relay
// ([Client.Start], or the wharf CLI) delivers every committed message to a [Sink]
// at least once, in id order per key.
package wharf

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Message is one outbox message.
type Message struct {
	// ID is assigned at enqueue: unique in the database and increasing in
	// enqueue order. It is the stable message id carried on every redelivery.
	ID int64
	// Topic routes the message to a sink and names the destination. Required.
	Topic string
	// Key is the ordering scope: messages with the same key are delivered in
	// id order. The empty string means no key and no ordering promise.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are passed to the sink with the message.
	Headers map[string]string
	// DeliverAt, when non-zero, is the earliest time the message is delivered.
	DeliverAt time.Time
	// DedupKey, when non-empty, makes a second enqueue with the same key a no-op
	// while the first message is still in the outbox.
	DedupKey string
	// CreatedAt is the enqueue time (set by the database; ignored on enqueue).
	CreatedAt time.Time
	// Attempt is 1 on the first delivery and grows with each retry (set by the
	// relay; ignored on enqueue).
	Attempt int
}

// MessageID returns the stable message id as text, the value sinks put in the
// broker's dedup field (Kafka header, Nats-Msg-Id, AMQP message-id, webhook-id).
func (m *Message) MessageID() string { return strconv.FormatInt(m.ID, 10) }

// Sink delivers batches of messages. Implementations must acknowledge a
// message (nil error) only once the destination durably accepted it.
//
// Ordering contract: a batch may hold several messages of the same key, in id
// order. A sink must deliver them in that order, and once one of them fails it
// must not deliver the later ones of that key in the batch (report them with
// [ErrNotAttempted]).
type Sink interface {
	// Publish delivers msgs and returns one error per message, in the same
	// order, or a nil slice when all were acknowledged. Classify failures
	// with [Permanent] and [RetryAfter]; any other error is retried with
	// exponential backoff.
	Publish(ctx context.Context, msgs []*Message) []error
	// Close releases the sink's resources.
	Close() error
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

// HandlerFunc handles one message in-process. Returning nil acknowledges it.
type HandlerFunc func(ctx context.Context, msg *Message) error

// ErrNotAttempted reports that a sink did not try a message because an
// earlier message of the same key in the batch failed. It costs no attempt.
var ErrNotAttempted = errors.New("wharf: not attempted: an earlier message of the same key failed")

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the message moves to the
// dead-letter table at once.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.delay, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter asks for the message to be retried no sooner than d from now
// (for example from an HTTP Retry-After header). It counts as an attempt.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &retryAfterError{err: err, delay: d}
}

// retryDelay returns the delay requested with RetryAfter, if any.
func retryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}
