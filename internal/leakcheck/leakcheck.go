// Package leakcheck checks, at the end of a test binary, that its tests left
// no goroutine running.
//
// goleak.VerifyTestMain gives goroutines that are on their way out (a
// connection's reader after Close, a timer's callback) about half a second;
// on a loaded machine that is not always enough. Main waits for them to end,
// up to a minute, and fails only if some are still running then.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Wait bounds how long Main waits for leftover goroutines to end.
const Wait = time.Minute

// Main runs the tests and exits; a successful run whose goroutines do not
// all end within Wait fails, listing them.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running %s after the tests passed: %v\n", Wait, err)
			code = 1
		}
	}
	os.Exit(code)
}

// Find waits up to Wait for every goroutine but the caller's and those opts
// ignore to end; it returns goleak's report of the ones left.
func Find(opts ...goleak.Option) error {
	opts = append(opts, Permanent()...)
	deadline := time.Now().Add(Wait)
	for {
		err := goleak.Find(opts...) // retries for about half a second itself
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// Permanent returns the options that ignore the goroutines a dependency
// starts once per process and never ends, which no test can stop: the
// stats worker of opencensus, started by its package's init in every binary
// that links the Google Cloud Pub/Sub client (wharfpubsub, and through it
// the CLI).
func Permanent() []goleak.Option {
	return []goleak.Option{goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")}
}
