package wharfprom

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/wharfhq/wharf"
)

// Handler serves c's metrics and probes:
//
//   - /metrics: the [NewCollector] metrics, plus the Go runtime (go_*) and
//     process (process_*) collectors, in the Prometheus text or protobuf
//     format the scraper asks for;
//   - /healthz: 200 while the relay is live, 503 otherwise (JSON body);
//   - /readyz: 200 while the relay is ready, 503 otherwise (JSON body with
//     the problems).
//
// It uses a registry of its own, so it can be mounted next to an
// application's own /metrics without either seeing the other's metrics.
// Anything else is 404.
func Handler(c *wharf.Client, opts ...Option) http.Handler {
	o := newOptions(opts)
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		newCollector(c, o),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// One bad metric must not cost the scrape all the others.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      errorLog{o},
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// An already-cancelled context: liveness is the engine loop's own
		// clock, and must not wait on (or fail with) the database or a sink.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		h := c.Health(ctx)
		writeProbe(w, h.Live, probe{
			Live: h.Live, Running: h.Running, RelayID: c.RelayID(), Problems: liveProblems(h),
		})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), o.healthTimeout)
		defer cancel()
		h := c.Health(ctx)
		writeProbe(w, h.Ready, probe{
			Ready: &h.Ready, Live: h.Live, Running: h.Running, Spare: &h.Spare,
			LanesOwned: &h.LanesOwned, RelayID: c.RelayID(), Problems: h.Problems,
		})
	})
	return mux
}

// probe is the JSON body of /healthz (without ready, spare and lanes_owned,
// which it does not check) and /readyz.
type probe struct {
	Ready      *bool    `json:"ready,omitempty"`
	Live       bool     `json:"live"`
	Running    bool     `json:"running"`
	Spare      *bool    `json:"spare,omitempty"`
	LanesOwned *int     `json:"lanes_owned,omitempty"`
	RelayID    string   `json:"relay_id"`
	Problems   []string `json:"problems"`
}

// liveProblems keeps the problems that concern liveness: Health lists them
// first, and stops at them when no relay runs. The others come from checks
// the cancelled context of /healthz makes fail on purpose.
func liveProblems(h wharf.Health) []string {
	switch {
	case !h.Running:
		return h.Problems
	case !h.Live && len(h.Problems) > 0:
		return h.Problems[:1]
	}
	return nil
}

func writeProbe(w http.ResponseWriter, ok bool, p probe) {
	if p.Problems == nil {
		p.Problems = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(p)
}

// errorLog passes promhttp's errors to the configured logger.
type errorLog struct{ o options }

func (e errorLog) Println(v ...any) {
	e.o.logger.Warn("wharfprom: serving metrics", "err", strings.TrimSpace(fmt.Sprintln(v...)))
}
