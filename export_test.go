package wharf

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The engine checks its bookkeeping after every event in this package's tests.
func init() { checkInvariants = true }

// SetClock gives the relays of cfg a clock other than time.Now.
func SetClock(cfg *Config, now func() time.Time) { cfg.clock = now }

// SetWALSlot makes the relays of cfg stream the outbox from a logical
// replication slot and the publication of the same name (WAL mode).
func SetWALSlot(cfg *Config, slot string) { cfg.walSlot = slot }

// EnqueueWAL enqueues msgs into c's outbox in WAL mode, in tx.
func EnqueueWAL(ctx context.Context, c *Client, tx pgx.Tx, msgs ...Message) ([]string, error) {
	return c.enqueueWAL(ctx, tx, msgs)
}

// CheckInvariants turns the engine's bookkeeping checks on or off (on in
// this package's tests; benchmarks turn them off, as in production).
func CheckInvariants(on bool) { checkInvariants = on }
