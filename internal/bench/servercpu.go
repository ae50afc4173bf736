package bench

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/procstat"
)

// relayAppName is the application_name of the relays' connections (the
// walsender of a WAL relay's stream included), so that the server's side of
// their work can be told from the producers'.
const relayAppName = "wharf-bench-relay"

// flowAppName is the application_name of a flow workload's connections
// (its runners', and the signal sender's).
const flowAppName = "wharf-bench-flow"

// serverCPU adds up the CPU the server's processes serving the relays (or
// a flow workload's connections: app) used while they ran, when the server runs on this machine: each sample
// lists the backends with the relays' application_name and reads their
// CPU from /proc. A backend that started with the relays counts whole; one
// that was there before them (an earlier run's, ending) counts from then.
// A backend counts up to its last sample (one that ends between two samples
// loses what it used since the last).
type serverCPU struct {
	app     string
	mu      sync.Mutex
	first   map[int32]time.Duration
	last    map[int32]time.Duration
	foreign bool // a listed backend is not a postgres process here
}

// newServerCPU starts counting the backends of application_name app,
// before they start working.
func newServerCPU(ctx context.Context, ctl *pgxpool.Pool, app string) *serverCPU {
	c := &serverCPU{app: app, first: map[int32]time.Duration{}, last: map[int32]time.Duration{}}
	c.sample(ctx, ctl, true)
	return c
}

// note samples the relays' backends.
func (c *serverCPU) note(ctx context.Context, ctl *pgxpool.Pool) { c.sample(ctx, ctl, false) }

func (c *serverCPU) sample(ctx context.Context, ctl *pgxpool.Pool, before bool) {
	rows, err := ctl.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", c.app)
	if err != nil {
		return
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if rows.Scan(&pid) == nil {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pid := range pids {
		used, ok := postgresCPU(pid)
		if !ok {
			c.foreign = c.foreign || !before
			continue
		}
		if _, seen := c.first[pid]; !seen {
			c.first[pid] = 0
			if before {
				c.first[pid] = used
			}
		}
		c.last[pid] = used
	}
}

// total is the CPU counted, and false when it could not be (the server
// runs elsewhere, or no backend was seen).
func (c *serverCPU) total() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.foreign || len(c.last) == 0 {
		return 0, false
	}
	var d time.Duration
	for pid, f := range c.first {
		d += c.last[pid] - f
	}
	return d, true
}

// postgresCPU is the CPU process pid used, when it is a postgres process
// of this machine.
func postgresCPU(pid int32) (time.Duration, bool) {
	used, comm, ok := procstat.CPU(int(pid))
	return used, ok && comm == "postgres"
}
