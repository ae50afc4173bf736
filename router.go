package wharf

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Route sends the messages whose topic matches Pattern to Sink.
//
// A pattern is a topic split on dots. A segment "*" matches exactly one
// segment of the topic, a final segment "**" matches one or more segments,
// and any other segment matches itself: "orders.*" matches "orders.created"
// but neither "orders" nor "orders.eu.created"; "orders.**" matches both of
// the latter but not "orders"; "**" matches every topic.
type Route struct {
	Pattern string
	Sink    Sink
}

// Router is a [Sink] that sends each message to the sink of the first route
// whose pattern matches its topic. It keeps the [Sink] ordering contract
// across its sinks: when a key's messages in one batch go to different sinks,
// they are published one sink after the other in id order, and once one fails
// the later ones are reported with [ErrNotAttempted]. A message no route
// matches fails with a [Permanent] error (dead-lettered; add a route, then
// retry it with `wharf dead retry`).
type Router struct {
	routes []compiledRoute
	sinks  []Sink // distinct sinks, in route order
}

type compiledRoute struct {
	pattern  string
	segments []string
	sink     int // index into Router.sinks
}

var _ Sink = (*Router)(nil)

// NewRouter returns a router over routes, tried in order. Several routes may
// share a sink; Close closes each distinct sink once.
func NewRouter(routes ...Route) (*Router, error) {
	if len(routes) == 0 {
		return nil, errors.New("wharf: NewRouter: no routes")
	}
	r := &Router{}
	index := map[Sink]int{}
	for i, rt := range routes {
		segs, err := parsePattern(rt.Pattern)
		if err != nil {
			return nil, fmt.Errorf("wharf: route %d: %w", i+1, err)
		}
		if rt.Sink == nil {
			return nil, fmt.Errorf("wharf: route %d (%q): nil sink", i+1, rt.Pattern)
		}
		n, ok := index[rt.Sink]
		if !ok {
			n = len(r.sinks)
			index[rt.Sink] = n
			r.sinks = append(r.sinks, rt.Sink)
		}
		r.routes = append(r.routes, compiledRoute{pattern: rt.Pattern, segments: segs, sink: n})
	}
	return r, nil
}

// ValidatePattern reports whether pattern is a valid route pattern, with an
// error that says what is wrong.
func ValidatePattern(pattern string) error {
	_, err := parsePattern(pattern)
	return err
}

func parsePattern(p string) ([]string, error) {
	if p == "" {
		return nil, errors.New(`empty topic pattern: use "**" to match every topic`)
	}
	segs := strings.Split(p, ".")
	for i, s := range segs {
		switch {
		case s == "":
			return nil, fmt.Errorf("topic pattern %q has an empty segment (leading, trailing or double dot)", p)
		case s == "**" && i != len(segs)-1:
			return nil, fmt.Errorf(`topic pattern %q: "**" may only be the last segment`, p)
		case s != "*" && s != "**" && strings.Contains(s, "*"):
			return nil, fmt.Errorf(`topic pattern %q: "*" must be a whole segment, as in "orders.*"`, p)
		}
	}
	return segs, nil
}

// match reports whether topic matches the pattern's segments.
func match(segs []string, topic string) bool {
	for i, s := range segs {
		if s == "**" {
			return topic != ""
		}
		seg, rest, more := strings.Cut(topic, ".")
		if seg == "" || (s != "*" && s != seg) {
			return false
		}
		if i == len(segs)-1 {
			return !more
		}
		if !more {
			return false
		}
		topic = rest
	}
	return false
}

// route returns the index of the sink a topic goes to, or -1 when no route matches.
func (r *Router) route(topic string) int {
	for _, rt := range r.routes {
		if match(rt.segments, topic) {
			return rt.sink
		}
	}
	return -1
}

// Publish routes msgs and publishes each sink's share concurrently. A key
// whose messages in the batch change sink is published in rounds: each round
// takes, for every key, its next messages up to the first one bound for a
// different sink.
func (r *Router) Publish(ctx context.Context, msgs []*Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	failed := false
	dest := make([]int, len(msgs))
	pending := make([]int, 0, len(msgs))
	for i, m := range msgs {
		dest[i] = r.route(m.Topic)
		pending = append(pending, i)
	}
	blocked := map[string]bool{} // keys with a failed message
	for len(pending) > 0 {
		groups := make([][]int, len(r.sinks))
		next := pending[:0:0]
		roundSink := map[string]int{} // sink of a key's messages in this round
		closed := map[string]bool{}   // keys whose next message waits for a later round
		for _, i := range pending {
			m := msgs[i]
			if k := m.OrderingKey(); k != "" && blocked[k] {
				errs[i], failed = ErrNotAttempted, true
				continue
			}
			if k := m.OrderingKey(); k != "" {
				if closed[k] {
					next = append(next, i)
					continue
				}
				if s, ok := roundSink[k]; ok && s != dest[i] {
					closed[k] = true
					next = append(next, i)
					continue
				}
				roundSink[k] = dest[i]
			}
			if dest[i] < 0 {
				errs[i], failed = Permanent(fmt.Errorf("no route matches topic %q: add a route for it (or a default sink), then retry the dead letter", m.Topic)), true
				if k := m.OrderingKey(); k != "" {
					blocked[k] = true
				}
				continue
			}
			groups[dest[i]] = append(groups[dest[i]], i)
		}
		if r.publishRound(ctx, msgs, groups, errs, blocked) {
			failed = true
		}
		pending = next
	}
	if !failed {
		return nil
	}
	return errs
}

// publishRound publishes each sink's group concurrently, stores the results in
// errs and blocks the keys of failed messages. It reports whether any failed.
func (r *Router) publishRound(ctx context.Context, msgs []*Message, groups [][]int, errs []error, blocked map[string]bool) bool {
	results := make([][]error, len(groups))
	var wg sync.WaitGroup
	for s, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		batch := make([]*Message, len(idx))
		for j, i := range idx {
			batch[j] = msgs[i]
		}
		if !anyOther(groups, s) {
			results[s] = r.sinks[s].Publish(ctx, batch)
			break
		}
		wg.Go(func() { results[s] = r.sinks[s].Publish(ctx, batch) })
	}
	wg.Wait()
	failed := false
	for s, idx := range groups {
		res := results[s]
		if res == nil {
			continue
		}
		if len(res) != len(idx) {
			err := fmt.Errorf("wharf: router: sink of route returned %d results for %d messages", len(res), len(idx))
			res = FailAll(len(idx), err)
		}
		for j, i := range idx {
			if res[j] == nil {
				continue
			}
			errs[i], failed = res[j], true
			if k := msgs[i].OrderingKey(); k != "" {
				blocked[k] = true
			}
		}
	}
	return failed
}

// anyOther reports whether a group other than s has messages: a round with a
// single sink publishes on the caller's goroutine.
func anyOther(groups [][]int, s int) bool {
	for o, idx := range groups {
		if o != s && len(idx) > 0 {
			return true
		}
	}
	return false
}

// split returns the router's distinct sinks and a function that gives the
// index of a topic's sink; a topic no route matches gets the index of an
// extra sink that fails it permanently. The relay dispatches to each sink
// itself (its own workers per sink), keeping per-key order across sinks by
// never having two runs of a key out at once.
func (r *Router) split() ([]Sink, func(topic string) int) {
	sinks := append(append([]Sink(nil), r.sinks...), noRouteSink{})
	none := len(r.sinks)
	return sinks, func(topic string) int {
		if i := r.route(topic); i >= 0 {
			return i
		}
		return none
	}
}

type noRouteSink struct{}

func (noRouteSink) Publish(_ context.Context, msgs []*Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = Permanent(fmt.Errorf("no route matches topic %q: add a route for it (or a default sink), then retry the dead letter", m.Topic))
	}
	return errs
}

func (noRouteSink) Close() error { return nil }

// Name labels the sink's metrics.
func (noRouteSink) Name() string { return "no_route" }

// Ping pings every sink of the router that implements [Pinger].
func (r *Router) Ping(ctx context.Context) error {
	var errs []error
	for _, s := range r.sinks {
		if p, ok := s.(Pinger); ok {
			if err := p.Ping(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Close closes every distinct sink and returns their errors joined.
func (r *Router) Close() error {
	var errs []error
	for _, s := range r.sinks {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
