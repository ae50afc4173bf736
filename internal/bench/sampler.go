package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

const (
	// autoInterval is the first sampling interval when --sample-interval is
	// not set: a one-second drain still gets ten points.
	autoInterval = 100 * time.Millisecond
	// maxSamples bounds the series: past it, neighbouring samples are merged
	// and the interval doubles.
	maxSamples = 240
	// progressEvery is the most often a progress line is drawn.
	progressEvery = time.Second
)

// sampler takes the time series (counts, rates, backlog and the latency of
// each interval), keeps the backlog readings of the measurement window for
// the growth test, and draws the progress line.
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
	// prefilled is a steady run's --backlog: enqueued before the producers
	// started, counted in every reading's Produced.
	prefilled int64

	interval time.Duration
	auto     bool
	ticker   *time.Ticker

	samples []Sample
	hists   []*histogram // per sample, in-process only: merged with the samples
	prev    Sample
	prevCPU time.Duration // process CPU at the previous sample (in-process relay)

	// recording makes every reading a point of the growth fit.
	recording    bool
	readX, readY []float64

	tty      bool
	drawn    bool
	lastDraw time.Time
}

func newSampler(e *env, schema string, start time.Time, tr *tracker, inProcess bool, label string) *sampler {
	s := &sampler{e: e, schema: schema, start: start, tr: tr, inProcess: inProcess, label: label,
		interval: e.o.SampleInterval, auto: e.o.SampleInterval == 0}
	if s.auto {
		s.interval = autoInterval
		if !inProcess {
			// Each reading of a relay process's backlog is a query: four a
			// second still give the growth test 40 readings in 10 s.
			s.interval = 250 * time.Millisecond
		}
	}
	s.ticker = time.NewTicker(s.interval)
	if f, ok := e.o.Progress.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			s.tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return s
}

// C delivers the sampling ticks.
func (s *sampler) C() <-chan time.Time { return s.ticker.C }

func (s *sampler) stop() { s.ticker.Stop() }

func (s *sampler) last() *Sample { return &s.samples[len(s.samples)-1] }

// origin is the state before the first sample.
func (s *sampler) origin() Sample { return Sample{Produced: s.fixedProduced} }

// sample appends a sample to the series and draws the progress line.
func (s *sampler) sample(ctx context.Context, phase string) error {
	if s.e.server != nil {
		s.e.server.note(ctx, s.e.ctl)
	}
	x, h, err := s.measure(ctx, phase, true)
	if err != nil {
		return err
	}
	if len(s.samples) == 0 {
		s.prev = s.origin()
	}
	// A sample right after another (the producers' stop just after a tick)
	// keeps its rates rather than dividing by almost nothing, and replaces it
	// when both are of the same phase.
	if dt := x.Seconds - s.prev.Seconds; len(s.samples) > 0 && dt < 0.1*s.interval.Seconds() {
		last := s.last()
		x.ProducedRate, x.ProcessedRate, x.CPUPercent = last.ProducedRate, last.ProcessedRate, last.CPUPercent
		if h != nil {
			h.merge(s.hists[len(s.hists)-1])
		}
		s.fillLatency(&x, h)
		s.prev = x
		if last.Phase == x.Phase {
			*last = x
			if h != nil {
				s.hists[len(s.hists)-1] = h
			}
		} else {
			s.push(x, h)
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
	s.fillLatency(&x, h)
	s.push(x, h)
	s.prev = x
	if now := time.Now(); now.Sub(s.lastDraw) >= progressEvery || phase == "tail" {
		s.lastDraw = now
		s.draw(s.e.o.Progress, x)
	}
	if s.auto && len(s.samples) > maxSamples {
		s.coarsen()
	}
	return nil
}

func (s *sampler) push(x Sample, h *histogram) {
	s.samples = append(s.samples, x)
	if s.inProcess {
		if !s.auto && len(s.hists) > 0 {
			// Only coarsen needs the older ones; a fixed interval keeps
			// the last alone, so a long run's memory does not grow.
			s.hists[len(s.hists)-1] = nil
		}
		s.hists = append(s.hists, h)
	}
}

func (s *sampler) fillLatency(x *Sample, h *histogram) {
	if h != nil {
		x.P50, x.P99 = h.quantile(0.5), h.quantile(0.99)
	}
}

// coarsen merges neighbouring samples of the same phase pairwise and
// doubles the interval.
func (s *sampler) coarsen() {
	var out []Sample
	var hists []*histogram
	prev := s.origin()
	for i := 0; i < len(s.samples); {
		a := s.samples[i]
		var ha *histogram
		if s.inProcess {
			ha = s.hists[i]
		}
		if i+1 == len(s.samples) || s.samples[i+1].Phase != a.Phase {
			out, hists = append(out, a), append(hists, ha)
			prev = a
			i++
			continue
		}
		b := s.samples[i+1]
		m := b
		if dt := b.Seconds - prev.Seconds; dt > 0 {
			m.ProducedRate = float64(b.Produced-prev.Produced) / dt
			m.ProcessedRate = float64(b.Processed-prev.Processed) / dt
			m.CPUPercent = (a.CPUPercent*(a.Seconds-prev.Seconds) + b.CPUPercent*(b.Seconds-a.Seconds)) / dt
		}
		if ha != nil {
			hb := s.hists[i+1]
			ha.merge(hb)
			s.fillLatency(&m, ha)
		}
		out, hists = append(out, m), append(hists, ha)
		prev = m
		i += 2
	}
	s.samples = out
	if s.inProcess {
		s.hists = hists
	}
	s.interval *= 2
	s.ticker.Reset(s.interval)
}

// measure reads the counters; interval takes the latencies recorded since
// the previous sample. While recording, the backlog is kept for the growth
// test.
func (s *sampler) measure(ctx context.Context, phase string, interval bool) (Sample, *histogram, error) {
	x := Sample{Seconds: time.Since(s.start).Seconds(), Phase: phase, Produced: s.fixedProduced}
	var h *histogram
	if s.produced != nil {
		x.Produced = s.prefilled + s.produced.Load()
	}
	switch {
	case s.noRelay:
		x.Backlog = x.Produced
	case s.inProcess:
		x.Processed = s.tr.acked.Load()
		x.Backlog = max(0, x.Produced-x.Processed)
		if interval {
			h = s.tr.takeInterval()
		}
	default:
		if s.fixedProduced > 0 && s.e.o.OutboxMode == "wal" { // no rows: the slot's progress
			done, err := s.e.walDone(ctx, s.schema)
			if err != nil {
				return x, nil, err
			}
			x.Processed = int64(done * float64(x.Produced))
			x.Backlog = x.Produced - x.Processed
			break
		}
		if s.fixedProduced > 0 { // drain: a large backlog, not worth scanning
			n, err := s.e.outboxRemoved(ctx, s.schema)
			if err != nil {
				return x, nil, err
			}
			x.Processed = min(n, x.Produced)
			x.Backlog = x.Produced - x.Processed
			break
		}
		n, err := s.e.outboxCount(ctx, s.schema)
		if err != nil {
			return x, nil, err
		}
		x.Backlog = n
		x.Processed = max(0, x.Produced-n)
	}
	if s.recording {
		s.readX, s.readY = append(s.readX, x.Seconds), append(s.readY, float64(x.Backlog))
	}
	if interval && s.e.o.Mode == ModeSoak {
		if err := s.e.soakReadings(ctx, s.schema, &x); err != nil {
			return x, nil, err
		}
	}
	return x, h, nil
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
