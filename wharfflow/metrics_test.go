package wharfflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// The metrics count committed steps by outcome and read what waits from the
// database.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := wharfflow.NewMetrics(b.pool, b.schema)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	f := wharfflow.New[counter]("metered", &wharfflow.FlowConfig{MaxAttempts: 1}).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if s.N == 1 {
				return wharfflow.Await("b", "go")
			}
			return wharfflow.Fail(nil)
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	// Two due before any runner runs: the backlog.
	ids, err := b.client.Start(ctx, f.Start(counter{N: 1}, wharfflow.StartOptions{}), f.Start(counter{N: 2}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Equal(t, 2.0, testutil.ToFloat64(gauge(t, reg, "wharf_flow_runnable")))
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, Metrics: m})
	b.waitStatus(t, ids[0], "awaiting")
	b.waitStatus(t, ids[1], "failed")
	require.Equal(t, 1.0, testutil.ToFloat64(m.StepsCounter("metered", "await")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.StepsCounter("metered", "fail")))
	require.Equal(t, 1.0, testutil.ToFloat64(gauge(t, reg, "wharf_flow_awaiting")))
	require.Equal(t, 1.0, testutil.ToFloat64(gauge(t, reg, "wharf_flow_failed")))
	require.Equal(t, 0.0, testutil.ToFloat64(gauge(t, reg, "wharf_flow_runnable")))
	n, err := testutil.GatherAndCount(reg, "wharf_flow_step_seconds")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// gauge gathers reg and returns the one sample of name as a collector.
func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: "copy"}, func() float64 { return mf.GetMetric()[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// Stats print as one readable line.
func TestStatsString(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := wharfflow.New[counter]("printed", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Next("b")
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		})
	r := b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	ids, err := b.client.Start(context.Background(), f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "done")
	require.Eventually(t, func() bool { return r.Stats().Steps() == 2 }, time.Minute, 5*time.Millisecond)
	s := fmt.Sprint(r.Stats())
	require.Regexp(t, `^steps=2 claimed=1 leased=0 signalled=0 handed_back=0 lost=0 failed=0 step_time=\S+ outcomes: done=1 next=1$`, s)
}
