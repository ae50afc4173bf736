package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wharfhq/wharf/wharfflow"
)

// flowsStatus is the flows section of `wharf status`: what the flow gauges
// (wharfflow.Metrics) count, read through the partial indexes of the active
// and the failed instances rather than the whole table, plus the parents
// joining their children (their own partial index) and the live runners.
type flowsStatus struct {
	Runnable              int64   `json:"runnable"`
	OldestRunnableSeconds float64 `json:"oldest_runnable_seconds"`
	Running               int64   `json:"running"`
	Awaiting              int64   `json:"awaiting"`
	Joining               int64   `json:"joining"`
	Failed                int64   `json:"failed"`
	LiveRunners           int64   `json:"live_runners"`
	// Note says why the counts are missing (the role may not read the
	// flow tables, or reading them failed); the counts are zero then.
	Note string `json:"note,omitempty"`
}

// readFlowsStatus returns nil when the schema has no flow tables.
func readFlowsStatus(ctx context.Context, pool *pgxpool.Pool, schema string) (*flowsStatus, error) {
	fc, err := wharfflow.NewClient(pool, schema)
	if err != nil {
		return nil, err
	}
	setup, err := fc.Setup(ctx)
	if err != nil {
		return nil, err
	}
	if !setup.Installed {
		return nil, nil
	}
	if !setup.Readable {
		return &flowsStatus{Note: fmt.Sprintf("not shown: role %s may not read the flow tables", setup.Role)}, nil
	}
	fs := &flowsStatus{}
	if err := fs.read(ctx, pool, schema); err != nil {
		return &flowsStatus{Note: "not shown: " + oneLineError(err)}, nil
	}
	return fs, nil
}

func (fs *flowsStatus) read(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	// The gauges' own query, as a scrape runs it (sequential scans off,
	// bounded), summed over the flows.
	reg := prometheus.NewRegistry()
	if err := reg.Register(wharfflow.NewMetrics(pool, schema)); err != nil {
		return err
	}
	families, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue()
			switch mf.GetName() {
			case "wharf_flow_runnable":
				fs.Runnable += int64(v)
			case "wharf_flow_oldest_runnable_seconds":
				fs.OldestRunnableSeconds = max(fs.OldestRunnableSeconds, secs(time.Duration(v*float64(time.Second))))
			case "wharf_flow_running":
				fs.Running += int64(v)
			case "wharf_flow_awaiting":
				fs.Awaiting += int64(v)
			case "wharf_flow_failed":
				fs.Failed += int64(v)
			}
		}
	}
	return pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.flow_instances WHERE status = 'joining'),
       (SELECT count(*) FROM `+schema+`.flow_runners WHERE alive_until > now())`).Scan(&fs.Joining, &fs.LiveRunners)
}

func writeFlowsStatus(w io.Writer, fs *flowsStatus) {
	if fs == nil {
		return
	}
	if fs.Note != "" {
		fmt.Fprintf(w, "flows\t%s\n", fs.Note)
		return
	}
	oldest := ""
	if fs.Runnable > 0 {
		oldest = fmt.Sprintf(" (oldest due %s ago)", roundAge(time.Duration(fs.OldestRunnableSeconds*float64(time.Second))))
	}
	fmt.Fprintf(w, "flows\t%d runnable%s, %d running, %d awaiting a signal, %d joining children, %d failed\n",
		fs.Runnable, oldest, fs.Running, fs.Awaiting, fs.Joining, fs.Failed)
	fmt.Fprintf(w, "  runners\t%d live\n", fs.LiveRunners)
	if fs.Failed > 0 {
		fmt.Fprintf(w, "  failed\t%d instance(s) wait to be retried or cancelled: wharf flow list --status failed\n", fs.Failed)
	}
}
