package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
)

// sent is a message published on the channel and not yet settled.
type sent struct {
	i  int // index in the batch
	dc *amqp.DeferredConfirmation
	at time.Time
}

// batch is the state of one Publish.
type batch struct {
	s    *Sink
	msgs []*wharf.Message
	res  *wharf.Results
	pubs []publishing
	// invalid[i] is why message i cannot be sent at all (a permanent
	// error), found before sending.
	invalid []error
	// next[i] is the index of the next message of i's ordering key in the
	// batch, or -1; nil unless the sink keeps strict order.
	next []int
}

// fail records the result of message i, which was not sent: its own
// permanent error when it cannot be sent at all, otherwise err (nil: not
// attempted). An earlier failure of its ordering key makes it not attempted
// instead.
func (b *batch) fail(i int, err error) {
	switch {
	case b.res.Blocked(i):
	case b.invalid[i] != nil:
		b.res.Fail(i, b.invalid[i])
	default:
		b.res.Fail(i, err)
	}
}

// failAll fails, in batch order, every message without a result (see fail).
func (b *batch) failAll(err error) {
	for i := range b.msgs {
		if !b.res.Done(i) {
			b.fail(i, err)
		}
	}
}

// waitUnblocked waits, at most the confirm timeout, while the broker blocks
// the connection, and fails the batch when it stays blocked.
func (b *batch) waitUnblocked(ctx context.Context, pc *pubChannel) bool {
	reason, unblocked := pc.cn.blockedState()
	if unblocked == nil {
		return true
	}
	t := time.NewTimer(b.s.opts.ConfirmTimeout)
	defer t.Stop()
	select {
	case <-unblocked:
		return true
	case <-pc.cn.done:
		return true // the publish fails with the close reason
	case <-t.C:
		b.failAll(fmt.Errorf("wharfamqp: not sent: the broker blocks publishing on the connection (%s, a resource alarm) for over confirm_timeout %s", reason, b.s.opts.ConfirmTimeout))
	case <-ctx.Done():
		b.failAll(fmt.Errorf("wharfamqp: not sent: the broker blocks publishing on the connection (%s): %w", reason, ctxErr(ctx)))
	}
	return false
}

// firstReady returns, in batch order, the messages that may be sent at
// once: every message, or with strict order the unkeyed ones
// and the first of each ordering key, the others being chained in b.next.
func (b *batch) firstReady() []int {
	ready := make([]int, 0, len(b.msgs))
	var last map[string]int // with strict order: the key's latest message
	if b.s.opts.StrictOrder {
		b.next = make([]int, len(b.msgs))
		last = map[string]int{}
	}
	for i, m := range b.msgs {
		if b.next != nil {
			b.next[i] = -1
			if k := m.OrderingKey(); k != "" {
				if prev, ok := last[k]; ok {
					b.next[prev] = i
					last[k] = i
					continue
				}
				last[k] = i
			}
		}
		ready = append(ready, i)
	}
	return ready
}

// settled makes the next message of i's ordering key ready, with strict
// order, once i was confirmed. After a failure of i, Blocked records the
// next one as not attempted (and send's last pass the rest of the key).
func (b *batch) settled(ready []int, i int) []int {
	if b.next == nil {
		return ready
	}
	if j := b.next[i]; j >= 0 && !b.res.Done(j) && !b.res.Blocked(j) {
		ready = append(ready, j)
	}
	return ready
}

// send publishes the ready messages while fewer than MaxInFlight await their
// confirm, then waits for the oldest confirm and takes every confirm that
// came with it, until every message was settled. It reports whether the
// channel can be reused: every message it sent was confirmed and it is open.
func (b *batch) send(ctx context.Context, pc *pubChannel) bool {
	s := b.s
	pc.reset()
	// A write the broker does not read is cut short when ctx ends.
	stop := context.AfterFunc(ctx, func() {
		if pc.writing.Load() {
			pc.cn.kill()
		}
	})
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ready := b.firstReady()
	pending := make([]sent, 0, min(len(ready), s.opts.MaxInFlight))
	head := 0
	var abort error // set once nothing more can be sent
	reusable := true
	for {
		for abort == nil && len(ready) > 0 && len(pending)-head < s.opts.MaxInFlight {
			if ctx.Err() != nil {
				abort = ctxErr(ctx)
				break
			}
			i := ready[0]
			ready = ready[1:]
			if b.res.Blocked(i) {
				continue // an earlier message of its key failed
			}
			if b.invalid[i] != nil {
				b.res.Fail(i, b.invalid[i])
				continue
			}
			p := b.pubs[i]
			pc.writing.Store(true)
			dc, err := pc.ch.PublishWithDeferredConfirm(p.exchange, p.key, !s.opts.DropUnroutable, false, p.msg)
			pc.writing.Store(false)
			if err != nil {
				abort = pc.closeError(ctx, err)
				if ctx.Err() != nil {
					abort = fmt.Errorf("the write was cut short, closing the connection: %w", ctxErr(ctx))
				}
				b.res.Fail(i, fmt.Errorf("wharfamqp: message %s: %w", b.msgs[i].ID, abort))
				reusable = false
				break
			}
			pending = append(pending, sent{i: i, dc: dc, at: time.Now()})
		}
		if abort != nil || head == len(pending) {
			break
		}
		p := pending[head]
		head++
		if err := b.settle(ctx, pc, p, timer); err != nil {
			abort = err
			break
		}
		ready = b.settled(ready, p.i)
		// Confirms come in publishing order: take every one that came.
		for head < len(pending) && b.settleNow(pc, pending[head]) {
			ready = b.settled(ready, pending[head].i)
			head++
		}
	}
	// Take what was confirmed anyway; the rest fails.
	for ; head < len(pending); head++ {
		p := pending[head]
		if b.settleNow(pc, p) {
			continue
		}
		reusable = false
		if closed, cerr := pc.closedState(); closed {
			_ = b.closedFailure(pc, p, cerr)
		} else {
			b.res.Fail(p.i, fmt.Errorf("wharfamqp: message %s: no publisher confirm: %w", b.msgs[p.i].ID, abort))
		}
	}
	// Never sent: behind a failure of its key (with strict order), not
	// attempted; after an abort, the reason nothing more could be sent.
	for i := range b.msgs {
		if b.res.Done(i) {
			continue
		}
		var err error
		if abort != nil {
			err = fmt.Errorf("wharfamqp: message %s: not sent: %w", b.msgs[i].ID, abort)
		}
		b.fail(i, err)
	}
	return reusable && abort == nil && !pc.isClosed()
}

// errConfirmTimeout is the abort cause of a confirm that did not come.
type errConfirmTimeout struct {
	timeout time.Duration
	blocked string
}

func (e *errConfirmTimeout) Error() string {
	if e.blocked != "" {
		return fmt.Sprintf("confirm_timeout %s passed without a publisher confirm: the broker blocks the connection (%s, a resource alarm)", e.timeout, e.blocked)
	}
	return fmt.Sprintf("confirm_timeout %s passed without a publisher confirm (broker slow or unreachable)", e.timeout)
}

// settle waits for the confirm of p and records its result. It returns a
// non-nil error when no more confirms can be waited for: the channel closed,
// the confirm timeout passed or ctx ended.
func (b *batch) settle(ctx context.Context, pc *pubChannel, p sent, timer *time.Timer) error {
	deadline := p.at.Add(b.s.opts.ConfirmTimeout)
	for {
		if b.settleNow(pc, p) {
			return nil
		}
		if closed, err := pc.closedState(); closed {
			return b.closedFailure(pc, p, err)
		}
		d := time.Until(deadline)
		if d <= 0 {
			reason, _ := pc.cn.blockedState()
			err := &errConfirmTimeout{timeout: b.s.opts.ConfirmTimeout, blocked: reason}
			b.res.Fail(p.i, fmt.Errorf("wharfamqp: message %s: %w", b.msgs[p.i].ID, err))
			return err
		}
		timer.Reset(d)
		select {
		case <-pc.events:
		case <-timer.C:
		case <-ctx.Done():
			err := fmt.Errorf("gave up waiting for the publisher confirm: %w", ctxErr(ctx))
			if !b.settleNow(pc, p) {
				b.res.Fail(p.i, fmt.Errorf("wharfamqp: message %s: %w", b.msgs[p.i].ID, err))
			}
			return err
		}
	}
}

// settleNow records the result of p if its confirm came, and reports
// whether it did.
func (b *batch) settleNow(pc *pubChannel, p sent) bool {
	m := b.msgs[p.i]
	confirmed, nacked, ret, returned := pc.outcome(p.dc, m.ID)
	if !confirmed {
		return false
	}
	pub := &b.pubs[p.i]
	switch {
	default:
		b.res.Set(p.i, nil)
	case returned:
		b.res.Fail(p.i, fmt.Errorf("wharfamqp: message %s: unroutable, returned by the broker (%d %s): no queue is bound to exchange %q for routing key %q: bind one (the relay retries), or set mandatory=false to drop such messages",
			m.ID, ret.ReplyCode, ret.ReplyText, pub.exchange, pub.key))
	case nacked:
		b.res.Fail(p.i, fmt.Errorf("wharfamqp: message %s: the broker nacked it (exchange %q, routing key %q): a queue refused it (x-overflow=reject-publish?) or failed", m.ID, pub.exchange, pub.key))
	}
	return true
}

// closedFailure fails p, sent on a channel that closed before confirming
// it. A payload the broker found over its max_message_size fails
// permanently: the broker names its size.
func (b *batch) closedFailure(pc *pubChannel, p sent, cerr error) error {
	m := b.msgs[p.i]
	err := fmt.Errorf("wharfamqp: message %s: no publisher confirm: %w", m.ID, cerr)
	if size, ok := tooLarge(cerr); ok && size == len(m.Payload) && !pc.blamed {
		pc.blamed = true
		err = wharf.Permanent(fmt.Errorf("wharfamqp: message %s: the broker refused its %d-byte payload (lower max_message_size to the broker's): %w", m.ID, size, cerr))
	}
	b.res.Fail(p.i, err)
	return cerr
}

var tooLargeRE = regexp.MustCompile(`message size (\d+) is larger than`)

// tooLarge reports the payload size named by RabbitMQ's PRECONDITION_FAILED
// for a message over its max_message_size.
func tooLarge(err error) (int, bool) {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		return 0, false
	}
	sm := tooLargeRE.FindStringSubmatch(aerr.Reason)
	if sm == nil {
		return 0, false
	}
	n, err := strconv.Atoi(sm[1])
	return n, err == nil
}
