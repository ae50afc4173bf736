package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

var _ wharf.Pinger = (*Sink)(nil)

// Ping follows the broker: fine while it is reachable, failing while every
// connection is refused and while the broker blocks publishers, fine again
// once it is back.
func TestPingFollowsTheBroker(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := startProxy(t)
	s := openSink(t, sinkURL(withHost(t, p.addr), w.options()...))
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return s.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("ping with the broker up: %v", err)
	}
	p.breakAll(t)
	// The sink learns of the closed connection from its reader, a moment
	// after the proxy closed it; then every ping redials and is refused.
	waitFor(t, func() error {
		if err := ping(); err == nil {
			return errors.New("ping succeeded while the broker was unreachable")
		}
		return nil
	})
	p.heal(t)
	waitFor(t, func() error { return ping() })

	p.pause("low on memory")
	defer p.unpause(true)
	waitFor(t, func() error {
		if err := ping(); err == nil || !strings.Contains(err.Error(), "low on memory") {
			return fmt.Errorf("want a blocked error, got %w", err)
		}
		return nil
	})
	p.unpause(true)
	waitFor(t, func() error { return ping() })
}

// waitFor retries f until it returns nil, for up to 15 s.
func waitFor(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
