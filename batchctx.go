package wharf

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// errLeaseEnded is the cause a sink call's context ends with when a lease of
// its lanes ends (or is about to) before the call returned.
var errLeaseEnded = errors.New("wharf: the lane's lease ended during the publish")

// batchCtx is the context of one sink call. The engine cancels it when a
// lease of the batch's lanes is about to end; in addition, Err ends it the
// moment that time has passed on this process's monotonic clock, without
// waiting for the engine loop. A process paused in the middle of a publish
// (SIGSTOP, a frozen VM, a long pause) therefore sees the lease gone at its
// very next Err check after it resumes, before the engine has run again: a
// sink that checks Err right before each write to its destination does not
// write after another relay took the lane over. Only the instructions
// between that check and the write remain exposed.
type batchCtx struct {
	context.Context
	cancel context.CancelCauseFunc
	now    func() time.Time // the relay's clock
	epoch  time.Time        // the relay's; monotonic reference
	until  atomic.Int64     // since epoch: when the earliest lease of the batch's lanes, less the margin, ends
}

func newBatchCtx(parent context.Context, now func() time.Time, epoch, until time.Time) *batchCtx {
	c := &batchCtx{now: now, epoch: epoch}
	c.Context, c.cancel = context.WithCancelCause(parent)
	c.setUntil(until)
	return c
}

// setUntil moves the end of the batch's leases (a renewal).
func (c *batchCtx) setUntil(t time.Time) { c.until.Store(int64(t.Sub(c.epoch))) }

// Err implements context.Context.
func (c *batchCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if c.now().Sub(c.epoch) >= time.Duration(c.until.Load()) {
		c.cancel(errLeaseEnded)
		return c.Context.Err()
	}
	return nil
}

// leaseEnded reports whether the call was cut short because a lease ended.
func (c *batchCtx) leaseEnded() bool { return errors.Is(context.Cause(c.Context), errLeaseEnded) }
