package wharf_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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
	res := wharf.NewResults(msgs)
	var sent []string
	for i, m := range msgs {
		if res.Blocked(i) {
			continue
		}
		sent = append(sent, fmt.Sprint(m.Seq))
		res.Set(i, s.fail[m.Seq])
	}
	s.log.calls = append(s.log.calls, s.name+":"+strings.Join(sent, ","))
	return res.Errors()
}

func (s *logSink) Close() error { s.closed++; return nil }

func msg(id int64, topic, key string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(id, 1), Seq: id, Topic: topic, Key: key}
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

// With the default ordering scope (topic, key), a key's messages in two
// topics are two scopes: the router sends each sink its share at once.
// Once a scope's message fails, its later messages are not attempted; other
// scopes, and other topics of the same key, go on.
func TestRouterFailureBlocksOnlyItsScope(t *testing.T) {
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
	require.NoError(t, errs[1], "topic b of key k is another scope")
	require.ErrorIs(t, errs[2], wharf.ErrNotAttempted)
	require.NoError(t, errs[3])
	require.True(t, wharf.IsPermanent(errs[4]), "no route: %v", errs[4])
	require.NoError(t, errs[5], "topic a of key j is another scope than the unroutable one")
	require.ElementsMatch(t, []string{"a:1,6", "b:2,4"}, log.calls, "no later message of a failed scope is sent")
}

// orderSink records, per sink, the seqs it was given and fails a seq once.
type orderSink struct {
	name    string
	mu      *sync.Mutex
	log     *[]string
	failAt  int64
	failed  bool
	running *map[string]bool
}

func (s *orderSink) Publish(_ context.Context, msgs []*wharf.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		s.mu.Lock()
		if (*s.running)[m.Key] {
			s.mu.Unlock()
			panic("two batches of one key at a sink at once")
		}
		(*s.running)[m.Key] = true
		s.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		s.mu.Lock()
		(*s.running)[m.Key] = false
		if m.Seq == s.failAt && !s.failed {
			s.failed = true
			errs[i] = errors.New("refused once")
			for j := i + 1; j < len(msgs); j++ {
				errs[j] = wharf.ErrNotAttempted
			}
			s.mu.Unlock()
			return errs
		}
		*s.log = append(*s.log, fmt.Sprintf("%s:%s:%d", s.name, m.Key, m.Seq))
		s.mu.Unlock()
	}
	return nil
}

func (s *orderSink) Close() error { return nil }

// With Config.OrderAcrossTopics a key's messages in topics routed to two
// sinks are delivered in seq order across the sinks, through a failure: the
// relay never has two runs of a key out at once, and a run never spans sinks.
func TestRelayOrdersAcrossTopicsAndSinks(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var mu sync.Mutex
	var log []string
	running := map[string]bool{}
	sa := &orderSink{name: "a", mu: &mu, log: &log, running: &running}
	sb := &orderSink{name: "b", mu: &mu, log: &log, running: &running}
	router, err := wharf.NewRouter(wharf.Route{Pattern: "a", Sink: sa}, wharf.Route{Pattern: "b", Sink: sb})
	require.NoError(t, err)
	cfg := testConfig(b.schema)
	cfg.Sink = router
	cfg.OrderAcrossTopics = true
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	var msgs []wharf.Message
	for i := 0; i < 60; i++ {
		topic := "a"
		if i%3 == 1 {
			topic = "b"
		}
		msgs = append(msgs, wharf.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%2), Payload: []byte("1")})
	}
	ids, err := client.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	seq5, _, _ := wharf.ParseID(ids[5]) // topic a... i=5: 5%3=2 -> a, key k1
	sa.failAt = seq5
	require.NoError(t, client.Drain(ctx))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, log, 60)
	last := map[string]int64{}
	for _, e := range log {
		var sink, key string
		var seq int64
		_, err := fmt.Sscanf(strings.ReplaceAll(e, ":", " "), "%s %s %d", &sink, &key, &seq)
		require.NoError(t, err)
		require.Greaterf(t, seq, last[key], "key %s: %s after seq %d", key, e, last[key])
		last[key] = seq
	}
	require.True(t, sa.failed)
}
