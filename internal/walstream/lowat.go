package walstream

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// lowatConn reads a busy stream a buffer at a time. The walsender sends
// every protocol message on its own, and a transaction with one outbox
// message is three of them (BEGIN, MESSAGE, COMMIT): a receiver that wakes
// for each arrival pays a wake-up of its network poller, a read and a
// scheduler round per message. While reads come fast (burstReads of them
// within burstWindow), the socket's SO_RCVLOWAT asks the kernel to wake
// the reader only once lowatBytes have arrived, and a read that finds
// nothing waits at most lowatWait for them before it takes what there is:
// a busy stream is read at most lowatWait late. A wait that ends with less
// than lowYield bytes come means the stream is slow again, and reads go
// back to waking for every arrival. Reads that find data return it at
// once, whatever the mode.
//
// The caller's read deadline (the next status update, or its context
// ended) is kept: a wait never goes past it, and a read ended by it
// returns its timeout.
type lowatConn struct {
	net.Conn
	raw syscall.RawConn

	mu    sync.Mutex
	outer time.Time // the read deadline the connection's user set

	busy  bool
	lowat int                   // the socket's SO_RCVLOWAT as last set
	times [burstReads]time.Time // when the last burstReads reads returned, a ring
	next  int                   // the ring's oldest entry
}

const (
	burstReads  = 16
	burstWindow = 2 * time.Millisecond
	lowatBytes  = 16 << 10
	lowatWait   = time.Millisecond
	lowYield    = 4 << 10
)

// newLowatConn wraps a TCP connection; others (a Unix socket) are returned
// as they are.
func newLowatConn(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	return &lowatConn{Conn: nc, raw: raw, lowat: 1}
}

func (c *lowatConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outer = t
	return c.Conn.SetDeadline(t)
}

func (c *lowatConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outer = t
	return c.Conn.SetReadDeadline(t)
}

// setLowat sets SO_RCVLOWAT; a socket that refuses it stays as it is (the
// reads then wake for every arrival, as without it).
func (c *lowatConn) setLowat(n int) {
	if c.lowat == n {
		return
	}
	var serr error
	if err := c.raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil || serr != nil {
		return
	}
	c.lowat = n
}

func (c *lowatConn) Read(p []byte) (int, error) {
	if !c.busy {
		n, err := c.Conn.Read(p)
		c.note(time.Now())
		return n, err
	}
	c.setLowat(lowatBytes)
	c.mu.Lock()
	outer := c.outer
	wait := time.Now().Add(lowatWait)
	if !outer.IsZero() && outer.Before(wait) {
		wait = outer
	}
	err := c.Conn.SetReadDeadline(wait)
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	outer = c.outer
	derr := c.Conn.SetReadDeadline(outer)
	c.mu.Unlock()
	if derr != nil && err == nil {
		err = derr
	}
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && (outer.IsZero() || time.Now().Before(outer)) {
		// The wait ended, not the caller's deadline: take what came.
		c.setLowat(1)
		n, err = c.Conn.Read(p)
		if n < lowYield {
			c.busy = false
		}
	}
	c.note(time.Now())
	return n, err
}

// note records that a read returned at now, and whether reads now come
// fast.
func (c *lowatConn) note(now time.Time) {
	oldest := c.times[c.next]
	c.times[c.next] = now
	c.next = (c.next + 1) % burstReads
	if !c.busy && !oldest.IsZero() && now.Sub(oldest) < burstWindow {
		c.busy = true
	}
	if !c.busy {
		c.setLowat(1)
	}
}
