package wharfflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Instance is a flow instance as operators see it.
type Instance struct {
	ID       int64      `json:"id"`
	Flow     string     `json:"flow"`
	Key      string     `json:"key,omitempty"`
	Status   string     `json:"status"`
	Step     string     `json:"step"`
	Attempt  int        `json:"attempt"`
	Priority int        `json:"priority"`
	RunAt    *time.Time `json:"run_at,omitempty"`
	// NotBefore is the current step's own time: a scheduled step (Next
	// with a time, a retry's backoff, a start's RunAt) does not run before.
	NotBefore time.Time `json:"not_before"`
	// LeaseOwner is the runner holding the step's lease (running), or, of
	// an awaiting instance, the runner that wrote the await, to which its
	// signal leases it while that runner is alive.
	LeaseOwner   string   `json:"lease_owner,omitempty"`
	ParentID     int64    `json:"parent_id,omitempty"`
	AwaitSignals []string `json:"await_signals,omitempty"`
	// TimeoutStep is the step an awaiting instance resumes at when its
	// deadline (RunAt) passes without the signals.
	TimeoutStep    string          `json:"timeout_step,omitempty"`
	ConcurrencyKey string          `json:"concurrency_key,omitempty"`
	RateKey        string          `json:"rate_key,omitempty"`
	State          json.RawMessage `json:"state"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          string          `json:"error,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	FinishedAt     *time.Time      `json:"finished_at,omitempty"`
}

// StepRecord is one executed step in an instance's history.
type StepRecord struct {
	Step       string    `json:"step"`
	Attempt    int       `json:"attempt"`
	Outcome    string    `json:"outcome"`
	Error      string    `json:"error,omitempty"`
	Runner     string    `json:"runner"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// SignalRecord is a signal an instance received.
type SignalRecord struct {
	ID           int64           `json:"id"`
	Name         string          `json:"name"`
	Payload      json.RawMessage `json:"payload,omitempty"`
	DedupKey     string          `json:"dedup_key,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	ConsumedAt   *time.Time      `json:"consumed_at,omitempty"`
	ConsumedStep string          `json:"consumed_step,omitempty"`
}

// Details is an instance with its step history and signals.
type Details struct {
	Instance
	Steps   []StepRecord   `json:"steps"`
	Signals []SignalRecord `json:"signals"`
}

const instanceColumns = `id, flow, coalesce(correlation_key, ''), status, step, attempt, priority,
CASE WHEN run_at < 'infinity' THEN run_at END, not_before, coalesce(lease_owner, ''), coalesce(parent_id, 0),
await_signals, coalesce(timeout_step, ''), coalesce(concurrency_key, ''), coalesce(rate_key, ''), state, result, coalesce(error, ''),
created_at, updated_at, finished_at`

func scanInstance(row pgx.Row) (Instance, error) {
	var i Instance
	err := row.Scan(&i.ID, &i.Flow, &i.Key, &i.Status, &i.Step, &i.Attempt, &i.Priority, &i.RunAt, &i.NotBefore, &i.LeaseOwner,
		&i.ParentID, &i.AwaitSignals, &i.TimeoutStep, &i.ConcurrencyKey, &i.RateKey, &i.State, &i.Result, &i.Error,
		&i.CreatedAt, &i.UpdatedAt, &i.FinishedAt)
	return i, err
}

// ListOptions filter List.
type ListOptions struct {
	// Flow and Status, when set, keep only instances of that flow and status.
	Flow, Status string
	// Key, when set, keeps only instances with this correlation key.
	Key string
	// Parent, when set, keeps only the children of this instance.
	Parent int64
	// Limit defaults to 100.
	Limit int
	// Before, when set, lists instances with a lower id (the next page).
	Before int64
}

// statuses are the statuses an instance can have.
var statuses = []string{"ready", "running", "awaiting", "joining", "done", "failed", "cancelled"}

// Statuses returns the statuses an instance can have, in the order of its
// life: ready, running, awaiting, joining, done, failed, cancelled.
func Statuses() []string { return slices.Clone(statuses) }

// List returns instances, newest first.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Instance, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	if o.Status != "" && !slices.Contains(statuses, o.Status) {
		return nil, fmt.Errorf("wharfflow: unknown status %q: use one of %s", o.Status, strings.Join(statuses, ", "))
	}
	q := "SELECT " + instanceColumns + " FROM " + c.schema + ".flow_instances WHERE ($1 = '' OR flow = $1) AND ($2 = '' OR status = $2) AND ($3 = 0 OR id < $3)" +
		" AND ($5 = '' OR correlation_key = $5) AND ($6 = 0 OR parent_id = $6) ORDER BY id DESC LIMIT $4"
	rows, err := c.pool.Query(ctx, q, o.Flow, o.Status, o.Before, o.Limit, o.Key, o.Parent)
	if err != nil {
		return nil, fmt.Errorf("wharfflow: list: %w", err)
	}
	defer rows.Close()
	var out []Instance
	for rows.Next() {
		i, err := scanInstance(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, rows.Err()
}

// Get returns instance id with its step history and signals; ErrNoInstance
// when there is none.
func (c *Client) Get(ctx context.Context, id int64) (Details, error) {
	if c.pool == nil {
		return Details{}, ErrNoPool
	}
	var d Details
	i, err := scanInstance(c.pool.QueryRow(ctx, "SELECT "+instanceColumns+" FROM "+c.schema+".flow_instances WHERE id = $1", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, errNoInstance("there is no instance %d", id)
	}
	if err != nil {
		return d, fmt.Errorf("wharfflow: get: %w", err)
	}
	d.Instance = i
	rows, err := c.pool.Query(ctx, "SELECT step, attempt, outcome, coalesce(error, ''), runner, started_at, finished_at FROM "+
		c.schema+".flow_steps WHERE instance_id = $1 ORDER BY finished_at, started_at", id)
	if err != nil {
		return d, err
	}
	for rows.Next() {
		var s StepRecord
		if err := rows.Scan(&s.Step, &s.Attempt, &s.Outcome, &s.Error, &s.Runner, &s.StartedAt, &s.FinishedAt); err != nil {
			rows.Close()
			return d, err
		}
		d.Steps = append(d.Steps, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return d, err
	}
	rows, err = c.pool.Query(ctx, "SELECT id, name, payload, coalesce(dedup_key, ''), created_at, consumed_at, coalesce(consumed_step, '') FROM "+
		c.schema+".flow_signals WHERE instance_id = $1 ORDER BY id", id)
	if err != nil {
		return d, err
	}
	defer rows.Close()
	for rows.Next() {
		var s SignalRecord
		if err := rows.Scan(&s.ID, &s.Name, &s.Payload, &s.DedupKey, &s.CreatedAt, &s.ConsumedAt, &s.ConsumedStep); err != nil {
			return d, err
		}
		d.Signals = append(d.Signals, s)
	}
	return d, rows.Err()
}

// Wait returns instance id once it has ended (done, failed or cancelled),
// looking every interval, or ctx's error.
func (c *Client) Wait(ctx context.Context, id int64, interval time.Duration) (Instance, error) {
	if c.pool == nil {
		return Instance{}, ErrNoPool
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		i, err := scanInstance(c.pool.QueryRow(ctx, "SELECT "+instanceColumns+" FROM "+c.schema+".flow_instances WHERE id = $1", id))
		if err != nil {
			return i, fmt.Errorf("wharfflow: wait: %w", err)
		}
		if i.Status == "done" || i.Status == "failed" || i.Status == "cancelled" {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return i, ctx.Err()
		case <-t.C:
		}
	}
}

// StatusCount is how many instances of a flow have a status.
type StatusCount struct {
	Flow   string `json:"flow"`
	Status string `json:"status"`
	N      int64  `json:"n"`
	// Later counts, of ready instances, those whose step is not due yet
	// (scheduled, or waiting out a retry's backoff).
	Later int64 `json:"later,omitempty"`
}

// StatusCounts counts the instances of every flow per status, ended ones
// (done, cancelled: kept for Config.Retention) included, ordered by flow and
// status. It reads the whole table once.
func (c *Client) StatusCounts(ctx context.Context) ([]StatusCount, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	rows, err := c.pool.Query(ctx, "SELECT flow, status, count(*), count(*) FILTER (WHERE status = 'ready' AND run_at > now()) FROM "+
		c.schema+".flow_instances GROUP BY 1, 2 ORDER BY 1, 2")
	if err != nil {
		return nil, fmt.Errorf("wharfflow: counts: %w", err)
	}
	defer rows.Close()
	var out []StatusCount
	for rows.Next() {
		var sc StatusCount
		if err := rows.Scan(&sc.Flow, &sc.Status, &sc.N, &sc.Later); err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, rows.Err()
}

// Schema is the schema of the client's flows.
func (c *Client) Schema() string { return c.schema }

// Setup is whether a schema has the flow tables and whether the client's
// role may read them.
type Setup struct {
	// Installed is false on a schema without the flow tables (migrated
	// before migration 7, or by a tool that stops earlier).
	Installed bool
	// Readable is false when the role may not read flow_instances.
	Readable bool
	// Role is the database role the client's pool connects as.
	Role string
}

// Setup says whether the schema has the flow tables and the client's role
// may read them; the operators' calls fail without.
func (c *Client) Setup(ctx context.Context) (Setup, error) {
	if c.pool == nil {
		return Setup{}, ErrNoPool
	}
	var s Setup
	err := c.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, coalesce(has_table_privilege(to_regclass($1), 'SELECT'), false), current_user",
		c.schema+".flow_instances").Scan(&s.Installed, &s.Readable, &s.Role)
	if err != nil {
		return s, fmt.Errorf("wharfflow: looking for the flow tables: %w", err)
	}
	return s, nil
}
