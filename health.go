package wharf

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wharfhq/wharf/internal/walstore"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Health is what liveness and readiness probes ask of a relay.
type Health struct {
	// Running: a relay runs in this client.
	Running bool
	// Live: the engine loop ran within the last few seconds (it is not
	// wedged). A stopped relay is not live.
	Live bool
	// Ready: live, the database answered a fetch or lease round recently,
	// the schema is at the version this build needs, every sink that can be
	// pinged answers, and the relay owns lanes or stands by as a spare.
	Ready bool
	// LanesOwned is how many lanes the relay owns.
	LanesOwned int
	// Spare: ready, owning no lane because live relays own them all.
	Spare bool
	// Problems says, one line each, why the relay is not live or ready.
	Problems []string
}

// Health checks the relay (see [Health]). It runs one query (the schema
// version), for an outbox in WAL mode one more (the replication slot's
// state: a missing or lost slot makes the relay not ready), and pings the
// sinks that implement [Pinger], within ctx.
func (c *Client) Health(ctx context.Context) Health {
	var h Health
	r := c.current()
	if r == nil {
		h.Problems = append(h.Problems, "no relay is running")
		return h
	}
	select {
	case <-r.done:
		h.Problems = append(h.Problems, "the relay has stopped")
		if r.err != nil {
			h.Problems = append(h.Problems, "it ended with: "+r.err.Error())
		}
		return h
	default:
	}
	h.Running = true
	now := time.Now()
	stale := max(5*time.Second, 3*c.cfg.RebalanceInterval)
	last := time.Unix(0, c.stats.LastLoop.Load())
	h.Live = now.Sub(last) < stale
	if !h.Live {
		h.Problems = append(h.Problems, fmt.Sprintf("the engine loop last ran %s ago", now.Sub(last).Round(time.Millisecond)))
	}
	ready := h.Live
	if ok := c.stats.LastDBOK.Load(); ok == 0 || now.Sub(time.Unix(0, ok)) > stale {
		ready = false
		if ok == 0 {
			h.Problems = append(h.Problems, "the database has not answered yet")
		} else {
			h.Problems = append(h.Problems, fmt.Sprintf("the database last answered %s ago", now.Sub(time.Unix(0, ok)).Round(time.Millisecond)))
		}
	} else if m, err := wharfmigrate.New(c.cfg.Schema); err == nil {
		if err := m.Check(ctx, c.pool); err != nil {
			ready = false
			h.Problems = append(h.Problems, "schema: "+err.Error())
		} else if r.wal() {
			// Enqueues are refused while the slot is missing or lost.
			if state, err := m.SlotState(ctx, c.pool); err == nil && state != wharfmigrate.SlotOK {
				ready = false
				h.Problems = append(h.Problems, fmt.Sprintf("the replication slot %s is %s: enqueues are refused until `wharf migrate up --mode wal --schema %s` creates it again", c.cfg.Schema, state, c.cfg.Schema))
			}
		}
	}
	for _, s := range r.sinks {
		p, ok := s.sink.(Pinger)
		if !ok {
			continue
		}
		if err := p.Ping(ctx); err != nil {
			ready = false
			h.Problems = append(h.Problems, fmt.Sprintf("sink %s: %v", s.stats.Name, err))
		}
	}
	h.LanesOwned = int(c.stats.LanesOwned.Load())
	if h.LanesOwned == 0 {
		if r.uncoveredLanes() > 0 {
			ready = false
			h.Problems = append(h.Problems, "owns no lane while some lanes have no live owner")
		} else {
			h.Spare = true
		}
	}
	h.Ready = ready
	return h
}

// ErrNotReady is returned by [Health.Err] for a relay that is not ready.
var ErrNotReady = errors.New("wharf: relay not ready")

// Err is nil for a ready relay, and otherwise ErrNotReady with the problems.
func (h Health) Err() error {
	if h.Ready {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrNotReady, h.Problems)
}

// wal reports whether the relay streams an outbox in WAL mode.
func (r *relay) wal() bool {
	_, ok := r.st.(*walstore.Store)
	return ok
}

func (r *relay) uncoveredLanes() int { return int(r.stats.Uncovered.Load()) }
