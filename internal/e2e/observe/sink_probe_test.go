package observe

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfprom"
	"github.com/wharfhq/wharf/wharfredis"
)

// /readyz follows the sink: a relay whose Redis stops is not ready (the
// problem names the sink) while it stays live, and is ready again once
// Redis is back, and delivers.
func TestReadyzFollowsTheSink(t *testing.T) {
	bin := testtool.Path(t, "redis-server", "this test runs a private one: apt-get install redis-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	var cmd *exec.Cmd
	startRedis := func() {
		cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--daemonize", "no", "--logfile", "")
		require.NoError(t, cmd.Start())
		eventually(t, 10*time.Second, 50*time.Millisecond, func() string {
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				return err.Error()
			}
			_ = c.Close()
			return ""
		})
	}
	stopRedis := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	startRedis()
	t.Cleanup(stopRedis)

	ctx := context.Background()
	u, err := url.Parse(fmt.Sprintf("redis://127.0.0.1:%d/0?timeout=2s&stream_template=readyz:{{topic}}", port))
	require.NoError(t, err)
	sink, err := wharfredis.Open(ctx, u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })

	pool, schema := migrated(t, databaseURL, 8)
	client, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema, Sink: sink, PollInterval: 10 * time.Millisecond, RebalanceInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	base := "http://" + serve(t, wharfprom.Handler(client, wharfprom.WithHealthTimeout(2*time.Second)))
	startRelay(t, client)
	wait := func(path string, want int) probeBody {
		t.Helper()
		var last probeBody
		eventually(t, 30*time.Second, 100*time.Millisecond, func() string {
			code, p := probe(t, base+path)
			last = p
			if code != want {
				return fmt.Sprintf("%s answered %d, want %d: %+v", path, code, want, p)
			}
			return ""
		})
		return last
	}
	wait("/readyz", 200)

	stopRedis()
	p := wait("/readyz", 503)
	require.True(t, mentions(p.Problems, "sink"), "problems name the sink: %v", p.Problems)
	code, live := probe(t, base+"/healthz")
	require.Equal(t, 200, code, "a relay waiting for its sink stays live: %+v", live)

	startRedis()
	p = wait("/readyz", 200)
	require.Empty(t, p.Problems)
	enqueue(t, ctx, pool, client, wharf.Message{Topic: "after.outage", Payload: []byte(`{}`)})
	eventually(t, 30*time.Second, 50*time.Millisecond, func() string {
		if client.Metrics().Topic("after.outage").Delivered.Load() != 1 {
			return "message enqueued after the outage not delivered"
		}
		return ""
	})
}
