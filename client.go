package wharf

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// ErrNotMigrated is returned when the outbox schema does not exist or is older
// than this version of Wharf expects. The message tells the operator to run
// `wharf migrate up`.
var ErrNotMigrated = wharfmigrate.ErrNotMigrated

// Client enqueues messages and runs the relay.
type Client struct {
	cfg  Config
	pool *pgxpool.Pool
	q    queries

	mu      sync.Mutex
	relay   *relay
	stopped chan struct{}
}

// NewClient returns a client for the outbox in cfg.Schema. pool may be nil for
// a client that only enqueues inside transactions the caller owns.
func NewClient(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Client{cfg: c, pool: pool, q: newQueries(c.Schema), stopped: make(chan struct{})}, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

func validateMessages(msgs []Message) error {
	for i := range msgs {
		if msgs[i].Topic == "" {
			return fmt.Errorf("wharf: message %d: Topic is required", i)
		}
	}
	return nil
}

// EnqueueTx inserts msgs inside tx, in one round trip, and returns their ids in
// order. A message whose DedupKey matches one still in the outbox is not
// inserted again; its id is the existing message's id.
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := validateMessages(msgs); err != nil {
		return nil, err
	}
	n := len(msgs)
	topics := make([]string, n)
	keys := make([]*string, n)
	payloads := make([][]byte, n)
	headers := make([]*string, n)
	deliverAt := make([]*time.Time, n)
	dedup := make([]*string, n)
	hasDedup := false
	for i := range msgs {
		m := &msgs[i]
		topics[i] = m.Topic
		if m.Key != "" {
			keys[i] = &m.Key
		}
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("wharf: message %d headers: %w", i, err)
			}
			s := string(b)
			headers[i] = &s
		}
		if !m.DeliverAt.IsZero() {
			deliverAt[i] = &m.DeliverAt
		}
		if m.DedupKey != "" {
			dedup[i] = &m.DedupKey
			hasDedup = true
		}
	}
	args := []any{topics, keys, payloads, headers, deliverAt, dedup}
	if !hasDedup {
		return scanIDs(tx.Query(ctx, c.q.enqueueArrays, args...))
	}
	rows, err := tx.Query(ctx, c.q.enqueueArraysDedup, args...)
	return c.mapDedup(ctx, msgs, rows, err, func(keys []string) (pgx.Rows, error) {
		return tx.Query(ctx, c.q.dedupLookup, keys)
	})
}

// EnqueueSQLTx is EnqueueTx for a database/sql transaction (any PostgreSQL
// driver: the batch travels as one JSON parameter).
func (c *Client) EnqueueSQLTx(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := validateMessages(msgs); err != nil {
		return nil, err
	}
	type jm struct {
		Topic     string            `json:"topic"`
		Key       *string           `json:"key,omitempty"`
		Payload   string            `json:"payload"`
		Headers   map[string]string `json:"headers,omitempty"`
		DeliverAt *time.Time        `json:"deliver_at,omitempty"`
		DedupKey  *string           `json:"dedup_key,omitempty"`
	}
	batch := make([]jm, len(msgs))
	hasDedup := false
	for i := range msgs {
		m := &msgs[i]
		batch[i] = jm{Topic: m.Topic, Payload: base64.StdEncoding.EncodeToString(m.Payload), Headers: m.Headers}
		if m.Key != "" {
			batch[i].Key = &m.Key
		}
		if !m.DeliverAt.IsZero() {
			batch[i].DeliverAt = &m.DeliverAt
		}
		if m.DedupKey != "" {
			batch[i].DedupKey = &m.DedupKey
			hasDedup = true
		}
	}
	doc, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("wharf: encode batch: %w", err)
	}
	q := c.q.enqueueJSON
	if hasDedup {
		q = c.q.enqueueJSONDedup
	}
	rows, err := tx.QueryContext(ctx, q, string(doc))
	if err != nil {
		return nil, wrapEnqueueErr(err)
	}
	defer rows.Close()
	var ids []int64
	byKey := map[string]int64{}
	for rows.Next() {
		var id int64
		var dk sql.NullString
		if hasDedup {
			err = rows.Scan(&id, &dk)
		} else {
			err = rows.Scan(&id)
		}
		if err != nil {
			return nil, wrapEnqueueErr(err)
		}
		if dk.Valid {
			byKey[dk.String] = id
		} else {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrapEnqueueErr(err)
	}
	if !hasDedup {
		return ids, nil
	}
	return assignIDs(msgs, ids, byKey, func(missing []string) (map[string]int64, error) {
		// Duplicates of messages committed earlier: look up their ids.
		found := map[string]int64{}
		for _, k := range missing {
			var id int64
			err := tx.QueryRowContext(ctx, `SELECT id FROM `+c.cfg.Schema+`.outbox WHERE dedup_key = $1`, k).Scan(&id)
			if err == nil {
				found[k] = id
			} else if !errors.Is(err, sql.ErrNoRows) {
				return nil, wrapEnqueueErr(err)
			}
		}
		return found, nil
	})
}

// Enqueue inserts msgs in a transaction of its own. Prefer EnqueueTx, which
// commits the messages atomically with the caller's business data.
func (c *Client) Enqueue(ctx context.Context, msgs ...Message) ([]int64, error) {
	if c.pool == nil {
		return nil, errors.New("wharf: Enqueue needs a client created with a pool; use EnqueueTx with your transaction")
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = c.EnqueueTx(ctx, tx, msgs...)
		return err
	})
	return ids, err
}

func scanIDs(rows pgx.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, wrapEnqueueErr(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, wrapEnqueueErr(err)
	}
	return ids, nil
}

func (c *Client) mapDedup(ctx context.Context, msgs []Message, rows pgx.Rows, err error, lookup func([]string) (pgx.Rows, error)) ([]int64, error) {
	if err != nil {
		return nil, wrapEnqueueErr(err)
	}
	var ids []int64
	byKey := map[string]int64{}
	for rows.Next() {
		var id int64
		var dk *string
		if err := rows.Scan(&id, &dk); err != nil {
			rows.Close()
			return nil, wrapEnqueueErr(err)
		}
		if dk != nil {
			byKey[*dk] = id
		} else {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrapEnqueueErr(err)
	}
	return assignIDs(msgs, ids, byKey, func(missing []string) (map[string]int64, error) {
		rows, err := lookup(missing)
		if err != nil {
			return nil, wrapEnqueueErr(err)
		}
		found := map[string]int64{}
		for rows.Next() {
			var id int64
			var k string
			if err := rows.Scan(&id, &k); err != nil {
				rows.Close()
				return nil, wrapEnqueueErr(err)
			}
			found[k] = id
		}
		return found, rows.Err()
	})
}

// assignIDs puts the returned ids back in message order: rows without a dedup
// key come back in insertion order, rows with one are matched by key, and keys
// that were not inserted (duplicates) are looked up.
func assignIDs(msgs []Message, plain []int64, byKey map[string]int64, lookup func([]string) (map[string]int64, error)) ([]int64, error) {
	var missing []string
	for i := range msgs {
		if k := msgs[i].DedupKey; k != "" {
			if _, ok := byKey[k]; !ok {
				missing = append(missing, k)
				byKey[k] = 0
			}
		}
	}
	if len(missing) > 0 {
		found, err := lookup(missing)
		if err != nil {
			return nil, err
		}
		for k, id := range found {
			byKey[k] = id
		}
	}
	out := make([]int64, len(msgs))
	j := 0
	for i := range msgs {
		if k := msgs[i].DedupKey; k != "" {
			out[i] = byKey[k]
			continue
		}
		if j >= len(plain) {
			return nil, errors.New("wharf: enqueue returned fewer ids than messages")
		}
		out[i] = plain[j]
		j++
	}
	return out, nil
}

func wrapEnqueueErr(err error) error {
	if wharfmigrate.IsUndefinedTable(err) {
		return fmt.Errorf("wharf: enqueue: %w: %w", ErrNotMigrated, err)
	}
	return fmt.Errorf("wharf: enqueue: %w", err)
}
