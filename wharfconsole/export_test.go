package wharfconsole

import "time"

// WithClock sets the clock of the sessions and of the wrong-token back-off.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }
