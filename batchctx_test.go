package wharf

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A sink call's context ends at its lanes' lease end by itself, at the first
// Err after that time, although nothing cancelled it: what a process paused
// inside a publish sees when it resumes, before the engine loop ran again.
func TestBatchCtxEndsAtLeaseEndWithoutTheEngine(t *testing.T) {
	epoch := time.Now()
	c := newBatchCtx(context.Background(), time.Now, epoch, time.Now().Add(50*time.Millisecond))
	if err := c.Err(); err != nil {
		t.Fatalf("Err before the lease end: %v", err)
	}
	time.Sleep(60 * time.Millisecond) // nobody cancels c meanwhile
	select {
	case <-c.Done():
		t.Fatal("Done closed before anyone looked: nothing should have run")
	default:
	}
	if err := c.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after the lease end = %v, want context.Canceled", err)
	}
	select {
	case <-c.Done(): // Err and Done agree, as the context contract asks
	default:
		t.Fatal("Err reported the end but Done is still open")
	}
	if !c.leaseEnded() || !errors.Is(context.Cause(c), errLeaseEnded) {
		t.Fatalf("cause = %v, want errLeaseEnded", context.Cause(c))
	}
}

// A renewal moves the end: the call goes on past the first lease end.
func TestBatchCtxRenewalMovesTheEnd(t *testing.T) {
	epoch := time.Now()
	c := newBatchCtx(context.Background(), time.Now, epoch, time.Now().Add(30*time.Millisecond))
	c.setUntil(time.Now().Add(time.Hour))
	time.Sleep(40 * time.Millisecond)
	if err := c.Err(); err != nil {
		t.Fatalf("Err after a renewal: %v", err)
	}
	c.cancel(nil)
	if c.Err() == nil || c.leaseEnded() {
		t.Fatalf("a plain cancel: Err %v, leaseEnded %v", c.Err(), c.leaseEnded())
	}
}

// Values and cancellation of the parent pass through.
func TestBatchCtxParent(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	c := newBatchCtx(parent, time.Now, time.Now(), time.Now().Add(time.Hour))
	if c.Value(key{}) != "v" {
		t.Fatal("value of the parent lost")
	}
	cancel()
	if !errors.Is(c.Err(), context.Canceled) || c.leaseEnded() {
		t.Fatalf("parent cancelled: Err %v, leaseEnded %v", c.Err(), c.leaseEnded())
	}
}
