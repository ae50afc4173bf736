package wharfprom

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// idleClient is a client with no pool and no relay: its counters are the
// ones a test sets.
func idleClient(t *testing.T) *wharf.Client {
	t.Helper()
	c, err := wharf.NewClient(nil, &wharf.Config{RelayID: "relay-a"})
	require.NoError(t, err)
	return c
}

func gather(t *testing.T, col prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func TestMetricNamesPassPromlint(t *testing.T) {
	c := idleClient(t)
	c.Metrics().Topic("orders").Delivered.Add(1)
	c.Metrics().LastLoop.Store(time.Now().UnixNano())
	c.Metrics().LastDBOK.Store(time.Now().UnixNano())
	problems, err := testutil.CollectAndLint(NewCollector(c))
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestCollectorExportsTheStats(t *testing.T) {
	c := idleClient(t)
	s := c.Metrics()
	s.Topic("orders").Delivered.Add(5)
	s.Topic("orders").FailedAttempts.Add(2)
	s.Topic("refunds").DeadLettered.Add(1)
	s.Duplicates.Add(3)
	s.Resent.Add(4)
	s.SinkErrors.Add(6)
	s.DBErrors.Add(7)
	s.LeaseRenewals.Add(8)
	s.LeaseLosses.Add(9)
	s.Rewinds.Add(10)
	s.InFlight.Store(11)
	s.Buffered.Store(12)
	s.BufferedBytes.Store(13)
	s.Held.Store(14)
	s.LanesOwned.Store(15)
	s.Uncovered.Store(16)
	s.WALLagBytes.Store(17)
	s.WALHeldBytes.Store(18)
	s.WALSlotGone.Store(1)
	s.WALLag.Store(int64(2500 * time.Millisecond))
	now := time.Unix(1_800_000_000, 0)
	s.OldestDue.Store(now.Add(-90 * time.Second).UnixNano())
	s.LastLoop.Store(now.Add(-2 * time.Second).UnixNano())
	s.LastDBOK.Store(now.Add(-3 * time.Second).UnixNano())

	o := newOptions([]Option{WithVersion("v9.9.9")})
	o.now = func() time.Time { return now }
	got := gather(t, newCollector(c, o))

	value := func(name string, want map[string]string) float64 {
		t.Helper()
		mf, ok := got[name]
		require.True(t, ok, "metric %s missing", name)
		for _, m := range mf.GetMetric() {
			if l := labels(m); len(want) == len(l) {
				match := true
				for k, v := range want {
					match = match && l[k] == v
				}
				if !match {
					continue
				}
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("%s%v not found in %v", name, want, mf)
		return 0
	}
	require.Equal(t, 1.0, value("wharf_relay_info", map[string]string{"version": "v9.9.9", "relay_id": "relay-a"}))
	require.Equal(t, 5.0, value("wharf_messages_delivered_total", map[string]string{"topic": "orders"}))
	require.Equal(t, 0.0, value("wharf_messages_delivered_total", map[string]string{"topic": "refunds"}))
	require.Equal(t, 2.0, value("wharf_delivery_failures_total", map[string]string{"topic": "orders"}))
	require.Equal(t, 1.0, value("wharf_dead_lettered_total", map[string]string{"topic": "refunds"}))
	for name, want := range map[string]float64{
		"wharf_duplicate_acks_total":              3,
		"wharf_resent_total":                      4,
		"wharf_failed_publishes_total":            6,
		"wharf_database_errors_total":             7,
		"wharf_lease_renewals_total":              8,
		"wharf_lease_losses_total":                9,
		"wharf_rewinds_total":                     10,
		"wharf_messages_in_flight":                11,
		"wharf_messages_buffered":                 12,
		"wharf_buffered_payload_bytes":            13,
		"wharf_messages_held":                     14,
		"wharf_lanes_owned":                       15,
		"wharf_lanes_uncovered":                   16,
		"wharf_wal_lag_bytes":                     17,
		"wharf_wal_held_bytes":                    18,
		"wharf_wal_slot_gone":                     1,
		"wharf_wal_lag_seconds":                   2.5,
		"wharf_oldest_due_message_age_seconds":    90,
		"wharf_engine_last_loop_age_seconds":      2,
		"wharf_database_last_success_age_seconds": 3,
	} {
		require.Equal(t, want, value(name, nil), name)
	}
	for _, name := range []string{"wharf_commit_to_ack_seconds", "wharf_fetch_seconds", "wharf_fetch_rows", "wharf_removal_batch_size", "wharf_result_write_seconds"} {
		require.Equal(t, dto.MetricType_HISTOGRAM, got[name].GetType(), name)
		h := got[name].GetMetric()[0].GetHistogram()
		require.Zero(t, h.GetSampleCount())
		require.NotEmpty(t, h.GetBucket(), "%s has its buckets", name)
	}
	// No pool: the estimate cannot be read, and is left out rather than
	// failing the scrape or showing a made-up 0.
	require.NotContains(t, got, "wharf_backlog_messages")

	s.OldestDue.Store(0)
	got = gather(t, newCollector(c, o))
	require.Equal(t, 0.0, value("wharf_oldest_due_message_age_seconds", nil), "0 when no message is due")
}

func TestCollectorLeavesOutAgesOfARelayThatNeverRan(t *testing.T) {
	got := gather(t, NewCollector(idleClient(t)))
	require.NotContains(t, got, "wharf_engine_last_loop_age_seconds")
	require.NotContains(t, got, "wharf_database_last_success_age_seconds")
	require.Contains(t, got, "wharf_oldest_due_message_age_seconds")
}

func TestTopicLabelsAreCapped(t *testing.T) {
	c := idleClient(t)
	for i := range wharf.MaxTopicLabels + 50 {
		c.Metrics().Topic("t" + strings.Repeat("x", i)).Delivered.Add(1)
	}
	got := gather(t, NewCollector(c))
	mf := got["wharf_messages_delivered_total"]
	require.Len(t, mf.GetMetric(), wharf.MaxTopicLabels+1)
	var other float64
	for _, m := range mf.GetMetric() {
		if labels(m)["topic"] == wharf.OtherTopics {
			other = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, 50.0, other)
}

func TestBuildVersionHasAValue(t *testing.T) {
	require.NotEmpty(t, buildVersion())
	require.Equal(t, "v1", newOptions([]Option{WithVersion("v1")}).version)
	require.Equal(t, time.Second, newOptions([]Option{WithBacklogInterval(time.Millisecond)}).backlogInterval)
}

func get(t *testing.T, h http.Handler, path string) (int, string, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Code, string(b), rec.Result().Header
}

func TestProbesOfAClientWithoutRelay(t *testing.T) {
	h := Handler(idleClient(t))

	code, body, hdr := get(t, h, "/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	var live map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &live))
	require.Equal(t, map[string]any{
		"live": false, "running": false, "relay_id": "relay-a", "problems": []any{"no relay is running"},
	}, live)

	code, body, _ = get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	var ready map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.Equal(t, map[string]any{
		"ready": false, "live": false, "running": false, "spare": false, "lanes_owned": 0.0,
		"relay_id": "relay-a", "problems": []any{"no relay is running"},
	}, ready)

	code, _, _ = get(t, h, "/nothing")
	require.Equal(t, http.StatusNotFound, code)
}

func TestMetricsEndpointServesWharfGoAndProcessMetrics(t *testing.T) {
	code, body, hdr := get(t, Handler(idleClient(t)), "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, hdr.Get("Content-Type"), "text/plain")
	for _, name := range []string{"wharf_relay_info{", "wharf_lanes_owned ", "go_goroutines ", "process_cpu_seconds_total "} {
		require.Contains(t, body, "\n"+name)
	}
}

// BenchmarkScrape is the CPU one scrape of /metrics costs (all wharf
// metrics with the full 100 topic labels, plus the Go and process
// collectors): scraped every second, it is that fraction of one core.
func BenchmarkScrape(b *testing.B) {
	c, err := wharf.NewClient(nil, &wharf.Config{})
	require.NoError(b, err)
	for i := range wharf.MaxTopicLabels {
		c.Metrics().Topic("topic." + strings.Repeat("x", i)).Delivered.Add(int64(i))
	}
	c.Metrics().LastLoop.Store(time.Now().UnixNano())
	h := Handler(c)
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
	}
}
