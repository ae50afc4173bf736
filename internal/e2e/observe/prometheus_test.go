package observe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfprom"
)

const installPrometheus = "install it (Debian/Ubuntu: apt-get install prometheus, which also provides promtool)"

// promServer is a real Prometheus server run for one test.
type promServer struct {
	url string
}

// lockedBuffer collects a child's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPrometheus runs prometheus scraping target every second, with the
// repository's alerting rules loaded, and stops it at cleanup.
func startPrometheus(t *testing.T, target string) *promServer {
	t.Helper()
	bin := requireTool(t, "prometheus", installPrometheus)
	dir := t.TempDir()
	rules := filepath.Join(repoRoot(t), "deploy", "prometheus", "alerts.yml")
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: wharf
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Dir = dir
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	p := &promServer{url: "http://" + addr}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("prometheus exited at start: %v\n%s", err, out.String())
		default:
		}
		if code, _, err := tryGet(p.url + "/-/ready"); err == nil && code == 200 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 60s:\n%s", out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tryGet(u string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sample is one series of an instant query's result.
type sample struct {
	Metric map[string]string
	Value  float64
}

// query runs an instant query through Prometheus's HTTP API.
func (p *promServer) query(t *testing.T, q string) []sample {
	t.Helper()
	code, body, err := tryGet(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	require.NoError(t, err)
	require.Equal(t, 200, code, "query %s: %s", q, body)
	var resp struct {
		Status string
		Data   struct {
			ResultType string
			Result     []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
	require.Equal(t, "success", resp.Status, body)
	require.Equal(t, "vector", resp.Data.ResultType, body)
	var out []sample
	for _, r := range resp.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, body)
		out = append(out, sample{Metric: r.Metric, Value: v})
	}
	return out
}

// scalar is the value of a query that must return one series.
func (p *promServer) scalar(t *testing.T, q string) (float64, string) {
	res := p.query(t, q)
	if len(res) != 1 {
		return 0, fmt.Sprintf("%s returned %d series: %v", q, len(res), res)
	}
	return res[0].Value, ""
}

func TestPrometheusScrapesTheRelay(t *testing.T) {
	const n = 1000
	requireTool(t, "prometheus", installPrometheus) // before anything starts
	ctx := context.Background()
	pool, schema := migrated(t, databaseURL, 8)

	var release atomic.Bool
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:            schema,
		RelayID:           "observe-" + randHex(3),
		PollInterval:      10 * time.Millisecond,
		RebalanceInterval: 200 * time.Millisecond,
		RetryBackoff:      300 * time.Millisecond,
		MaxRetryBackoff:   300 * time.Millisecond,
		MaxAttempts:       1000,
		Logger:            slog.New(slog.DiscardHandler), // a warning per failed attempt
		Handler: func(_ context.Context, m *wharf.Message) error {
			if m.Topic == "obs.retry" && !release.Load() {
				return errors.New("not yet")
			}
			return nil
		},
	})
	require.NoError(t, err)
	target := serve(t, wharfprom.Handler(client, wharfprom.WithVersion("v0.0.0-test"), wharfprom.WithBacklogInterval(time.Second)))
	startRelay(t, client)
	prom := startPrometheus(t, target)

	eventually(t, 30*time.Second, 250*time.Millisecond, func() string {
		v, why := prom.scalar(t, `up{job="wharf"}`)
		if why != "" || v != 1 {
			return fmt.Sprintf("target not up yet (%v %s)", v, why)
		}
		return ""
	})
	info := prom.query(t, `wharf_relay_info`)
	require.Len(t, info, 1)
	require.Equal(t, client.RelayID(), info[0].Metric["relay_id"])
	require.Equal(t, "v0.0.0-test", info[0].Metric["version"])

	// Nothing due yet: the oldest-due age is 0, not absent.
	v, why := prom.scalar(t, `wharf_oldest_due_message_age_seconds`)
	require.Empty(t, why)
	require.Zero(t, v)

	// A message that keeps failing is held for its retry: positive age.
	enqueue(t, ctx, pool, client, wharf.Message{Topic: "obs.retry", Key: "k", Payload: []byte(`{}`)})
	eventually(t, 30*time.Second, 250*time.Millisecond, func() string {
		v, why := prom.scalar(t, `wharf_oldest_due_message_age_seconds`)
		if why != "" || v <= 0 {
			return fmt.Sprintf("oldest due age not positive while a message retries: %v %s", v, why)
		}
		f, why := prom.scalar(t, `wharf_delivery_failures_total{topic="obs.retry"}`)
		if why != "" || f < 1 {
			return fmt.Sprintf("no failure counted yet: %v %s", f, why)
		}
		return ""
	})

	msgs := make([]wharf.Message, n)
	for i := range msgs {
		msgs[i] = wharf.Message{Topic: "obs.ok", Key: strconv.Itoa(i % 50), Payload: []byte(`{"i":1}`)}
	}
	enqueue(t, ctx, pool, client, msgs...)
	eventually(t, 60*time.Second, 250*time.Millisecond, func() string {
		v, why := prom.scalar(t, `wharf_messages_delivered_total{topic="obs.ok"}`)
		if why != "" || v != n {
			return fmt.Sprintf("wharf_messages_delivered_total{topic=\"obs.ok\"} = %v (want %d) %s", v, n, why)
		}
		return ""
	})
	v, why = prom.scalar(t, `wharf_oldest_due_message_age_seconds`)
	require.Empty(t, why)
	require.Positive(t, v, "the retrying message is still held")

	release.Store(true)
	eventually(t, 30*time.Second, 250*time.Millisecond, func() string {
		d, why := prom.scalar(t, `sum(wharf_messages_delivered_total)`)
		if why != "" || d != n+1 {
			return fmt.Sprintf("sum(wharf_messages_delivered_total) = %v (want %d) %s", d, n+1, why)
		}
		a, why := prom.scalar(t, `wharf_oldest_due_message_age_seconds`)
		if why != "" || a != 0 {
			return fmt.Sprintf("oldest due age %v after everything was delivered (want 0) %s", a, why)
		}
		return ""
	})

	// The other series a dashboard needs arrived too.
	for _, q := range []string{
		`wharf_lanes_owned`,
		`wharf_backlog_messages`,
		`wharf_commit_to_ack_seconds_count`,
		`sum(wharf_sink_publish_seconds_count)`,
		`wharf_engine_last_loop_age_seconds`,
	} {
		eventually(t, 10*time.Second, 250*time.Millisecond, func() string {
			if res := prom.query(t, q); len(res) == 0 {
				return q + " returned nothing"
			}
			return ""
		})
	}
	lat, why := prom.scalar(t, `wharf_commit_to_ack_seconds_count`)
	require.Empty(t, why)
	require.Equal(t, float64(n+1), lat, "one latency observation per delivered message")

	// Prometheus loaded and evaluated every alerting rule without error.
	eventually(t, 20*time.Second, 500*time.Millisecond, func() string {
		_, body, err := tryGet(prom.url + "/api/v1/rules")
		if err != nil {
			return err.Error()
		}
		var resp struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name, Health, LastError string
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			return err.Error()
		}
		n := 0
		for _, g := range resp.Data.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" {
					return fmt.Sprintf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
				}
			}
		}
		if n < 10 {
			return fmt.Sprintf("only %d rules loaded", n)
		}
		return ""
	})
}

// metricRef finds metric names in PromQL: every wharf_, go_ and process_
// name (labels of wharf metrics have no such prefix).
var metricRef = regexp.MustCompile(`\b(?:wharf|go|process)_[a-zA-Z0-9_]+\b`)

// exprs collects the PromQL of a Grafana dashboard: panel targets' expr and
// template variables' query/definition.
func exprs(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				*out = append(*out, s)
				continue
			}
			exprs(e, out)
		}
	case []any:
		for _, e := range x {
			exprs(e, out)
		}
	}
}

func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	ctx := context.Background()
	root := repoRoot(t)
	pool, schema := migrated(t, databaseURL, 8)
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:       schema,
		PollInterval: 10 * time.Millisecond,
		Handler:      func(context.Context, *wharf.Message) error { return nil },
	})
	require.NoError(t, err)
	addr := serve(t, wharfprom.Handler(client))
	startRelay(t, client)
	enqueue(t, ctx, pool, client, wharf.Message{Topic: "obs.one", Key: "k", Payload: []byte(`{}`)})
	eventually(t, 30*time.Second, 50*time.Millisecond, func() string {
		if client.Metrics().Topic("obs.one").Delivered.Load() != 1 {
			return "message not delivered"
		}
		return ""
	})

	_, body := httpGet(t, "http://"+addr+"/metrics")
	exposed := map[string]bool{}
	for line := range strings.Lines(body) {
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		exposed[name] = true
	}

	var dash any
	b, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "dashboards", "wharf.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &dash), "the dashboard is valid JSON")
	var dashExprs []string
	exprs(dash, &dashExprs)

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
			}
		}
	}
	b, err = os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &rules))
	var ruleExprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			ruleExprs = append(ruleExprs, r.Expr)
		}
	}

	for file, list := range map[string][]string{"wharf.json": dashExprs, "alerts.yml": ruleExprs} {
		names := map[string]bool{}
		for _, e := range list {
			for _, n := range metricRef.FindAllString(e, -1) {
				names[n] = true
			}
		}
		var missing []string
		for n := range names {
			if !exposed[n] {
				missing = append(missing, n)
			}
		}
		sort.Strings(missing)
		require.Empty(t, missing, "%s uses metrics /metrics does not serve", file)
		atLeast := map[string]int{"wharf.json": 20, "alerts.yml": 10}[file]
		require.GreaterOrEqual(t, len(names), atLeast, "%s: too few metric names found to trust the check: %v", file, names)
	}
}

func TestPromtoolChecksRules(t *testing.T) {
	promtool := requireTool(t, "promtool", installPrometheus)
	root := repoRoot(t)
	for _, args := range [][]string{
		{"check", "rules", filepath.Join(root, "deploy", "prometheus", "alerts.yml")},
		{"check", "config", filepath.Join(root, "deploy", "prometheus", "prometheus.yml")},
		// Unit tests of the alerts: which fire on which series, and what
		// their texts say.
		{"test", "rules", filepath.Join("testdata", "alerts_test.yml")},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, promtool, args...).CombinedOutput()
		cancel()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
		require.Contains(t, string(out), "SUCCESS", "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
