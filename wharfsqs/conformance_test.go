//go:build awsconformance

package wharfsqs

import (
	"testing"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// runConformance runs the suite against FIFO queues (or topics), whose
// per-key order a consumer can check. moto's server takes about a tenth of a
// second a request on a shared two-core machine, up to a second under load,
// so the suite's waits are scaled ten times (Harness.TimeScale) and a run
// takes more than ten minutes there: it is built only with the
// awsconformance tag,
//
//	go test -tags awsconformance -timeout 60m -run Conformance ./wharfsqs
//
// and is not part of make test or CI. The focused tests in wharfsqs_test.go
// and the end-to-end test through wharf relay (internal/e2e) run always.
func runConformance(t *testing.T, useSNS bool) {
	h := &harness{sns: useSNS}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink: func(t *testing.T) wharf.Sink {
			w := h.newWorld(t)
			return h.open(t, w, w.srv.Endpoint)
		},
		NewBreakableSink: func(t *testing.T) wharf.Sink {
			w := h.newWorld(t)
			w.gate = w.srv.NewGate(t)
			return h.open(t, w, w.gate.Endpoint())
		},
		Consume:     h.consume,
		TimeScale:   10,
		BreakBroker: func(t *testing.T) { h.worlds.Get(t).gate.Shut() },
		HealBroker:  func(t *testing.T) { h.worlds.Get(t).gate.Open(t) },
		Features:    wharfsinktest.Features{MaxPayload: maxPayload, SupportsHeaders: true},
	})
}

// TestConformanceSQS runs the suite against SQS FIFO queues.
func TestConformanceSQS(t *testing.T) {
	t.Parallel()
	runConformance(t, false)
}

// TestConformanceSNS runs the suite against SNS FIFO topics, read through
// FIFO queues subscribed with raw delivery.
func TestConformanceSNS(t *testing.T) {
	t.Parallel()
	runConformance(t, true)
}
