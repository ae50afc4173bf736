package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// callLog records every Publish call of several sinks, in the order the
// calls happened.
type callLog struct {
	mu    sync.Mutex
	calls []string // "sink:id,id,..."
}

// logSink is a sink that records its calls and fails the ids in fail.
type logSink struct {
	name   string
	log    *callLog
	fail   map[int64]error
	closed int
}

func (s *logSink) Publish(_ context.Context, msgs []*wharf.Message) []error {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	call := s.name + ":"
	var errs []error
	for i, m := range msgs {
		if i > 0 {
			call += ","
		}
		call += fmt.Sprint(m.ID)
		if err := s.fail[m.ID]; err != nil {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = err
		}
	}
	s.log.calls = append(s.log.calls, call)
	return errs
}

func (s *logSink) Close() error { s.closed++; return nil }

func msg(id int64, topic, key string) *wharf.Message {
	return &wharf.Message{ID: id, Topic: topic, Key: key}
}

func TestRoutePatterns(t *testing.T) {
	cases := []struct {
		pattern, topic string
		want           bool
	}{
		{"orders.*", "orders.created", true},
		{"orders.*", "orders", false},
		{"orders.*", "orders.eu.created", false},
		{"orders.**", "orders.eu.created", true},
		{"orders.**", "orders.created", true},
		{"orders.**", "orders", false},
		{"orders", "orders", true},
		{"orders", "orders.created", false},
		{"*.created", "orders.created", true},
		{"*.created", "orders.updated", false},
		{"**", "anything.at.all", true},
		{"*", "one", true},
		{"*", "one.two", false},
	}
	for _, c := range cases {
		a := &logSink{name: "a", log: &callLog{}}
		r, err := wharf.NewRouter(wharf.Route{Pattern: c.pattern, Sink: a})
		require.NoError(t, err)
		errs := r.Publish(context.Background(), []*wharf.Message{msg(1, c.topic, "")})
		require.Equalf(t, c.want, errs == nil, "pattern %q, topic %q", c.pattern, c.topic)
		if !c.want {
			require.Truef(t, wharf.IsPermanent(errs[0]), "an unrouted message is a permanent failure, got %v", errs[0])
			require.Contains(t, errs[0].Error(), c.topic)
		}
	}
	for _, bad := range []string{"", "orders.", ".orders", "a..b", "orders*", "**.orders", "ord*rs.x"} {
		_, err := wharf.NewRouter(wharf.Route{Pattern: bad, Sink: &logSink{}})
		require.Errorf(t, err, "pattern %q must be refused", bad)
	}
}

// The first matching route wins; one Publish per sink; both sinks' shares
// arrive in id order.
func TestRouterSplitsByTopic(t *testing.T) {
	log := &callLog{}
	kafka := &logSink{name: "kafka", log: log}
	hooks := &logSink{name: "hooks", log: log}
	r, err := wharf.NewRouter(
		wharf.Route{Pattern: "orders.*", Sink: kafka},
		wharf.Route{Pattern: "hooks.**", Sink: hooks},
		wharf.Route{Pattern: "**", Sink: kafka},
	)
	require.NoError(t, err)
	errs := r.Publish(context.Background(), []*wharf.Message{
		msg(1, "orders.created", "a"), msg(2, "hooks.x.y", "b"), msg(3, "misc", "c"), msg(4, "orders.paid", "a"), msg(5, "hooks.z", "b"),
	})
	require.Nil(t, errs)
	require.ElementsMatch(t, []string{"kafka:1,3,4", "hooks:2,5"}, log.calls)
	require.NoError(t, r.Close())
	require.Equal(t, 1, kafka.closed, "a sink shared by two routes is closed once")
	require.Equal(t, 1, hooks.closed)
}

// A key whose messages go to two sinks is published in rounds, so the sinks
// see its messages in id order one after the other.
func TestRouterKeepsKeyOrderAcrossSinks(t *testing.T) {
	log := &callLog{}
	a := &logSink{name: "a", log: log}
	b := &logSink{name: "b", log: log}
	r, err := wharf.NewRouter(wharf.Route{Pattern: "a", Sink: a}, wharf.Route{Pattern: "b", Sink: b})
	require.NoError(t, err)
	errs := r.Publish(context.Background(), []*wharf.Message{
		msg(1, "a", "k"), msg(2, "b", "k"), msg(3, "a", "k"), msg(4, "a", "other"),
	})
	require.Nil(t, errs)
	require.Equal(t, []string{"a:1,4", "b:2", "a:3"}, log.calls)
}

// Once a key's message fails on one sink, its later messages on any sink are
// not attempted; other keys go on.
func TestRouterFailureBlocksKeyAcrossSinks(t *testing.T) {
	log := &callLog{}
	boom := errors.New("broker down")
	a := &logSink{name: "a", log: log, fail: map[int64]error{1: boom}}
	b := &logSink{name: "b", log: log}
	r, err := wharf.NewRouter(wharf.Route{Pattern: "a", Sink: a}, wharf.Route{Pattern: "b", Sink: b})
	require.NoError(t, err)
	errs := r.Publish(context.Background(), []*wharf.Message{
		msg(1, "a", "k"), msg(2, "b", "k"), msg(3, "a", "k"), msg(4, "b", "other"), msg(5, "nowhere", "j"), msg(6, "a", "j"),
	})
	require.Len(t, errs, 6)
	require.ErrorIs(t, errs[0], boom)
	require.ErrorIs(t, errs[1], wharf.ErrNotAttempted)
	require.ErrorIs(t, errs[2], wharf.ErrNotAttempted)
	require.NoError(t, errs[3])
	require.True(t, wharf.IsPermanent(errs[4]), "no route: %v", errs[4])
	require.ErrorIs(t, errs[5], wharf.ErrNotAttempted)
	require.ElementsMatch(t, []string{"a:1", "b:4"}, log.calls, "no later message of a failed key is sent")
}
