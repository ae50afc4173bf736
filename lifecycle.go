package wharf

import (
	"context"
	"errors"
	"sync"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// Start runs the relay in the background until Stop is called or ctx is
// cancelled (which stops it gracefully, like Stop with no deadline). It fails
// at once if the schema is not migrated or no Sink/Handler is configured.
func (c *Client) Start(ctx context.Context) error {
	r, err := c.newRelay(ctx, false)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-ctx.Done():
			r.requestStop()
		case <-r.done:
		}
	}()
	return nil
}

// Drain runs a relay until nothing deliverable is left — no message due, none
// in flight or waiting for a retry, every lane owned by a live relay — then
// stops it and returns. Messages scheduled for later (DeliverAt) are left in
// the outbox; failing messages are retried until delivered or dead-lettered.
func (c *Client) Drain(ctx context.Context) error {
	r, err := c.newRelay(ctx, true)
	if err != nil {
		return err
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.requestStop()
		return r.wait(context.Background())
	}
}

func (c *Client) newRelay(ctx context.Context, drain bool) (*relay, error) {
	if c.pool == nil {
		return nil, errors.New("wharf: the relay needs a client created with a pool")
	}
	sink := c.cfg.Sink
	if sink == nil && c.cfg.Handler != nil {
		sink = NewHandlerSink(c.cfg.Handler, c.cfg.HandlerConcurrency)
	}
	if sink == nil {
		return nil, errors.New("wharf: Config.Sink or Config.Handler is required to run a relay")
	}
	m, err := wharfmigrate.New(c.cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := m.Check(ctx, c.pool); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.relay != nil {
		select {
		case <-c.relay.done:
		default:
			return nil, errors.New("wharf: relay already running")
		}
		c.stopped = make(chan struct{})
	}
	r := newRelay(c, sink, drain)
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
// take over at once. If ctx ends first, in-flight deliveries are abandoned
// (they will be redelivered) and the lanes are left to expire.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	r := c.relay
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	r.requestStop()
	return r.wait(ctx)
}

// Stopped is closed when the relay has stopped.
func (c *Client) Stopped() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// NewHandlerSink adapts a handler function to a Sink: messages of one key are
// handled in order, one at a time; different keys run on up to concurrency
// goroutines at once.
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
	errs := make([]error, len(msgs))
	// Group by key, keeping order; unkeyed messages are groups of one.
	groups := make([][]int, 0, len(msgs))
	byKey := map[string]int{}
	for i, m := range msgs {
		if m.Key == "" {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byKey[m.Key]
		if !ok {
			g = len(groups)
			byKey[m.Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	work := make(chan []int)
	var wg sync.WaitGroup
	for w := 0; w < min(s.n, len(groups)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range work {
				failed := false
				for _, i := range g {
					if failed {
						errs[i] = ErrNotAttempted
						continue
					}
					errs[i] = s.call(ctx, msgs[i])
					failed = errs[i] != nil
				}
			}
		}()
	}
	for _, g := range groups {
		work <- g
	}
	close(work)
	wg.Wait()
	return errs
}

func (s *handlerSink) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.New("handler panicked")
		}
	}()
	return s.h(ctx, m)
}

func (s *handlerSink) Close() error { return nil }
