package wharfsinktest_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/wharfsinktest"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// memSink is a destination in memory: the suite's reference sink, so that
// the suite itself is checked without a broker.
type memSink struct {
	mu      sync.Mutex
	got     []wharfsinktest.Received
	broken  bool
	closed  bool
	maxSize int
}

var errBroken = errors.New("memory broker is down")

func (s *memSink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	s.mu.Lock()
	defer s.mu.Unlock()
	failed := map[string]bool{}
	anyErr := false
	for i, m := range msgs {
		switch {
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		case s.closed:
			errs[i] = errors.New("memory sink is closed")
		case s.broken:
			errs[i] = errBroken
		case m.OrderingKey() != "" && failed[m.OrderingKey()]:
			errs[i] = wharf.ErrNotAttempted
		case len(m.Payload) > s.maxSize:
			errs[i] = wharf.Permanent(errors.New("too large"))
		default:
			var hs map[string]string
			if len(m.Headers) > 0 {
				hs = maps.Clone(m.Headers)
			}
			s.got = append(s.got, wharfsinktest.Received{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: hs})
			continue
		}
		anyErr = true
		failed[m.OrderingKey()] = true
	}
	if !anyErr {
		return nil
	}
	return errs
}

func (s *memSink) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func TestRunOnMemorySink(t *testing.T) {
	var mu sync.Mutex
	sinks := map[*testing.T]*memSink{}
	get := func(t *testing.T) *memSink {
		mu.Lock()
		defer mu.Unlock()
		return sinks[t]
	}
	const maxSize = 1 << 20
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink: func(t *testing.T) wharf.Sink {
			s := &memSink{maxSize: maxSize}
			mu.Lock()
			sinks[t] = s
			mu.Unlock()
			return s
		},
		Consume: func(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
			s := get(t)
			s.mu.Lock()
			defer s.mu.Unlock()
			var out []wharfsinktest.Received
			for _, r := range s.got {
				for _, tp := range topics {
					if r.Topic == tp {
						out = append(out, r)
					}
				}
			}
			return out
		},
		BreakBroker: func(t *testing.T) { s := get(t); s.mu.Lock(); s.broken = true; s.mu.Unlock() },
		HealBroker:  func(t *testing.T) { s := get(t); s.mu.Lock(); s.broken = false; s.mu.Unlock() },
		Features:    wharfsinktest.Features{MaxPayload: maxSize, SupportsHeaders: true},
	})
}
