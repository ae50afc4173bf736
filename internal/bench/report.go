package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// row is one line of the summary table.
type row struct{ name, value string }

func rate(v float64) string { return groupThousands(math.Round(v)) + " msg/s" }

// groupThousands formats an integral v with thousands separators.
func groupThousands(v float64) string {
	s := strconv.FormatFloat(math.Abs(v), 'f', 0, 64)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func pct(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

func (r *Result) rows() []row {
	rows := []row{{"mode", string(r.Mode)}}
	add := func(name, value string) { rows = append(rows, row{name, value}) }
	steady := r.Mode == ModeSteady || r.Mode == ModeSweep || r.Mode == ModeSoak
	l := r.Limits
	switch r.Mode {
	case ModeSteady, ModeSoak:
		add("target rate", rate(r.TargetRate))
	case ModeSweep:
		if r.TargetRate > 0 {
			add("highest sustainable rate", fmt.Sprintf("%s (%d runs, all sustainable)", rate(r.TargetRate), r.ConfirmedRuns))
		} else {
			add("highest sustainable rate", "none")
		}
		if l != nil && l.ProducerFraction > 0 {
			add("  of the insert limit", pct(l.ProducerFraction))
		}
		if l != nil && l.EmitFraction > 0 {
			add("  of the emit limit", pct(l.EmitFraction))
		}
	}
	if r.Mode == ModeSweep && r.TargetRate == 0 {
		add("verdict", r.VerdictReason)
		rows = append(rows, r.limitRows()...)
		return append(rows, r.environmentRows()...)
	}
	add("messages", strconv.FormatInt(r.Messages, 10))
	add("relays", relaysText(r))
	if r.Settings.OutboxMode == "wal" {
		add("outbox", "WAL mode (messages in the WAL only, streamed from a logical replication slot)")
	}
	switch r.Mode {
	case ModeDrain:
		if r.Settings.OutboxMode == "wal" || r.Settings.EnqueueFill {
			add(fmt.Sprintf("pre-fill (Enqueue, %d per tx)", r.Settings.ProducerBatch), rate(r.ProducerRate))
		} else {
			add("pre-fill (COPY)", rate(r.ProducerRate))
		}
	case ModeBaseline:
		add("producer rate (flat out)", rate(r.ProducerRate))
	default:
		add("producer rate", rate(r.ProducerRate))
	}
	if l != nil && l.ProducerFraction > 0 && r.Mode != ModeSweep {
		add("  of the insert limit", pct(l.ProducerFraction))
	}
	if l != nil && l.EmitFraction > 0 && r.Mode != ModeSweep {
		add("  of the emit limit", pct(l.EmitFraction))
	}
	switch r.Mode {
	case ModeDrain, ModeBaseline:
		add("drain rate", rate(r.ProcessingRate))
		if l != nil && l.DrainFraction > 0 {
			add("  of the removal limit", pct(l.DrainFraction))
		}
		add("drain time", fmt.Sprintf("%.2f s", r.DrainSeconds))
	default:
		add("processing rate", rate(r.ProcessingRate))
	}
	rows = append(rows, r.limitRows()...)
	if steady {
		add("backlog at stop", strconv.FormatInt(r.BacklogAtStop, 10))
		d := fmt.Sprintf("%.2f s", r.DrainSeconds)
		if r.DrainSeconds < 0 {
			d = "did not catch up within --tail-wait"
		}
		add("caught up after stop", d)
		if st := r.Start; st != nil && r.Settings.OutboxMode == "wal" {
			add("start", fmt.Sprintf("replication slot advanced over %d kB of WAL not confirmed (the earlier phases'), relays' tables vacuumed; CHECKPOINT %s",
				st.SlotLagBytes/1024, map[bool]string{true: "done", false: "not permitted"}[st.Checkpointed]))
		} else if r.Start != nil {
			st := r.Start
			add("start", fmt.Sprintf("outbox %d rows, %d dead tuples, heap %d kB, indexes %d kB after VACUUM (ANALYZE) and REINDEX; CHECKPOINT %s",
				st.OutboxRows, st.DeadTuples, st.HeapBytes/1024, st.IndexBytes/1024, map[bool]string{true: "done", false: "not permitted"}[st.Checkpointed]))
		}
	}
	if ov := r.Overload; ov != nil {
		add("overload backlog", fmt.Sprintf("%d messages pre-filled before the start (%s)", ov.Backlog, rate(ov.PrefillRate)))
		add("  offered", fmt.Sprintf("%s over the %.2f s window (%d outstanding at its start + %d produced in it)", rate(ov.OfferedRate), ov.WindowSeconds, ov.OutstandingAtStart, ov.ProducedInWindow))
		add("  processed", fmt.Sprintf("%s (%d in the window, %d outstanding at its end)", rate(ov.ProcessedRate), ov.ProcessedInWindow, ov.OutstandingAtEnd))
		sat := fmt.Sprintf("yes: the backlog never fell below %d", ov.MinOutstanding)
		if !ov.Saturated {
			sat = "no: the relay ran out of work in the window (raise --backlog)"
		}
		add("  saturated", sat)
		if ov.WorstSecondAt >= 0 {
			add("  worst second", fmt.Sprintf("%d msgs processed (second %d of the window)", ov.WorstSecond, ov.WorstSecondAt+1))
		}
		if ov.BacklogProcessed >= 0 {
			add("  pre-filled processed", fmt.Sprintf("%d of %d by the end", ov.BacklogProcessed, ov.Backlog))
		}
	}
	add("delivered", fmt.Sprintf("%d (%d redelivered)", r.Delivered, r.Redelivered))
	if steady {
		add("verdict", verdictWord(r.Sustainable))
		for _, c := range r.Criteria {
			mark := "✓"
			switch {
			case !c.Judged:
				mark = "–"
			case !c.Met:
				mark = "✗"
			}
			add("  "+mark+" "+c.Name, c.Detail)
		}
		if r.Mode == ModeSweep {
			add("sweep", r.VerdictReason)
		}
	}
	if r.LatencyMS != nil {
		lat := r.LatencyMS
		add("latency commit→ack", fmt.Sprintf("p50 %.2f  p95 %.2f  p99 %.2f  max %.2f ms (%d msgs)", lat.P50, lat.P95, lat.P99, lat.Max, lat.Count))
		if lat.WorstSecondAt >= 0 && lat.Seconds > 0 {
			add("worst second", fmt.Sprintf("%d msgs acknowledged (second %d of the %d-second window)", lat.WorstSecond, lat.WorstSecondAt+1, lat.Seconds))
			if r.Settings.InProcess && r.TargetRate > 0 {
				n := r.SlowSecondsTotal
				detail := fmt.Sprintf("%d below %.0f %% of the target rate", n, 100*slowFraction)
				if n > len(r.SlowSeconds) {
					detail += fmt.Sprintf(" (the %d slowest below)", len(r.SlowSeconds))
				}
				add("slow seconds", detail)
				for _, s := range r.SlowSeconds {
					add("", "  "+s.String())
				}
			}
		}
	} else {
		add("latency commit→ack", r.LatencyNote)
	}
	if r.SinkPublishRate > 0 {
		add("sink publish rate", rate(r.SinkPublishRate)+" (direct, no outbox)")
	}
	add("WAL per message", fmt.Sprintf("%.0f bytes", r.WALBytesPerMsg))
	add("commits per message", fmt.Sprintf("%.4f", r.CommitsPerMsg))
	add("dead tuples at end", strconv.FormatInt(r.DeadTuples, 10))
	add("deadlocks", strconv.FormatInt(r.Deadlocks, 10)+" (detected by PostgreSQL in this database during the run)")
	add("outbox rows at end", strconv.FormatInt(r.OutboxRemaining, 10))
	if p := r.Settings.PoisonPercent; p > 0 {
		add("poison messages", fmt.Sprintf("%g %% (every %d-th seq): %d dead-lettered", p, int64(math.Round(100/p)), r.PoisonDeadLettered))
	}
	add("relay CPU", fmt.Sprintf("%.2f s%s", r.RelayCPUSeconds, r.perMessage(r.RelayCPUSeconds)))
	if r.RelayServerCPUSeconds > 0 {
		what := "the relays' backends"
		if r.Settings.OutboxMode == "wal" {
			what = "the relay's backends and its walsender"
		}
		add("server CPU for relays", fmt.Sprintf("%.2f s%s: %s, from /proc (the server runs on this machine)", r.RelayServerCPUSeconds, r.perMessage(r.RelayServerCPUSeconds), what))
	}
	add("relay peak RSS", fmt.Sprintf("%.1f MB", float64(r.RelayPeakRSSBytes)/1e6))
	add("relay usage", r.RelayUsageNote)
	return append(rows, r.environmentRows()...)
}

// perMessage is seconds per delivered message, as " (x µs/msg)", or "".
func (r *Result) perMessage(seconds float64) string {
	if r.Delivered <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.2f µs/msg)", seconds/float64(r.Delivered)*1e6)
}

func (r *Result) limitRows() []row {
	l := r.Limits
	if l == nil {
		return nil
	}
	var rows []row
	if l.InsertRate > 0 {
		rows = append(rows, row{"insert limit", rate(l.InsertRate) + " (bare multi-row INSERT)"})
	}
	if l.EmitRate > 0 {
		rows = append(rows, row{"emit limit", rate(l.EmitRate) + " (bare pg_logical_emit_message per message)"},
			row{"  emit WAL per message", fmt.Sprintf("%.0f bytes", l.EmitWALBytesPerMsg)})
		if l.WALBytesFraction > 0 {
			rows = append(rows, row{"  Wharf's WAL per message", fmt.Sprintf("%.2f × the bare emit's", l.WALBytesFraction)})
		}
	}
	if l.RemovalRate > 0 {
		rows = append(rows, row{"removal limit", rate(l.RemovalRate) + " (bare claim+delete)"})
	}
	return rows
}

func (r *Result) environmentRows() []row {
	e := r.Environment
	la := func(v []float64) string {
		if len(v) < 3 {
			return "unknown"
		}
		return fmt.Sprintf("%.2f %.2f %.2f", v[0], v[1], v[2])
	}
	var settings []string
	for _, s := range e.PostgresSettings {
		settings = append(settings, s.Name+"="+s.Value)
	}
	server := e.ServerAddress
	if server == "" {
		server = "Unix socket"
	}
	rows := []row{
		{"machine", fmt.Sprintf("%d cores, %s; load average at start %s, at end %s", e.Cores, e.OS, la(e.LoadAverageStart), la(e.LoadAverageEnd))},
		{"PostgreSQL", fmt.Sprintf("%s at %s, TLS: %s", r.PostgresVersion, server, e.TLS)},
		{"server settings", strings.Join(settings, " ")},
	}
	for _, w := range e.Warnings {
		rows = append(rows, row{"warning", w})
	}
	return rows
}

func relaysText(r *Result) string {
	switch {
	case r.Relays == 0:
		return "none"
	case r.Settings.InProcess:
		return "1 (in-process)"
	default:
		return fmt.Sprintf("%d (processes)", r.Relays)
	}
}

// stepCells are a sweep step's columns, shared by the terminal and HTML.
func stepCells(s Step) []string {
	g := s.Growth
	growth, p, detect := "not testable", "-", "-"
	if g.Valid {
		growth = fmt.Sprintf("%.0f ± %.0f", g.Slope, g.Upper-g.Slope)
		p = fmt.Sprintf("%.2g", g.PValue)
		detect = fmt.Sprintf("%.0f", g.Detectable)
	}
	p99, window := "-", "-"
	if l := s.LatencyMS; l != nil {
		p99, window = fmt.Sprintf("%.1f", l.P99PerSecond), fmt.Sprintf("%.1f", l.P99)
		if s.P99BoundMS > 0 {
			p99 += fmt.Sprintf(" (≤ %.0f)", s.P99BoundMS)
		}
	}
	verdict := "pass"
	if !s.Sustainable {
		var failed []string
		for _, c := range s.Criteria {
			if c.Judged && !c.Met {
				failed = append(failed, c.Name)
			}
		}
		verdict = "FAIL: " + strings.Join(failed, ", ")
	}
	return []string{strconv.Itoa(s.Rate), s.Role, fmt.Sprintf("%.1f %%", 100*s.ProducerRate/float64(s.Rate)),
		growth, fmt.Sprintf("%.0f", g.Tolerance), p, detect, strconv.FormatInt(s.BacklogAtStop, 10), p99, window, strconv.FormatInt(s.Deadlocks, 10), verdict}
}

var stepHeader = []string{"rate", "role", "producers", "growth msg/s (± 95 %)", "tolerance", "p", "detects ≥", "backlog at stop", "median p99/s ms (bound)", "window p99 ms", "deadlocks", "verdict"}

// WriteSummary writes the terminal summary table.
func WriteSummary(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range r.rows() {
		fmt.Fprintf(tw, "%s\t%s\n", row.name, row.value)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Steps) > 0 {
		fmt.Fprintln(w, "\nsweep runs, in order:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, strings.Join(stepHeader, "\t")+"\t")
		for _, s := range r.Steps {
			fmt.Fprintln(tw, strings.Join(stepCells(s), "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteJSONFile writes r as JSON to path.
func WriteJSONFile(path string, r *Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	if err := WriteJSON(f, r); err != nil {
		f.Close()
		return fmt.Errorf("--json: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

// WriteReport writes samples.csv and a self-contained index.html (inline SVG
// charts, no scripts) into dir, creating it.
func WriteReport(dir string, r *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	if err := writeCSV(filepath.Join(dir, "samples.csv"), r.Samples); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "index.html"))
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	if err := writeHTML(f, r); err != nil {
		f.Close()
		return fmt.Errorf("--report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	return nil
}

func writeCSV(path string, samples []Sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"second", "produced", "processed", "backlog", "p50_ms", "p99_ms", "cpu_pct", "phase", "rss_bytes", "heap_bytes", "goroutines", "dead_tuples"})
	ff := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	for _, s := range samples {
		_ = w.Write([]string{ff(s.Seconds, 3), ff(s.ProducedRate, 0), ff(s.ProcessedRate, 0),
			strconv.FormatInt(s.Backlog, 10), ff(s.P50, 3), ff(s.P99, 3), ff(s.CPUPercent, 1), s.Phase,
			strconv.FormatInt(s.RSSBytes, 10), strconv.FormatInt(s.HeapBytes, 10), strconv.Itoa(s.Goroutines), strconv.FormatInt(s.DeadTuples, 10)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// series is one line of a chart.
type series struct {
	name  string
	color string
	ys    []float64
}

// niceStep is the tick spacing, 1, 2 or 5 times a power of ten, that cuts
// span into at most about n intervals.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// ticks returns the tick values from 0 to the first multiple of the nice
// step at or above max, and that step.
func ticks(maxV float64, n int) ([]float64, float64) {
	step := niceStep(maxV, n)
	var out []float64
	for i := 0; ; i++ {
		v := float64(i) * step
		out = append(out, v)
		if v >= maxV*(1-1e-9) {
			break
		}
	}
	return out, step
}

// decimals is how many decimals tick labels of this step need to differ.
func decimals(step float64) int {
	if step >= 1 {
		return 0
	}
	return int(math.Ceil(-math.Log10(step) - 1e-9))
}

// tickLabel formats a y tick of an axis reaching top: in thousands or
// millions when top is that large, with the decimals the step needs, so
// that every label of the axis has the same unit and differs from the others.
func tickLabel(v, step, top float64) string {
	if v == 0 {
		return "0"
	}
	unit, suffix := 1.0, ""
	switch {
	case top >= 1e6:
		unit, suffix = 1e6, "M"
	case top >= 1e3:
		unit, suffix = 1e3, "k"
	}
	return strconv.FormatFloat(v/unit, 'f', decimals(step/unit), 64) + suffix
}

// lineChart draws series over xs as an SVG line chart with axes, ticks and
// a legend. A gap in xs wider than three typical intervals (a phase that
// was not sampled) breaks the lines rather than bridging it.
func lineChart(title, unit string, xs []float64, ss []series) template.HTML {
	const w, h, left, right, top, bottom = 760.0, 260.0, 70.0, 20.0, 30.0, 40.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`, w, h, w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="13" font-weight="bold">%s</text>`, left, template.HTMLEscapeString(title))
	if len(xs) == 0 {
		b.WriteString(`<text x="70" y="120">no samples</text></svg>`)
		return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
	}
	ymax := 0.0
	for _, s := range ss {
		for _, y := range s.ys {
			ymax = math.Max(ymax, y)
		}
	}
	if ymax <= 0 {
		ymax = 1
	}
	xt, xstep := ticks(math.Max(xs[len(xs)-1], 1e-3), 8)
	yt, ystep := ticks(ymax, 4)
	xmax, ytop := xt[len(xt)-1], yt[len(yt)-1]
	px := func(x float64) float64 { return left + (w-left-right)*x/xmax }
	py := func(y float64) float64 { return h - bottom - (h-top-bottom)*y/ytop }
	// Axes and grid.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, left, top, left, h-bottom)
	for _, y := range yt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, py(y), w-right, py(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-4, py(y)+4, tickLabel(y, ystep, ytop))
	}
	for _, x := range xt {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%ss</text>`, px(x), h-bottom+16, strconv.FormatFloat(x, 'f', decimals(xstep), 64))
	}
	fmt.Fprintf(&b, `<text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">%s</text>`, h/2, h/2, template.HTMLEscapeString(unit))
	gap := 3 * typicalInterval(xs)
	for i, s := range ss {
		var pts strings.Builder
		flush := func() {
			if pts.Len() > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, s.color, pts.String())
				pts.Reset()
			}
		}
		for j, y := range s.ys {
			if j >= len(xs) {
				break
			}
			if j > 0 && xs[j]-xs[j-1] > gap {
				flush()
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(xs[j]), py(y))
		}
		flush()
		lx := w - right - 150
		ly := top + 4 + float64(i)*15
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, lx, ly, lx+18, ly, s.color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, lx+22, ly+4, template.HTMLEscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
}

// typicalInterval is the median distance between neighbouring xs.
func typicalInterval(xs []float64) float64 {
	if len(xs) < 2 {
		return math.Inf(1)
	}
	d := make([]float64, 0, len(xs)-1)
	for i := 1; i < len(xs); i++ {
		d = append(d, xs[i]-xs[i-1])
	}
	sort.Float64s(d)
	return d[len(d)/2]
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>wharf bench: {{.Mode}}</title>
<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.n{text-align:right}.chart{margin:1em 0}</style></head><body>
<h1>wharf bench — {{.Mode}}</h1>
<p>Started {{.Started}}. PostgreSQL {{.Version}}.</p>
<table>{{range .Rows}}<tr><th>{{.Name}}</th><td>{{.Value}}</td></tr>{{end}}</table>
{{if .Steps}}<h2>Sweep runs, in order</h2><table><tr>{{range .StepHeader}}<th>{{.}}</th>{{end}}<th>evidence</th></tr>
{{range .Steps}}<tr>{{range .Cells}}<td class="n">{{.}}</td>{{end}}<td>{{.Reason}}</td></tr>{{end}}</table>{{end}}
{{range .Charts}}<div class="chart">{{.}}</div>{{end}}
{{if .Notes}}<h2>Method</h2><ul>{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
<h2>Settings</h2><table>{{range .Settings}}<tr><th>--{{.Name}}</th><td>{{.Value}}</td></tr>{{end}}</table>
</body></html>
`))

func writeHTML(w io.Writer, r *Result) error {
	type namedRow struct{ Name, Value string }
	type stepRow struct {
		Cells  []string
		Reason string
	}
	var rows []namedRow
	for _, x := range r.rows() {
		rows = append(rows, namedRow{strings.TrimSpace(x.name), x.value})
	}
	var steps []stepRow
	for _, s := range r.Steps {
		steps = append(steps, stepRow{stepCells(s), s.VerdictReason})
	}
	n := len(r.Samples)
	xs := make([]float64, n)
	prod, proc, backlog, p50, p99, cpu := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	anyCPU, anyLatency := false, false
	for i, s := range r.Samples {
		xs[i], prod[i], proc[i], backlog[i], p50[i], p99[i], cpu[i] = s.Seconds, s.ProducedRate, s.ProcessedRate, float64(s.Backlog), s.P50, s.P99, s.CPUPercent
		anyCPU = anyCPU || s.CPUPercent > 0
		anyLatency = anyLatency || s.P99 > 0
	}
	rates := []series{{"produced", "#1f77b4", prod}, {"processed", "#d62728", proc}}
	title := "Produced vs processed"
	if r.Mode == ModeDrain {
		// A drain's messages were all there at the start: nothing is produced.
		rates, title = rates[1:], "Processed"
	}
	var charts []template.HTML
	charts = append(charts,
		lineChart(title, "msg/s", xs, rates),
		lineChart("Backlog", "messages", xs, []series{{"backlog", "#2ca02c", backlog}}))
	if r.LatencyMS != nil && anyLatency {
		charts = append(charts, lineChart("Latency commit → ack (per sample interval)", "ms", xs, []series{{"p50", "#9467bd", p50}, {"p99", "#ff7f0e", p99}}))
	}
	if anyCPU {
		charts = append(charts, lineChart("CPU of the bench process with the in-process relay (producers included)", "% of a core", xs, []series{{"cpu", "#8c564b", cpu}}))
	}
	if r.Soak != nil {
		rss, heap, gor, dead := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		for i, s := range r.Samples {
			rss[i], heap[i] = float64(s.RSSBytes)/(1<<20), float64(s.HeapBytes)/(1<<20)
			gor[i], dead[i] = float64(s.Goroutines), float64(s.DeadTuples)
		}
		charts = append(charts,
			lineChart("Memory of the bench process (relay, producers and bench)", "MiB", xs, []series{{"rss", "#17becf", rss}, {"go heap", "#bcbd22", heap}}),
			lineChart("Goroutines", "goroutines", xs, []series{{"goroutines", "#7f7f7f", gor}}),
			lineChart("Outbox dead tuples (n_dead_tup)", "rows", xs, []series{{"dead tuples", "#e377c2", dead}}))
	}
	return reportTmpl.Execute(w, map[string]any{
		"Mode": r.Mode, "Started": r.Started.Format("2006-01-02 15:04:05 MST"), "Version": r.PostgresVersion,
		"Rows": rows, "StepHeader": stepHeader, "Steps": steps, "Charts": charts, "Notes": r.Notes,
		"Settings": r.Settings.Applicable(),
	})
}
