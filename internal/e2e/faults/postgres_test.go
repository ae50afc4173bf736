//go:build faults

package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/wharfhq/wharf/internal/pgembed"
)

// startCluster starts a throwaway PostgreSQL that the test may stop and
// crash. Without server binaries it fails under CI=true.
// startCluster starts a throwaway cluster; settings add to or override the
// defaults below.
func startCluster(t *testing.T, settings map[string]string) *pgembed.Cluster {
	t.Helper()
	if _, err := pgembed.FindBinaries(); err != nil {
		needBinary(t, "pg_ctl")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// synchronous_commit on: a commit is acknowledged once its WAL is
	// written, so a crash of the server process (not of the machine: fsync
	// stays off for speed) loses no acknowledged commit. pgembed's test
	// default (off) would lose the last ones, and the relay may already have
	// delivered them.
	s := map[string]string{"max_connections": "100", "synchronous_commit": "on"}
	for k, v := range settings {
		s[k] = v
	}
	c, err := pgembed.Start(ctx, pgembed.Options{Settings: s})
	must(t, err, "start a throwaway PostgreSQL")
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// PostgreSQL goes away under load, with a fast shutdown (clients are
// disconnected, the server checkpoints) or a crash (`immediate`: no
// checkpoint, crash recovery at the next start), and comes back on the same
// port. Producers and relays reconnect by themselves; every message whose
// transaction committed arrives, none whose transaction did not.
func TestPostgresRestartUnderLoad(t *testing.T) {
	postgresRestartUnderLoad(t, newOutbox, "")
}

// The same for an outbox in WAL mode: the slot survives the restart and the
// crash, and the relay streams again from its confirmed position.
func TestWALPostgresRestartUnderLoad(t *testing.T) {
	postgresRestartUnderLoad(t, newWALOutbox, ", WAL mode")
}

// postgresRestartUnderLoad runs the restart scenario on outboxes made by
// newOutbox; suffix ends the scenarios' names.
func postgresRestartUnderLoad(t *testing.T, newOutbox func(*testing.T, string) *outbox, suffix string) {
	c := startCluster(t, nil)
	outage := pick(3*time.Second, 30*time.Second)
	restarts := pick(1, 3)
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			o := newOutbox(t, c.URL())
			path := filepath.Join(t.TempDir(), "out.jsonl")
			col := &fileCollector{paths: []string{path}}
			r1 := startRelay(t, o, "", "a", "", "--sink", sinkFile(path))
			r2 := startRelay(t, o, "", "b", "", "--sink", sinkFile(path))
			rs := []*relay{r1, r2}
			l := startLoad(t, o, nil, loadShape{})
			waitDelivered(t, col, 300, 30*time.Second)
			var cleared time.Time
			for i := 0; i < restarts; i++ {
				must(t, c.StopServer(mode), "stop PostgreSQL (%s)", mode)
				time.Sleep(outage)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := c.StartServer(ctx)
				cancel()
				must(t, err, "start PostgreSQL again")
				cleared = time.Now()
				time.Sleep(2 * time.Second) // relays and producers reconnect
				revive(t, rs)
				if i < restarts-1 {
					time.Sleep(3 * time.Second)
				}
			}
			name := fmt.Sprintf("PostgreSQL %s restart x%d, %s down%s", mode, restarts, outage, suffix)
			if mode == "immediate" {
				name = fmt.Sprintf("PostgreSQL crash (immediate) x%d, %s down%s", restarts, outage, suffix)
			}
			verify(t, name, o, l, col, cleared, 90*time.Second)
			for _, r := range rs {
				r.stop(t, 30*time.Second)
			}
		})
	}
}
