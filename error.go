package wharf

import (
	"errors"
	"fmt"
	"time"

	"github.com/wharfhq/wharf/internal/store"
)

// ErrNotAttempted reports that a sink did not try a message because an
// earlier message of the same ordering key in the batch failed. It costs no
// attempt.
var ErrNotAttempted = errors.New("wharf: not attempted: an earlier message of the same key failed")

// ErrDuplicate is the result a sink reports for a message the destination
// acknowledged as a duplicate of a message it already holds with the same id
// (JetStream's duplicate window, for example). The relay treats it as
// delivered and counts it. Since message ids are unique beyond one outbox, a
// duplicate can only be a redelivery of the same message.
var ErrDuplicate = errors.New("wharf: the destination already holds this message id")

// ErrRelayIDInUse is returned by [Client.Start] and [Client.Drain] when another
// relay that is still alive runs with the same [Config.RelayID]: two relays
// sharing an id would share lanes and deliver one key twice at once.
var ErrRelayIDInUse = store.ErrRelayIDInUse

// ErrInvalidMessage is wrapped by the error [Client.EnqueueTx] (and the other
// enqueue calls) return when they refuse a message before writing anything:
// a field PostgreSQL cannot store, or one the outbox's mode does not take.
// The error's text names the message and the field; test with errors.Is.
var ErrInvalidMessage = errors.New("wharf: invalid message")

// invalidMessage is an ErrInvalidMessage with its own text.
type invalidMessage struct{ msg string }

func (e *invalidMessage) Error() string        { return e.msg }
func (e *invalidMessage) Is(target error) bool { return target == ErrInvalidMessage }

func errInvalidMessage(format string, args ...any) error {
	return &invalidMessage{msg: fmt.Sprintf(format, args...)}
}

// ErrRelayRunning is returned by [Client.Start] and [Client.Drain] while the
// client's relay is already running.
var ErrRelayRunning = errors.New("wharf: relay already running")

// ErrNoPool is returned by calls that need the database (the relay, Enqueue,
// the dead-letter and status calls) on a client created without a pool.
var ErrNoPool = errors.New("wharf: this call needs a client created with a pool (wharf.NewClient(pool, cfg)); use EnqueueTx with your own transaction otherwise")

// PermanentError marks an error as not worth retrying: the message moves to
// the dead-letter table at once. Create it with [Permanent]; the type is
// exported for assertions with errors.As.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying: the message moves to the
// dead-letter table at once.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// RetryAfterError asks for a retry no sooner than Delay from now. Create it
// with [RetryAfter]; the type is exported for assertions with errors.As.
type RetryAfterError struct {
	Err   error
	Delay time.Duration
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for the message to be retried no sooner than d from now
// (for example from an HTTP Retry-After header). It counts as an attempt.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryAfterError{Err: err, Delay: d}
}

// retryDelay returns the delay requested with RetryAfter, if any.
func retryDelay(err error) (time.Duration, bool) {
	var r *RetryAfterError
	if errors.As(err, &r) {
		return r.Delay, true
	}
	return 0, false
}
