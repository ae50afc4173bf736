package wharf

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Start runs the relay in the background until Stop or StopAndCancel is
// called or ctx is cancelled. Cancelling ctx stops it like StopAndCancel with
// no deadline: sink calls in flight are cancelled (their messages are
// delivered again later). For a graceful stop, call Stop. Start fails at once
// if the schema is not migrated, no Sink/Handler is configured, the relay is
// already running ([ErrRelayRunning]) or another live relay uses the same
// RelayID ([ErrRelayIDInUse]).
func (c *Client) Start(ctx context.Context) error {
	r, err := c.newRelay(ctx, false)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-ctx.Done():
			r.hardStp()
		case <-r.done:
		}
	}()
	return nil
}

// Drain runs a relay until nothing deliverable is left — no message due, none
// in flight or waiting for a retry, every lane owned by a live relay — then
// stops it and returns. Messages scheduled for later (DeliverAt) are left in
// the outbox; failing messages are retried until delivered or dead-lettered.
// Cancelling ctx stops the relay like StopAndCancel; call Stop from another
// goroutine for a graceful stop with a deadline.
func (c *Client) Drain(ctx context.Context) error {
	r, err := c.newRelay(ctx, true)
	if err != nil {
		return err
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.hardStp()
		<-r.done
		return ctx.Err()
	}
}

func (c *Client) newRelay(ctx context.Context, drain bool) (*relay, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	sink := c.cfg.Sink
	if sink == nil && c.cfg.Handler != nil {
		sink = NewHandlerSink(c.cfg.Handler, c.cfg.HandlerConcurrency)
	}
	if sink == nil {
		return nil, fmt.Errorf("wharf: Config.Sink or Config.Handler is required to run a relay")
	}
	m, err := wharfmigrate.New(c.cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := m.Check(ctx, c.pool); err != nil {
		return nil, err
	}
	wal, err := c.isWAL(ctx, pgxQueryRow(c.pool))
	if err != nil {
		return nil, err
	}
	if wal {
		// The relay delivers every message of the outbox's prefix with
		// its own credentials: only producers may write them.
		if err := wharfmigrate.CheckEmitRestricted(ctx, c.pool); err != nil {
			return nil, err
		}
	}
	sinks, route := []Sink{sink}, func(string) int { return 0 }
	if rt, ok := sink.(*Router); ok {
		sinks, route = rt.split()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.relay != nil {
		select {
		case <-c.relay.done:
		default:
			return nil, ErrRelayRunning
		}
		c.stopped = make(chan struct{})
	}
	r := newRelay(c, sinks, route, drain, wal)
	if len(sinks) == 1 {
		r.route = nil
	}
	if err := r.st.Register(ctx, c.cfg.LeaseTTL); err != nil {
		return nil, err
	}
	c.relay = r
	stopped := c.stopped
	r.start()
	go func() {
		<-r.done
		close(stopped)
	}()
	return r, nil
}

// Stop stops the relay gracefully: it stops fetching, waits for the messages at
// the sink, writes their results, and hands its lanes back so other relays
// take over at once. If ctx ends first, it escalates to StopAndCancel: sink
// calls in flight are cancelled and their messages delivered again later.
func (c *Client) Stop(ctx context.Context) error {
	r := c.current()
	if r == nil {
		return nil
	}
	r.requestStop()
	return r.wait(ctx)
}

// StopAndCancel stops the relay at once: sink calls in flight are cancelled
// (their messages are delivered again later, by this or another relay) and
// no further results are written. It waits until every sink call returned,
// then hands the lanes back; if ctx ends first (a sink that ignores its
// context) it returns and the lanes' leases expire instead.
func (c *Client) StopAndCancel(ctx context.Context) error {
	r := c.current()
	if r == nil {
		return nil
	}
	r.hardStp()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wharf: sink calls still running after StopAndCancel: %w", ctx.Err())
	}
}

func (c *Client) current() *relay {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.relay
}

// Stopped is closed when the relay has stopped.
func (c *Client) Stopped() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// Metrics returns the relay's counters and histograms (zero until a relay
// ran). They accumulate across relay runs of the client.
func (c *Client) Metrics() *Stats { return c.stats }

// NewHandlerSink adapts a handler function to a Sink: messages of one ordering
// key are handled in order, one at a time; different keys run on up to
// concurrency goroutines at once. Once ctx is done no further handler call
// starts. A handler that panics fails its message with the panic value and
// stack.
func NewHandlerSink(h HandlerFunc, concurrency int) Sink {
	if concurrency <= 0 {
		concurrency = 16
	}
	return &handlerSink{h: h, n: concurrency}
}

type handlerSink struct {
	h HandlerFunc
	n int
}

func (s *handlerSink) Publish(ctx context.Context, msgs []*Message) []error {
	// Group by ordering key, keeping order; unkeyed messages are groups of one.
	groups := make([][]int, 0, len(msgs))
	byKey := map[string]int{}
	for i, m := range msgs {
		k := m.OrderingKey()
		if k == "" {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byKey[k]
		if !ok {
			g = len(groups)
			byKey[k] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	errs := make([]error, len(msgs))
	work := make(chan []int)
	var wg sync.WaitGroup
	for w := 0; w < min(s.n, len(groups)); w++ {
		wg.Go(func() {
			for g := range work {
				failed := false
				for _, i := range g {
					switch {
					case failed:
						errs[i] = ErrNotAttempted
					case ctx.Err() != nil:
						errs[i], failed = fmt.Errorf("wharf: not handled: %w", ctx.Err()), true
					default:
						errs[i] = s.call(ctx, msgs[i])
						failed = errs[i] != nil
					}
				}
			}
		})
	}
	for _, g := range groups {
		work <- g
	}
	close(work)
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

func (s *handlerSink) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("wharf: handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return s.h(ctx, m)
}

func (s *handlerSink) Close() error { return nil }

// RelayID returns the relay id this client registers under.
func (c *Client) RelayID() string { return c.cfg.RelayID }

// BacklogEstimate returns PostgreSQL's estimate of the messages in the outbox
// (its statistics' live rows: no count, no scan; it lags by a few seconds).
func (c *Client) BacklogEstimate(ctx context.Context) (int64, error) {
	if c.pool == nil {
		return 0, ErrNoPool
	}
	var n int64
	err := c.pool.QueryRow(ctx, `SELECT coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0)`, c.cfg.Schema).Scan(&n)
	if err != nil {
		return 0, store.Wrap("backlog estimate", err)
	}
	return n, nil
}
