package wharfflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// logRecords is a slog handler keeping the records at Warn and above.
type logRecords struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newLogRecords() (*slog.Logger, func() []string) {
	h := logRecords{mu: &sync.Mutex{}, msgs: &[]string{}}
	return slog.New(h), func() []string {
		h.mu.Lock()
		defer h.mu.Unlock()
		return append([]string(nil), *h.msgs...)
	}
}

func (h logRecords) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	*h.msgs = append(*h.msgs, b.String())
	h.mu.Unlock()
	return nil
}
func (h logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logRecords) WithGroup(string) slog.Handler      { return h }

// perKey tracks how many steps of each key run at once, and the most.
type perKey struct {
	mu   sync.Mutex
	cur  map[string]int
	most map[string]int
	runs map[int64]int
}

func newPerKey() *perKey {
	return &perKey{cur: map[string]int{}, most: map[string]int{}, runs: map[int64]int{}}
}

func (p *perKey) enter(key string, id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur[key]++
	p.most[key] = max(p.most[key], p.cur[key])
	p.runs[id]++
}

func (p *perKey) leave(key string) {
	p.mu.Lock()
	p.cur[key]--
	p.mu.Unlock()
}

type keyed struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// Three runners run children on four concurrency keys of limit 2: no
// deadlock between their claims and writes (the keys are locked in one
// order, after the rows), never more than two steps of a key at once, each
// child once, and every parent joins.
func TestConcurrencyKeysHoldAcrossRunnersWithoutDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	track := newPerKey()
	child := wharfflow.New[keyed]("keyed-child", nil).Step("work", func(ctx context.Context, s *keyed, in wharfflow.Input) wharfflow.Outcome {
		track.enter(s.Key, in.Instance)
		defer track.leave(s.Key)
		time.Sleep(time.Millisecond) // a step that takes a while: more overlap
		return wharfflow.Done(nil)
	})
	parent := wharfflow.New[keyed]("keyed-parent", nil).
		Step("fan", func(ctx context.Context, s *keyed, in wharfflow.Input) wharfflow.Outcome {
			kids := make([]wharfflow.Child, 3)
			for i := range kids {
				k := fmt.Sprintf("k%d", (s.N+i)%4)
				kids[i] = child.Child(keyed{Key: k}, wharfflow.Options{ConcurrencyKey: k, ConcurrencyLimit: 2})
			}
			return wharfflow.Spawn("join", kids...)
		}).
		Step("join", func(ctx context.Context, s *keyed, in wharfflow.Input) wharfflow.Outcome {
			if len(in.Children) != 3 {
				return wharfflow.Fail(fmt.Errorf("%d children", len(in.Children)))
			}
			return wharfflow.Done(nil)
		})
	var logs []func() []string
	for i := range 3 {
		logger, records := newLogRecords()
		logs = append(logs, records)
		b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{parent, child}, RunnerID: fmt.Sprintf("keyed-%d", i),
			MaxInFlight: 16, Logger: logger})
	}
	starts := make([]wharfflow.Start, 90)
	for i := range starts {
		starts[i] = parent.Start(keyed{N: i}, wharfflow.StartOptions{})
	}
	ids, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for _, id := range ids {
		b.waitStatus(t, id, "done")
	}
	track.mu.Lock()
	defer track.mu.Unlock()
	require.Len(t, track.runs, 270)
	for id, n := range track.runs {
		require.Equal(t, 1, n, "child %d ran %d times", id, n)
	}
	for k, n := range track.most {
		require.LessOrEqual(t, n, 2, "key %s ran %d steps at once", k, n)
	}
	for i, records := range logs {
		require.Empty(t, records(), "runner %d logged warnings (a deadlock, a failed claim or write)", i)
	}
}

// A key's limit is the key's: the first instance of it a claim sees sets it
// (its ConcurrencyLimit), and instances started later with a higher limit
// do not get past it; Config.ConcurrencyLimits sets it for every instance.
func TestConcurrencyLimitIsTheKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		config     map[string]int
		first, now int // the limits the blocking instance and the others are started with
		want       int
	}{
		{"first instance's", nil, 2, 10, 2},
		{"configured", map[string]int{"shared": 1}, 5, 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			track := newPerKey()
			hold, started := make(chan struct{}), make(chan struct{}, 1)
			f := wharfflow.New[keyed]("limited", nil).Step("work", func(ctx context.Context, s *keyed, in wharfflow.Input) wharfflow.Outcome {
				track.enter("shared", in.Instance)
				defer track.leave("shared")
				if s.N == -1 {
					started <- struct{}{}
					<-hold
				}
				time.Sleep(time.Millisecond)
				return wharfflow.Done(nil)
			})
			b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, ConcurrencyLimits: tc.config})
			first, err := b.client.Start(ctx, f.Start(keyed{N: -1}, wharfflow.StartOptions{
				Options: wharfflow.Options{ConcurrencyKey: "shared", ConcurrencyLimit: tc.first}}))
			require.NoError(t, err)
			<-started
			starts := make([]wharfflow.Start, 30)
			for i := range starts {
				starts[i] = f.Start(keyed{N: i}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "shared", ConcurrencyLimit: tc.now}})
			}
			ids, err := b.client.Start(ctx, starts...)
			require.NoError(t, err)
			if tc.want > 1 {
				// The others run beside the blocking one, tc.want - 1 at a time.
				for _, id := range ids {
					b.waitStatus(t, id, "done")
				}
			}
			close(hold)
			b.waitStatus(t, first[0], "done")
			for _, id := range ids {
				b.waitStatus(t, id, "done")
			}
			var limit int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT concurrency_limit FROM "+b.schema+".flow_keys WHERE key = 'shared'").Scan(&limit))
			require.Equal(t, tc.want, limit)
			track.mu.Lock()
			defer track.mu.Unlock()
			require.Equal(t, tc.want, track.most["shared"], "steps of the key at once")
		})
	}
}

// An instance on a full concurrency key that a signal resumes waits for a
// slot, and runs as soon as the step holding the slot ends (its write wakes
// it), not when a lease ends (an hour here); likewise when the step holding
// the slot is cancelled.
func TestKeyedStepRunsWhenItsKeyFrees(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"ends", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			hold, started := make(chan struct{}), make(chan struct{}, 1)
			holder := wharfflow.New[counter]("holder", nil).Step("hold", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
				started <- struct{}{}
				select {
				case <-hold:
				case <-ctx.Done():
				}
				return wharfflow.Done(nil)
			})
			waiter := signalFlow("waiter", nil)
			b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{holder, waiter}, LeaseTTL: time.Hour})
			opts := wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: "one"}}
			w, err := b.client.Start(ctx, waiter.Start(counter{}, opts))
			require.NoError(t, err)
			b.waitStatus(t, w[0], "awaiting")
			h, err := b.client.Start(ctx, holder.Start(counter{}, opts))
			require.NoError(t, err)
			<-started
			b.sendGo(t, w)
			// The claim finds the key full and puts the waiter off.
			require.Eventually(t, func() bool {
				var waiting bool
				require.NoError(t, b.pool.QueryRow(ctx, "SELECT waiting_key FROM "+b.schema+".flow_instances WHERE id = $1", w[0]).Scan(&waiting))
				return waiting
			}, time.Minute, 5*time.Millisecond)
			if how == "ends" {
				close(hold)
				b.waitStatus(t, h[0], "done")
			} else {
				_, err := b.client.Cancel(ctx, h[0])
				require.NoError(t, err)
				defer close(hold)
			}
			b.requireDoneWithPayloads(t, w)
		})
	}
}
