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
	"strconv"
	"strings"
	"text/tabwriter"
)

// row is one line of the summary table.
type row struct{ name, value string }

func (r *Result) rows() []row {
	num := func(v float64, unit string) string {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64) + unit
	}
	rows := []row{{"mode", string(r.Mode)}}
	add := func(name, value string) { rows = append(rows, row{name, value}) }
	switch r.Mode {
	case ModeSteady, ModeSweep:
		add("target rate", num(r.TargetRate, " msg/s"))
	}
	add("messages", strconv.FormatInt(r.Messages, 10))
	add("relays", relaysText(r))
	add("producer rate", num(r.ProducerRate, " msg/s"))
	if r.Mode != ModeBaseline {
		add("processing rate", num(r.ProcessingRate, " msg/s"))
	}
	if r.Mode == ModeSteady || r.Mode == ModeSweep {
		add("backlog slope", fmt.Sprintf("%.1f msg/s", r.BacklogSlope))
		add("backlog at stop", strconv.FormatInt(r.BacklogAtStop, 10))
	}
	if r.Mode != ModeBaseline {
		d := fmt.Sprintf("%.2f s", r.DrainSeconds)
		if r.DrainSeconds < 0 {
			d = "did not catch up within --tail-wait"
		}
		add("drain time", d)
		add("delivered", fmt.Sprintf("%d (%d redelivered)", r.Delivered, r.Redelivered))
	}
	if r.Mode == ModeSteady || r.Mode == ModeSweep {
		v := "NOT sustainable"
		if r.Sustainable {
			v = "sustainable"
		}
		add("verdict", v)
	}
	add("verdict reason", r.VerdictReason)
	if r.LatencyMS != nil {
		l := r.LatencyMS
		add("latency commit→ack", fmt.Sprintf("p50 %.2f  p95 %.2f  p99 %.2f  max %.2f ms (%d msgs)", l.P50, l.P95, l.P99, l.Max, l.Count))
	} else {
		add("latency commit→ack", r.LatencyNote)
	}
	if r.SinkPublishRate > 0 {
		add("sink publish rate", num(r.SinkPublishRate, " msg/s (direct, no outbox)"))
	}
	add("WAL per message", fmt.Sprintf("%.0f bytes", r.WALBytesPerMsg))
	add("commits per message", fmt.Sprintf("%.4f", r.CommitsPerMsg))
	add("dead tuples at end", strconv.FormatInt(r.DeadTuples, 10))
	add("outbox rows at end", strconv.FormatInt(r.OutboxRemaining, 10))
	if r.Mode != ModeBaseline {
		add("relay CPU", fmt.Sprintf("%.2f s", r.RelayCPUSeconds))
		add("relay peak RSS", fmt.Sprintf("%.1f MB", float64(r.RelayPeakRSSBytes)/1e6))
		add("relay usage", r.RelayUsageNote)
	}
	add("PostgreSQL", r.PostgresVersion)
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

// WriteSummary writes the terminal summary table.
func WriteSummary(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range r.rows() {
		fmt.Fprintf(tw, "%s\t%s\n", row.name, row.value)
	}
	if len(r.Steps) > 0 {
		fmt.Fprintln(tw, "\nsweep steps:")
		fmt.Fprintln(tw, "rate\tproducer\tprocessing\tslope\tbacklog at stop\tp99 ms\tsustainable")
		for _, s := range r.Steps {
			p99 := "-"
			if s.LatencyMS != nil {
				p99 = fmt.Sprintf("%.1f", s.LatencyMS.P99)
			}
			fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.1f\t%d\t%s\t%v\n", s.Rate, s.ProducerRate, s.ProcessingRate, s.BacklogSlope, s.BacklogAtStop, p99, s.Sustainable)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(tw, "note: %s\n", n)
	}
	return tw.Flush()
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
	_ = w.Write([]string{"second", "produced", "processed", "backlog", "p50_ms", "p99_ms", "cpu_pct"})
	ff := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	for _, s := range samples {
		_ = w.Write([]string{ff(s.Seconds, 3), ff(s.ProducedRate, 0), ff(s.ProcessedRate, 0),
			strconv.FormatInt(s.Backlog, 10), ff(s.P50, 3), ff(s.P99, 3), ff(s.CPUPercent, 1)})
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

// lineChart draws series over xs as an SVG line chart with axes, ticks and
// a legend.
func lineChart(title, unit string, xs []float64, ss []series) template.HTML {
	const w, h, left, right, top, bottom = 760.0, 260.0, 70.0, 20.0, 30.0, 40.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`, w, h, w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="13" font-weight="bold">%s</text>`, left, template.HTMLEscapeString(title))
	if len(xs) == 0 {
		b.WriteString(`<text x="70" y="120">no samples</text></svg>`)
		return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
	}
	xmax := xs[len(xs)-1]
	if xmax <= 0 {
		xmax = 1
	}
	ymax := 0.0
	for _, s := range ss {
		for _, y := range s.ys {
			ymax = math.Max(ymax, y)
		}
	}
	ymax = niceCeil(ymax)
	px := func(x float64) float64 { return left + (w-left-right)*x/xmax }
	py := func(y float64) float64 { return h - bottom - (h-top-bottom)*y/ymax }
	// Axes and grid.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, left, top, left, h-bottom)
	for i := 0; i <= 4; i++ {
		y := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, py(y), w-right, py(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-4, py(y)+4, shortNum(y))
		x := xmax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.1fs</text>`, px(x), h-bottom+16, x)
	}
	fmt.Fprintf(&b, `<text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">%s</text>`, (h)/2, (h)/2, template.HTMLEscapeString(unit))
	for i, s := range ss {
		var pts strings.Builder
		for j, y := range s.ys {
			if j < len(xs) {
				fmt.Fprintf(&pts, "%.1f,%.1f ", px(xs[j]), py(y))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, s.color, pts.String())
		lx := w - right - 150
		ly := top + 4 + float64(i)*15
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, lx, ly, lx+18, ly, s.color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, lx+22, ly+4, template.HTMLEscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func shortNum(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>wharf bench: {{.Mode}}</title>
<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.chart{margin:1em 0}</style></head><body>
<h1>wharf bench — {{.Mode}}</h1>
<p>Started {{.Started}}. PostgreSQL {{.Version}}.</p>
<table>{{range .Rows}}<tr><th>{{.Name}}</th><td>{{.Value}}</td></tr>{{end}}</table>
{{if .Steps}}<h2>Sweep steps</h2><table><tr><th>rate</th><th>producer</th><th>processing</th><th>slope</th><th>backlog at stop</th><th>p99 ms</th><th>sustainable</th><th>reason</th></tr>
{{range .Steps}}<tr><td>{{.Rate}}</td><td>{{printf "%.0f" .ProducerRate}}</td><td>{{printf "%.0f" .ProcessingRate}}</td><td>{{printf "%.1f" .BacklogSlope}}</td><td>{{.BacklogAtStop}}</td><td>{{with .LatencyMS}}{{printf "%.1f" .P99}}{{else}}-{{end}}</td><td>{{.Sustainable}}</td><td>{{.VerdictReason}}</td></tr>{{end}}</table>{{end}}
{{range .Charts}}<div class="chart">{{.}}</div>{{end}}
{{if .Notes}}<h2>Method</h2><ul>{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
<h2>Settings</h2><pre>{{.Settings}}</pre>
</body></html>
`))

func writeHTML(w io.Writer, r *Result) error {
	type namedRow struct{ Name, Value string }
	var rows []namedRow
	for _, x := range r.rows() {
		rows = append(rows, namedRow{x.name, x.value})
	}
	n := len(r.Samples)
	xs := make([]float64, n)
	prod, proc, backlog, p50, p99, cpu := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	anyCPU := false
	for i, s := range r.Samples {
		xs[i], prod[i], proc[i], backlog[i], p50[i], p99[i], cpu[i] = s.Seconds, s.ProducedRate, s.ProcessedRate, float64(s.Backlog), s.P50, s.P99, s.CPUPercent
		anyCPU = anyCPU || s.CPUPercent > 0
	}
	charts := []template.HTML{
		lineChart("Produced vs processed", "msg/s", xs, []series{{"produced", "#1f77b4", prod}, {"processed", "#d62728", proc}}),
		lineChart("Backlog", "messages", xs, []series{{"backlog", "#2ca02c", backlog}}),
	}
	if r.LatencyMS != nil {
		charts = append(charts, lineChart("Latency commit → ack (per sample interval)", "ms", xs, []series{{"p50", "#9467bd", p50}, {"p99", "#ff7f0e", p99}}))
	}
	if anyCPU {
		charts = append(charts, lineChart("CPU of the bench process with the in-process relay (producers included)", "% of a core", xs, []series{{"cpu", "#8c564b", cpu}}))
	}
	settings, _ := json.MarshalIndent(r.Settings, "", "  ")
	return reportTmpl.Execute(w, map[string]any{
		"Mode": r.Mode, "Started": r.Started.Format("2006-01-02 15:04:05 MST"), "Version": r.PostgresVersion,
		"Rows": rows, "Steps": r.Steps, "Charts": charts, "Notes": r.Notes, "Settings": string(settings),
	})
}
