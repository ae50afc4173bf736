package wharf

import "time"

// The engine checks its bookkeeping after every event in this package's tests.
func init() { checkInvariants = true }

// SetClock gives the relays of cfg a clock other than time.Now.
func SetClock(cfg *Config, now func() time.Time) { cfg.clock = now }

// SetWALSpillAfter makes the relays of cfg move messages held that long to
// the outbox table (a WAL outbox's; the default is 5 s).
func SetWALSpillAfter(cfg *Config, d time.Duration) { cfg.walSpillAfter = d }

// CheckInvariants turns the engine's bookkeeping checks on or off (on in
// this package's tests; benchmarks turn them off, as in production).
func CheckInvariants(on bool) { checkInvariants = on }
