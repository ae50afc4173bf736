package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// sampler takes the time series: counts, rates, backlog and the latency of
// the last interval, and draws the progress line.
type sampler struct {
	e         *env
	schema    string
	start     time.Time
	tr        *tracker
	inProcess bool // the tracker knows what was acknowledged
	noRelay   bool
	label     string

	produced      *atomic.Int64
	fixedProduced int64 // drain: everything was there from the start

	samples []Sample
	prev    Sample
	prevCPU time.Duration // process CPU at the previous sample (in-process relay)
	tty     bool
	drawn   bool
}

func newSampler(e *env, schema string, start time.Time, tr *tracker, inProcess bool, label string) *sampler {
	s := &sampler{e: e, schema: schema, start: start, tr: tr, inProcess: inProcess, label: label}
	if f, ok := e.o.Progress.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			s.tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return s
}

func (s *sampler) last() *Sample { return &s.samples[len(s.samples)-1] }

// sample appends a sample to the series and draws the progress line.
func (s *sampler) sample(ctx context.Context, phase string) error {
	x, err := s.measure(ctx, phase, true)
	if err != nil {
		return err
	}
	if len(s.samples) == 0 {
		s.prev = Sample{Produced: s.fixedProduced}
	}
	// A sample right after another (the producers' stop just after a tick)
	// keeps its rates rather than dividing by almost nothing, and replaces it
	// when both are of the same phase.
	if dt := x.Seconds - s.prev.Seconds; len(s.samples) > 0 && dt < 0.1*s.e.o.SampleInterval.Seconds() {
		last := s.last()
		x.ProducedRate, x.ProcessedRate = last.ProducedRate, last.ProcessedRate
		if x.P50 == 0 && x.P99 == 0 {
			x.P50, x.P99 = last.P50, last.P99
		}
		s.prev = x
		if last.Phase == x.Phase {
			*last = x
		} else {
			s.samples = append(s.samples, x)
		}
		return nil
	}
	if dt := x.Seconds - s.prev.Seconds; dt > 0 {
		x.ProducedRate = float64(x.Produced-s.prev.Produced) / dt
		x.ProcessedRate = float64(x.Processed-s.prev.Processed) / dt
		if s.inProcess {
			if c, _, ok := selfUsage(); ok {
				if s.prevCPU > 0 {
					x.CPUPercent = 100 * (c - s.prevCPU).Seconds() / dt
				}
				s.prevCPU = c
			}
		}
	}
	s.samples = append(s.samples, x)
	s.prev = x
	s.draw(s.e.o.Progress, x)
	return nil
}

// measure reads the counters; interval takes the latencies recorded since
// the previous sample.
func (s *sampler) measure(ctx context.Context, phase string, interval bool) (Sample, error) {
	x := Sample{Seconds: time.Since(s.start).Seconds(), Phase: phase, Produced: s.fixedProduced}
	if s.produced != nil {
		x.Produced = s.produced.Load()
	}
	switch {
	case s.noRelay:
		x.Backlog = x.Produced
	case s.inProcess:
		x.Processed = s.tr.acked.Load()
		x.Backlog = max(0, x.Produced-x.Processed)
		if interval {
			h := s.tr.takeInterval()
			x.P50, x.P99 = h.quantile(0.5), h.quantile(0.99)
		}
	default:
		if s.fixedProduced > 0 { // drain: a large backlog, not worth scanning
			n, err := s.e.outboxRemoved(ctx, s.schema)
			if err != nil {
				return x, err
			}
			x.Processed = min(n, x.Produced)
			x.Backlog = x.Produced - x.Processed
			break
		}
		n, err := s.e.outboxCount(ctx, s.schema)
		if err != nil {
			return x, err
		}
		x.Backlog = n
		x.Processed = max(0, x.Produced-n)
	}
	return x, nil
}

func (s *sampler) draw(w io.Writer, x Sample) {
	if w == nil {
		return
	}
	line := fmt.Sprintf("[%s] %5.1fs  produced %8.0f/s  processed %8.0f/s  backlog %8d", s.label, x.Seconds, x.ProducedRate, x.ProcessedRate, x.Backlog)
	if s.fixedProduced > 0 {
		line = fmt.Sprintf("[%s] %5.1fs  processed %8.0f/s  backlog %8d", s.label, x.Seconds, x.ProcessedRate, x.Backlog)
	}
	if s.inProcess && (x.P50 > 0 || x.P99 > 0) {
		line += fmt.Sprintf("  latency p50 %.1fms p99 %.1fms", x.P50, x.P99)
	}
	if s.tty {
		fmt.Fprintf(w, "\r%s\033[K", line)
		s.drawn = true
	} else {
		fmt.Fprintln(w, line)
	}
}

// progressDone ends a progress line drawn in place.
func (s *sampler) progressDone() {
	if s.drawn {
		fmt.Fprintln(s.e.o.Progress)
		s.drawn = false
	}
}
