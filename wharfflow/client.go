package wharfflow

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// ErrNoInstance is returned (wrapped: test with errors.Is) when a signal,
// cancel, retry or read finds no instance it can act on: none with that id
// or key, or one that has ended. The error's text says which.
var ErrNoInstance = errors.New("wharfflow: no such instance")

// noInstance is an ErrNoInstance saying why.
type noInstance struct{ msg string }

func (e *noInstance) Error() string { return "wharfflow: " + e.msg }
func (e *noInstance) Unwrap() error { return ErrNoInstance }

func errNoInstance(format string, args ...any) error {
	return &noInstance{msg: fmt.Sprintf(format, args...)}
}

// ErrNoPool is returned by the calls that need the client's own pool when it
// was created without one.
var ErrNoPool = errors.New("wharfflow: the client has no pool (NewClient(nil, ...) only works inside the caller's transactions)")

// Client starts and signals instances, and reads and changes them for
// operators.
type Client struct {
	schema string
	pool   *pgxpool.Pool
	tracer Tracer
}

// NewClient returns a client for the flows in schema ("" is the default,
// wharf). pool may be nil for a client used only inside the caller's
// transactions (StartTx, SignalTx).
func NewClient(pool *pgxpool.Pool, schema string, opts ...ClientOption) (*Client, error) {
	if schema == "" {
		schema = wharfmigrate.DefaultSchema
	}
	if err := wharfmigrate.ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("wharfflow: schema: %w", err)
	}
	c := &Client{schema: schema, pool: pool}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

type wireStart struct {
	Flow             string            `json:"flow"`
	Step             string            `json:"step"`
	State            json.RawMessage   `json:"state"`
	Key              string            `json:"key,omitempty"`
	Priority         int               `json:"priority,omitempty"`
	RunAt            *time.Time        `json:"run_at,omitempty"`
	ConcurrencyKey   string            `json:"concurrency_key,omitempty"`
	ConcurrencyLimit int               `json:"concurrency_limit,omitempty"`
	RateKey          string            `json:"rate_key,omitempty"`
	Trace            map[string]string `json:"trace,omitempty"`
}

func encodeStarts(starts []Start, trace map[string]string) (string, error) {
	ws := make([]wireStart, len(starts))
	for i, s := range starts {
		if s.err != nil {
			return "", fmt.Errorf("wharfflow: start %d: encoding the state: %w", i, s.err)
		}
		if s.flow == "" || s.step == "" {
			return "", fmt.Errorf("wharfflow: start %d: use Flow.Start, on a flow with at least one step", i)
		}
		for _, k := range [...]struct{ name, v string }{{"Key", s.opts.Key}, {"ConcurrencyKey", s.opts.ConcurrencyKey}, {"RateKey", s.opts.RateKey}} {
			if err := checkKey(k.v); err != nil {
				return "", fmt.Errorf("wharfflow: start %d: StartOptions.%s %w", i, k.name, err)
			}
		}
		ws[i] = wireStart{Flow: s.flow, Step: s.step, State: s.state, Key: s.opts.Key, Priority: s.opts.Priority,
			RunAt: ptrTime(s.opts.RunAt), ConcurrencyKey: s.opts.ConcurrencyKey,
			ConcurrencyLimit: s.opts.ConcurrencyLimit, RateKey: s.opts.RateKey, Trace: trace}
	}
	b, err := json.Marshal(ws)
	return string(b), err
}

// querier is what a pgx.Tx, a pool and a *sql.Tx are used for here.
type querier func(ctx context.Context, q string, arg string) (rowScanner, error)

type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// pgxQueryer is a pgx.Tx or a pool (a statement in a transaction of its
// own).
type pgxQueryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func pgxQuerier(db pgxQueryer) querier {
	return func(ctx context.Context, q, arg string) (rowScanner, error) {
		rows, err := db.Query(ctx, q, arg)
		if err != nil {
			return nil, err
		}
		return pgxRows{rows}, nil
	}
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() { r.Rows.Close() }

func sqlQuerier(tx *sql.Tx) querier {
	return func(ctx context.Context, q, arg string) (rowScanner, error) {
		rows, err := tx.QueryContext(ctx, q, arg)
		if err != nil {
			return nil, err
		}
		return sqlRows{rows}, nil
	}
}

// ordIDs runs a start_flows/signal_flows call and returns the ids in order.
func ordIDs(ctx context.Context, query querier, q, doc string, n int) ([]*int64, error) {
	rows, err := query(ctx, q, doc)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]*int64, n)
	for rows.Next() {
		var ord int64
		var id *int64
		if err := rows.Scan(&ord, &id); err != nil {
			return nil, err
		}
		out[ord-1] = id
	}
	return out, rows.Err()
}

func (c *Client) start(ctx context.Context, query querier, starts []Start) ([]int64, error) {
	if len(starts) == 0 {
		return nil, nil
	}
	doc, err := encodeStarts(starts, c.traceCarrier(ctx))
	if err != nil {
		return nil, err
	}
	ids, err := ordIDs(ctx, query, "SELECT ord, id FROM "+c.schema+".start_flows($1::jsonb)", doc, len(starts))
	if err != nil {
		return nil, fmt.Errorf("wharfflow: start: %w", err)
	}
	out := make([]int64, len(ids))
	for i, id := range ids {
		if id == nil {
			return nil, fmt.Errorf("wharfflow: start %d: no id returned", i)
		}
		out[i] = *id
	}
	return out, nil
}

// StartTx starts instances inside tx, in one round trip, and returns their
// ids in order. A start whose correlation key (StartOptions.Key) is taken by
// an active instance of its flow starts nothing: its id is that instance's.
func (c *Client) StartTx(ctx context.Context, tx pgx.Tx, starts ...Start) ([]int64, error) {
	return c.start(ctx, pgxQuerier(tx), starts)
}

// StartSQLTx is StartTx for a database/sql transaction.
func (c *Client) StartSQLTx(ctx context.Context, tx *sql.Tx, starts ...Start) ([]int64, error) {
	return c.start(ctx, sqlQuerier(tx), starts)
}

// Start starts instances in a transaction of its own: one statement, one
// round trip.
func (c *Client) Start(ctx context.Context, starts ...Start) ([]int64, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	return c.start(ctx, pgxQuerier(c.pool), starts)
}

// Signal is a signal to send to an instance: addressed by Instance, or by
// Flow and correlation Key.
type Signal struct {
	Instance  int64
	Flow, Key string
	// Name is what Await waits for.
	Name string
	// Payload is saved as JSON (nil for none).
	Payload any
	// DedupKey, when set, makes a second signal with the same key to the
	// same instance a no-op (its id is the first one's).
	DedupKey string
}

type wireSignal struct {
	Instance int64           `json:"instance,omitempty"`
	Flow     string          `json:"flow,omitempty"`
	Key      string          `json:"key,omitempty"`
	Name     string          `json:"name"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	DedupKey string          `json:"dedup_key,omitempty"`
}

// signal records sigs. strict: the call fails, recording nothing, when a
// signal matches no active instance (for a statement in a transaction of
// its own, which cannot be rolled back once it returned).
func (c *Client) signal(ctx context.Context, query querier, sigs []Signal, strict bool) ([]int64, error) {
	if len(sigs) == 0 {
		return nil, nil
	}
	ws := make([]wireSignal, len(sigs))
	for i, s := range sigs {
		if s.Name == "" {
			return nil, fmt.Errorf("wharfflow: signal %d: Name is required", i)
		}
		if s.Instance == 0 && (s.Flow == "" || s.Key == "") {
			return nil, fmt.Errorf("wharfflow: signal %d: set Instance, or Flow and Key", i)
		}
		ws[i] = wireSignal{Instance: s.Instance, Flow: s.Flow, Key: s.Key, Name: s.Name, DedupKey: s.DedupKey}
		if s.Payload != nil {
			b, err := json.Marshal(s.Payload)
			if err != nil {
				return nil, fmt.Errorf("wharfflow: signal %d payload: %w", i, err)
			}
			ws[i].Payload = b
		}
		if s.Instance != 0 {
			ws[i].Flow, ws[i].Key = "", ""
		}
	}
	doc, err := json.Marshal(ws)
	if err != nil {
		return nil, err
	}
	ids, err := ordIDs(ctx, query, "SELECT ord, id FROM "+c.schema+".signal_flows($1::jsonb, "+strconv.FormatBool(strict)+")", string(doc), len(sigs))
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == noDataFound {
		return nil, &noInstance{msg: pgErr.Message}
	}
	if err != nil {
		return nil, fmt.Errorf("wharfflow: signal: %w", err)
	}
	out := make([]int64, len(ids))
	for i, id := range ids {
		if id == nil {
			s := sigs[i]
			which := "signal " + s.Name
			if len(sigs) > 1 {
				which = fmt.Sprintf("signal %d (%s)", i, s.Name)
			}
			if s.Instance != 0 {
				return nil, errNoInstance("%s: instance %d is not active (it ended, or there is none)", which, s.Instance)
			}
			return nil, errNoInstance("%s: flow %s has no active instance with key %q", which, s.Flow, s.Key)
		}
		out[i] = *id
	}
	return out, nil
}

// SignalTx records signals inside tx, in one round trip, and returns their
// ids. A signal to no active instance fails the call with ErrNoInstance.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, sigs ...Signal) ([]int64, error) {
	return c.signal(ctx, pgxQuerier(tx), sigs, false)
}

// SignalSQLTx is SignalTx for a database/sql transaction.
func (c *Client) SignalSQLTx(ctx context.Context, tx *sql.Tx, sigs ...Signal) ([]int64, error) {
	return c.signal(ctx, sqlQuerier(tx), sigs, false)
}

// Send records signals in a transaction of its own, one statement and one
// round trip: all of them, or none when one addresses no active instance
// (ErrNoInstance, naming it).
func (c *Client) Send(ctx context.Context, sigs ...Signal) ([]int64, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	return c.signal(ctx, pgxQuerier(c.pool), sigs, true)
}

// noDataFound is the SQLSTATE signal_flows raises, in strict mode, for a
// signal that matches no active instance.
const noDataFound = "P0002"

// Cancel cancels instance id and its descendants that have not ended, and
// returns how many it cancelled. ErrNoInstance when there is no instance id
// or it has ended (done or cancelled) already.
func (c *Client) Cancel(ctx context.Context, id int64) (int, error) {
	if c.pool == nil {
		return 0, ErrNoPool
	}
	var n int
	if err := c.pool.QueryRow(ctx, "SELECT "+c.schema+".cancel_flow($1)", id).Scan(&n); err != nil {
		return 0, fmt.Errorf("wharfflow: cancel: %w", err)
	}
	if n == 0 {
		status, err := c.status(ctx, id)
		if err != nil {
			return 0, err
		}
		return 0, errNoInstance("instance %d is %s already: there is nothing to cancel", id, status)
	}
	return n, nil
}

// Retry runs a failed instance's failed step again, from attempt 0.
// ErrNoInstance when there is no instance id or it has not failed; an error
// when its correlation key was taken by an instance started since it
// failed (cancel that one first).
func (c *Client) Retry(ctx context.Context, id int64) error {
	if c.pool == nil {
		return ErrNoPool
	}
	var ok bool
	if err := c.pool.QueryRow(ctx, "SELECT "+c.schema+".retry_flow($1)", id).Scan(&ok); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.Hint != "" {
			return fmt.Errorf("wharfflow: retry: %s (%s)", pgErr.Message, pgErr.Hint)
		}
		return fmt.Errorf("wharfflow: retry: %w", err)
	}
	if !ok {
		status, err := c.status(ctx, id)
		if err != nil {
			return err
		}
		return errNoInstance("instance %d is %s: only failed instances can be retried", id, status)
	}
	return nil
}

// status is instance id's status; ErrNoInstance when there is none.
func (c *Client) status(ctx context.Context, id int64) (string, error) {
	var status string
	err := c.pool.QueryRow(ctx, "SELECT status FROM "+c.schema+".flow_instances WHERE id = $1", id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errNoInstance("there is no instance %d", id)
	}
	if err != nil {
		return "", fmt.Errorf("wharfflow: reading instance %d: %w", id, err)
	}
	return status, nil
}
