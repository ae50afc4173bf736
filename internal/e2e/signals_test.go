package e2e

import (
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/faultproxy"
)

// A draining relay whose database stopped answering (packets swallowed)
// exits within --stop-timeout of SIGTERM, plus the time to give up on the
// database, instead of waiting for ever; a second signal ends it at once.
func TestDrainHonoursStopTimeoutAndASecondSignal(t *testing.T) {
	t.Parallel()
	for _, second := range []bool{false, true} {
		name := "stop-timeout"
		if second {
			name = "second-signal"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			u, err := url.Parse(databaseURL)
			require.NoError(t, err)
			proxy, err := faultproxy.New(u.Host)
			require.NoError(t, err)
			defer func() { proxy.Resume(); _ = proxy.Close() }()
			u.Host = proxy.Addr()
			// A message whose sink refuses connections waits for its retry
			// an hour ahead: the drain does not finish.
			_, err = b.client.Enqueue(t.Context(), wharf.Message{Topic: "t", Key: "k", Payload: []byte("1")})
			require.NoError(t, err)
			// The bounds below tell an honoured stop timeout (2 s) or second
			// signal (the stop timeout is then 10 min) from a relay that waits
			// for the hour-long retry, with room for a loaded machine.
			stopTimeout := "2s"
			if second {
				stopTimeout = "10m"
			}
			p := startRelayAt(t, b, u.String(), "drain", "", "--drain", "--stop-timeout", stopTimeout,
				"--sink", "http://127.0.0.1:1/hook?wharf_allow_private=true", "--retry-backoff", "1h", "--max-retry-backoff", "1h")
			time.Sleep(time.Second)
			proxy.Stall()
			// Enqueue past the proxy: the relay can neither see nor write.
			_, err = b.client.Enqueue(t.Context(), wharf.Message{Topic: "t", Key: "j", Payload: []byte("2")})
			require.NoError(t, err)
			p.terminate(t)
			start := time.Now()
			if second {
				time.Sleep(300 * time.Millisecond)
				require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
				_, ok := p.waitExit(t, 2*time.Minute)
				require.True(t, ok, "a second signal must end the relay at once, not after the 10 min stop timeout")
				return
			}
			_, ok := p.waitExit(t, 2*time.Minute)
			require.Truef(t, ok, "the relay did not exit within 2 minutes of SIGTERM with --stop-timeout 2s (its retry waits an hour)\n%s", p.stderrTail(3000))
			t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
		})
	}
}
