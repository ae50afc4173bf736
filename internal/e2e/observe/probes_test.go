package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfprom"
)

type probeBody struct {
	Ready      *bool    `json:"ready"`
	Live       bool     `json:"live"`
	Running    bool     `json:"running"`
	Spare      *bool    `json:"spare"`
	LanesOwned *int     `json:"lanes_owned"`
	RelayID    string   `json:"relay_id"`
	Problems   []string `json:"problems"`
}

func probe(t *testing.T, url string) (int, probeBody) {
	t.Helper()
	code, body := httpGet(t, url)
	var p probeBody
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	return code, p
}

func TestReadyzFollowsTheDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A cluster of its own: the test stops it.
	cluster, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	// Registered after the cluster's cleanup, so it runs first: the schema
	// drop and pool close need the server.
	pool, schema := migrated(t, cluster.URL(), 8)

	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema:            schema,
		RelayID:           "readyz-" + randHex(3),
		PollInterval:      10 * time.Millisecond,
		RebalanceInterval: 200 * time.Millisecond,
		LeaseTTL:          3 * time.Second,
		Handler:           func(context.Context, *wharf.Message) error { return nil },
		// The outage below makes it log an error per retry.
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	base := "http://" + serve(t, wharfprom.Handler(client, wharfprom.WithHealthTimeout(2*time.Second)))

	// Before the relay runs: neither live nor ready.
	code, p := probe(t, base+"/readyz")
	require.Equal(t, 503, code)
	require.Equal(t, []string{"no relay is running"}, p.Problems)

	startRelay(t, client)
	waitProbe := func(path string, want int, timeout time.Duration) probeBody {
		t.Helper()
		var last probeBody
		eventually(t, timeout, 100*time.Millisecond, func() string {
			code, p := probe(t, base+path)
			last = p
			if code != want {
				return fmt.Sprintf("%s answered %d, want %d: %+v", path, code, want, p)
			}
			return ""
		})
		return last
	}
	p = waitProbe("/readyz", 200, 30*time.Second)
	require.True(t, *p.Ready)
	require.True(t, p.Live)
	require.Positive(t, *p.LanesOwned)
	require.Equal(t, client.RelayID(), p.RelayID)
	require.Empty(t, p.Problems)

	require.NoError(t, cluster.StopServer("fast"))
	stopped := time.Now()
	p = waitProbe("/readyz", 503, 30*time.Second)
	t.Logf("not ready %s after the database stopped: %v", time.Since(stopped).Round(time.Millisecond), p.Problems)
	require.False(t, *p.Ready)
	require.NotEmpty(t, p.Problems)
	require.True(t, mentions(p.Problems, "database") || mentions(p.Problems, "schema"), "problems name the database: %v", p.Problems)

	// Liveness does not depend on the database: the relay waits for it
	// and must not be restarted.
	code, live := probe(t, base+"/healthz")
	require.Equal(t, 200, code, "%+v", live)
	require.True(t, live.Live)
	require.Empty(t, live.Problems)
	require.Nil(t, live.Ready, "/healthz does not claim readiness")

	// Down for longer than the relay's staleness bound (5s) and its lease
	// TTL: unready throughout, and then for the relay's own reason (no
	// database answer), not only the probe's failed schema query.
	for time.Since(stopped) < 7*time.Second {
		code, p = probe(t, base+"/readyz")
		require.Equal(t, 503, code, "%+v", p)
		time.Sleep(250 * time.Millisecond)
	}
	require.True(t, mentions(p.Problems, "the database last answered"), "%v", p.Problems)
	code, live = probe(t, base+"/healthz")
	require.Equal(t, 200, code, "still live after 7s without a database: %+v", live)

	require.NoError(t, cluster.StartServer(ctx))
	started := time.Now()
	p = waitProbe("/readyz", 200, 60*time.Second)
	t.Logf("ready again %s after the database returned", time.Since(started).Round(time.Millisecond))
	require.True(t, *p.Ready)
	require.Empty(t, p.Problems)

	// And it delivers again.
	enqueue(t, ctx, pool, client, wharf.Message{Topic: "after.outage", Payload: []byte(`{}`)})
	eventually(t, 30*time.Second, 50*time.Millisecond, func() string {
		if client.Metrics().Topic("after.outage").Delivered.Load() != 1 {
			return "message enqueued after the outage not delivered"
		}
		return ""
	})
}

func mentions(list []string, word string) bool {
	for _, s := range list {
		if strings.Contains(s, word) {
			return true
		}
	}
	return false
}

// TestBacklogEstimateIsCached checks that scrapes within the backlog interval
// do not query the database again, by counting the statements a pool tracer
// sees.
func TestBacklogEstimateIsCached(t *testing.T) {
	_, schema := migrated(t, databaseURL, 4)
	counter := &statementCounter{match: "pg_stat_user_tables"}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	base := "http://" + serve(t, wharfprom.Handler(client, wharfprom.WithBacklogInterval(2*time.Second)))

	scrape := func() string {
		code, body := httpGet(t, base+"/metrics")
		require.Equal(t, 200, code)
		return body
	}
	require.Contains(t, scrape(), "\nwharf_backlog_messages 0\n")
	for range 20 {
		require.Contains(t, scrape(), "\nwharf_backlog_messages 0\n")
	}
	require.Equal(t, int64(1), counter.n.Load(), "21 scrapes within the interval read the estimate once")
	time.Sleep(2100 * time.Millisecond)
	scrape()
	require.Equal(t, int64(2), counter.n.Load(), "a scrape after the interval reads it again")
}

// statementCounter is a pgx tracer counting the statements whose SQL
// contains match.
type statementCounter struct {
	match string
	n     atomic.Int64
}

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, s.match) {
		s.n.Add(1)
	}
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
