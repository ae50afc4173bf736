package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// connection is one AMQP connection and what the broker said about it.
type connection struct {
	c    *amqp.Connection
	nc   *guardedConn
	done chan struct{} // closed once the connection closed

	mu        sync.Mutex
	err       error         // why it closed
	blocked   string        // the alarm while the broker blocks the connection
	unblocked chan struct{} // closed when the block ends; nil when not blocked
}

func (cn *connection) isClosed() bool {
	select {
	case <-cn.done:
		return true
	default:
		return cn.c.IsClosed()
	}
}

func (cn *connection) closeErr() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

func (cn *connection) blockedState() (string, chan struct{}) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.blocked, cn.unblocked
}

// kill closes the socket: a pending write fails and the connection shuts
// down.
func (cn *connection) kill() { _ = cn.nc.Close() }

// watch follows the connection's blocked and closed notifications.
func (cn *connection) watch(closes chan *amqp.Error, blocks chan amqp.Blocking) {
	for {
		select {
		case bl, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			cn.mu.Lock()
			switch {
			case bl.Active && cn.unblocked == nil:
				cn.blocked, cn.unblocked = bl.Reason, make(chan struct{})
			case !bl.Active && cn.unblocked != nil:
				close(cn.unblocked)
				cn.blocked, cn.unblocked = "", nil
			}
			cn.mu.Unlock()
		case e, ok := <-closes:
			cn.mu.Lock()
			if ok && e != nil {
				cn.err = fmt.Errorf("connection closed: %w", e)
			} else {
				cn.err = errors.New("connection closed")
			}
			if cn.unblocked != nil {
				close(cn.unblocked)
				cn.blocked, cn.unblocked = "", nil
			}
			cn.mu.Unlock()
			close(cn.done)
			return
		}
	}
}

// guardedConn bounds every write: a write the broker does not take within
// the timeout fails, and amqp091-go then closes the connection.
type guardedConn struct {
	net.Conn
	timeout time.Duration
}

func (g *guardedConn) Write(p []byte) (int, error) {
	if err := g.SetWriteDeadline(time.Now().Add(g.timeout)); err != nil {
		return 0, err
	}
	return g.Conn.Write(p)
}

// pubChannel is a channel in confirm mode and its confirms and returns.
type pubChannel struct {
	cn      *connection
	ch      *amqp.Channel
	events  chan struct{} // a confirm came or the channel closed
	writing atomic.Bool   // a publish is being written
	blamed  bool          // a too-large payload was blamed for the close

	mu        sync.Mutex
	confirmed uint64                 // every tag up to this one is confirmed
	returned  map[string]amqp.Return // returns by message-id, of the current Publish
	closed    bool
	err       error // why it closed
}

// reset forgets a previous Publish's returns.
func (pc *pubChannel) reset() {
	pc.mu.Lock()
	clear(pc.returned)
	pc.mu.Unlock()
	pc.blamed = false
}

func (pc *pubChannel) signal() {
	select {
	case pc.events <- struct{}{}:
	default:
	}
}

func (pc *pubChannel) isClosed() bool {
	closed, _ := pc.closedState()
	return closed || pc.cn.isClosed()
}

func (pc *pubChannel) closedState() (bool, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.closed, pc.err
}

// closeError explains a failed publish by the channel's or connection's
// close, which amqp091-go reports a moment after the publish fails.
func (pc *pubChannel) closeError(ctx context.Context, err error) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		if closed, cerr := pc.closedState(); closed && cerr != nil {
			return cerr
		}
		select {
		case <-pc.events:
		case <-t.C:
			if cerr := pc.cn.closeErr(); cerr != nil {
				return cerr
			}
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// outcome reports whether the message published as dc with message-id id
// was confirmed and, if so, nacked or returned.
//
// Whether it was acked or nacked comes from dc, not from the confirms the
// listener sees: RabbitMQ may nack a message out of order (a queue with
// x-overflow=reject-publish refuses it while earlier ones await their disk
// write) and then ack the others with one multiple ack, which amqp091-go
// hands to confirm listeners as an ack of every tag up to it, the nacked
// one included. Its DeferredConfirmation keeps the nack.
func (pc *pubChannel) outcome(dc *amqp.DeferredConfirmation, id string) (confirmed, nacked bool, ret amqp.Return, returned bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.confirmed < dc.DeliveryTag {
		return false, false, ret, false
	}
	ret, returned = pc.returned[id]
	// amqp091-go settles dc before it notifies the listener.
	return true, !dc.Acked(), ret, returned
}

// listen records the channel's returns and confirms. A basic.return comes
// before the confirm of its message, and amqp091-go hands them over in that
// order from one goroutine, so the returns waiting in their buffer are taken
// before each confirm.
func (pc *pubChannel) listen(confirms chan amqp.Confirmation, returns chan amqp.Return, closes chan *amqp.Error) {
	takeReturn := func(r amqp.Return) {
		pc.mu.Lock()
		pc.returned[r.MessageId] = r
		pc.mu.Unlock()
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			takeReturn(r)
		case c, ok := <-confirms:
			if !ok {
				what := "channel closed"
				if pc.cn.c.IsClosed() {
					what = "connection closed"
				}
				err := errors.New(what)
				select {
				case e, ok := <-closes:
					if ok && e != nil {
						err = fmt.Errorf("%s: %w", what, e)
					}
				default:
				}
				pc.mu.Lock()
				pc.closed, pc.err = true, err
				pc.mu.Unlock()
				pc.signal()
				return
			}
			for drained := false; !drained; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns, drained = nil, true
					} else {
						takeReturn(r)
					}
				default:
					drained = true
				}
			}
			pc.mu.Lock()
			if c.DeliveryTag > pc.confirmed {
				pc.confirmed = c.DeliveryTag
			}
			pc.mu.Unlock()
			pc.signal()
		}
	}
}

// connection returns the open connection, dialling one when there is none.
func (s *Sink) connection(ctx context.Context) (*connection, error) {
	s.mu.Lock()
	cn, closed := s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cn != nil && !cn.isClosed() {
		return cn, nil
	}
	select {
	case s.dialSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wharfamqp: waiting to connect to %s: %w", s.where, ctxErr(ctx))
	}
	defer func() { <-s.dialSem }()
	s.mu.Lock()
	cn, closed = s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cn != nil && !cn.isClosed() {
		return cn, nil // another Publish dialled
	}
	return s.dial(ctx)
}

func (s *Sink) dial(ctx context.Context) (*connection, error) {
	deadline := time.Now().Add(s.opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var gc atomic.Pointer[guardedConn]
	cfg := s.config
	cfg.Properties = make(amqp.Table, len(s.config.Properties)) // amqp091-go writes to it
	for k, v := range s.config.Properties {
		cfg.Properties[k] = v
	}
	userDial := s.config.Dial
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if userDial != nil {
			c, err = userDial(network, addr)
		} else {
			d := net.Dialer{Deadline: deadline}
			c, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		// Bounds the TLS and AMQP handshakes; amqp091-go clears it after.
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		g := &guardedConn{Conn: c, timeout: s.opts.ConfirmTimeout}
		gc.Store(g)
		return g, nil
	}
	stop := context.AfterFunc(ctx, func() {
		if g := gc.Load(); g != nil {
			_ = g.Close()
		}
	})
	c, err := amqp.DialConfig(s.uri, cfg)
	if !stop() && err == nil {
		// ctx ended as the handshake completed: the socket is closed.
		_ = c.Close()
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctxErr(ctx)
		}
		return nil, fmt.Errorf("wharfamqp: cannot connect to %s: %w", s.where, err)
	}
	cn := &connection{c: c, nc: gc.Load(), done: make(chan struct{})}
	if fs := c.Config.FrameSize; fs > 0 {
		s.frameMax.Store(int64(fs))
	} else {
		s.frameMax.Store(math.MaxInt32) // no limit negotiated
	}
	closes := c.NotifyClose(make(chan *amqp.Error, 1))
	blocks := c.NotifyBlocked(make(chan amqp.Blocking, 4))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		t := time.AfterFunc(closeTimeout, cn.kill)
		_ = c.Close()
		t.Stop()
		return nil, errClosed
	}
	s.conn = cn
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		cn.watch(closes, blocks)
	}()
	return cn, nil
}

// acquire takes an idle channel, or opens one.
func (s *Sink) acquire(ctx context.Context) (*pubChannel, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		var pc *pubChannel
		if n := len(s.idle); n > 0 {
			pc = s.idle[n-1]
			s.idle = s.idle[:n-1]
		}
		s.mu.Unlock()
		if pc == nil {
			break
		}
		if !pc.isClosed() {
			return pc, nil
		}
		s.discard(pc)
	}
	cn, err := s.connection(ctx)
	if err != nil {
		return nil, err
	}
	return s.openChannel(ctx, cn)
}

// openChannel opens a channel in confirm mode. The two round trips are
// bounded by the dial timeout and ctx: past them the connection is closed.
func (s *Sink) openChannel(ctx context.Context, cn *connection) (*pubChannel, error) {
	var killed atomic.Bool
	kill := func() { killed.Store(true); cn.kill() }
	timer := time.AfterFunc(s.opts.DialTimeout, kill)
	stop := context.AfterFunc(ctx, kill)
	ch, err := cn.c.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			_ = ch.Close()
		}
	}
	timer.Stop()
	stop()
	if killed.Load() {
		if err == nil {
			_ = ch.Close()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wharfamqp: opening a channel: %w", ctxErr(ctx))
		}
		return nil, fmt.Errorf("wharfamqp: opening a channel took over dial_timeout %s: connection closed", s.opts.DialTimeout)
	}
	if err != nil {
		if cerr := cn.closeErr(); cerr != nil {
			err = cerr
		}
		return nil, fmt.Errorf("wharfamqp: opening a channel: %w", err)
	}
	pc := &pubChannel{
		cn:       cn,
		ch:       ch,
		events:   make(chan struct{}, 1),
		returned: map[string]amqp.Return{},
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ch.Close()
		return nil, errClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		pc.listen(confirms, returns, closes)
	}()
	return pc, nil
}

// release puts a healthy channel back in the pool.
func (s *Sink) release(pc *pubChannel) {
	s.mu.Lock()
	if !s.closed && len(s.idle) < maxIdleChannels && !pc.isClosed() {
		s.idle = append(s.idle, pc)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.discard(pc)
}

// discard closes a channel in the background: channel.close waits for the
// broker's answer, which a stalled broker may not give until the connection
// dies.
func (s *Sink) discard(pc *pubChannel) {
	if pc.isClosed() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return // closing the connection closes the channel
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		_ = pc.ch.Close()
	}()
}

// Close closes the connection; Publish calls still waiting for confirms
// fail. It is idempotent.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		cn := s.conn
		s.conn, s.idle = nil, nil
		s.mu.Unlock()
		if cn != nil && !cn.c.IsClosed() {
			// A stalled broker may never answer connection.close (and its
			// heartbeats defeat a read deadline): cut it short.
			t := time.AfterFunc(closeTimeout, cn.kill)
			_ = cn.c.Close()
			t.Stop()
		}
		s.wg.Wait()
	})
	return nil
}

// Ping reports whether RabbitMQ is reachable: an open connection, dialled now
// if there is none, that the broker has not blocked (connection.blocked: a
// memory or disk alarm, during which publishes wait). It implements
// [wharf.Pinger], which readiness probes use.
func (s *Sink) Ping(ctx context.Context) error {
	cn, err := s.connection(ctx)
	if err != nil {
		return err
	}
	if reason, _ := cn.blockedState(); reason != "" {
		return fmt.Errorf("wharfamqp: %s blocked publishing: %s", s.where, reason)
	}
	return nil
}
