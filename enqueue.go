package wharf

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// ErrNotMigrated is returned when the outbox schema does not exist or is older
// than this version of Wharf expects. The message tells the operator to run
// `wharf migrate up`.
var ErrNotMigrated = wharfmigrate.ErrNotMigrated

// Client enqueues messages and runs the relay.
type Client struct {
	cfg   Config
	pool  *pgxpool.Pool
	q     enqueueQueries
	stats *Stats

	mode atomic.Int32 // the outbox's mode, once known (walenqueue.go)

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
	return &Client{cfg: c, pool: pool, q: newEnqueueQueries(c.Schema), stats: newStats(), stopped: make(chan struct{})}, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

// validateMessages refuses what PostgreSQL would refuse with a less helpful
// error, naming the message and the field.
func validateMessages(msgs []Message) error {
	for i := range msgs {
		m := &msgs[i]
		if m.Topic == "" {
			return errInvalidMessage("wharf: message %d: Topic is required", i)
		}
		for _, f := range [...]struct{ name, v string }{{"Topic", m.Topic}, {"Key", m.Key}, {"DedupKey", m.DedupKey}} {
			if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
				return errInvalidMessage("wharf: message %d: %s must be valid UTF-8 without NUL bytes (PostgreSQL text cannot hold them)", i, f.name)
			}
		}
		for k, v := range m.Headers {
			if !utf8.ValidString(k) || !utf8.ValidString(v) || strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
				return errInvalidMessage("wharf: message %d: header %q must be valid UTF-8 without NUL bytes (encode binary values, e.g. base64)", i, k)
			}
		}
	}
	return nil
}

// EnqueueTx inserts msgs inside tx, in one round trip, and returns their ids
// ([Message.ID]) in order. A message whose DedupKey matches one still in the
// outbox is not inserted again; its id is the existing message's id.
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := validateMessages(msgs); err != nil {
		return nil, err
	}
	if c.cfg.Tracer != nil {
		msgs = c.traceEnqueue(ctx, msgs)
	}
	if wal, err := c.isWAL(ctx, pgxQueryRow(tx)); err != nil {
		return nil, err
	} else if wal {
		return c.enqueueWAL(ctx, pgxQueryRow(tx), msgs)
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
	q := c.q.enqueueArrays
	if hasDedup {
		q = c.q.enqueueArraysDedup
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		c.modeChanged(err)
		return nil, wrapEnqueueErr(err)
	}
	inserted, err := scanEnqueued(rows, hasDedup)
	if err != nil {
		return nil, err
	}
	return assignIDs(msgs, inserted, func(missing []string) (pgx.Rows, error) {
		return tx.Query(ctx, c.q.dedupLookup, missing)
	})
}

// EnqueueSQLTx is EnqueueTx for a database/sql transaction (any PostgreSQL
// driver: the batch travels as one JSON parameter).
func (c *Client) EnqueueSQLTx(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := validateMessages(msgs); err != nil {
		return nil, err
	}
	if c.cfg.Tracer != nil {
		msgs = c.traceEnqueue(ctx, msgs)
	}
	if wal, err := c.isWAL(ctx, sqlQueryRow(tx)); err != nil {
		return nil, err
	} else if wal {
		return c.enqueueWAL(ctx, sqlQueryRow(tx), msgs)
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
		c.modeChanged(err)
		return nil, wrapEnqueueErr(err)
	}
	inserted, err := scanEnqueued(sqlRows{rows}, hasDedup)
	if err != nil {
		return nil, err
	}
	return assignIDs(msgs, inserted, func(missing []string) (rowScanner, error) {
		keys, _ := json.Marshal(missing)
		rows, err := tx.QueryContext(ctx, c.q.dedupLookupJSON, string(keys))
		if err != nil {
			return nil, err
		}
		return sqlRows{rows}, nil
	})
}

// Enqueue inserts msgs in a transaction of its own. Prefer EnqueueTx, which
// commits the messages atomically with the caller's business data.
func (c *Client) Enqueue(ctx context.Context, msgs ...Message) ([]string, error) {
	if c.pool == nil {
		return nil, ErrNoPool
	}
	var ids []string
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = c.EnqueueTx(ctx, tx, msgs...)
		return err
	})
	return ids, err
}

// rowScanner is what pgx.Rows and *sql.Rows have in common.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// enqueued is what the insert returned: ids of rows without a dedup key in
// insertion order, and rows with one by key.
type enqueued struct {
	plain []string
	byKey map[string]string
}

func scanEnqueued[R rowScanner](rows R, hasDedup bool) (enqueued, error) {
	defer rows.Close()
	out := enqueued{byKey: map[string]string{}}
	for rows.Next() {
		var seq, nonce int64
		var dk *string
		var err error
		if hasDedup {
			err = rows.Scan(&seq, &nonce, &dk)
		} else {
			err = rows.Scan(&seq, &nonce)
		}
		if err != nil {
			return out, wrapEnqueueErr(err)
		}
		if dk != nil {
			out.byKey[*dk] = FormatID(seq, nonce)
		} else {
			out.plain = append(out.plain, FormatID(seq, nonce))
		}
	}
	if err := rows.Err(); err != nil {
		return out, wrapEnqueueErr(err)
	}
	return out, nil
}

// assignIDs puts the returned ids back in message order: rows without a dedup
// key come back in insertion order, rows with one are matched by key, and keys
// that were not inserted (duplicates) are looked up in one query.
func assignIDs[R rowScanner](msgs []Message, got enqueued, lookup func([]string) (R, error)) ([]string, error) {
	var missing []string
	for i := range msgs {
		if k := msgs[i].DedupKey; k != "" {
			if _, ok := got.byKey[k]; !ok {
				missing = append(missing, k)
				got.byKey[k] = ""
			}
		}
	}
	if len(missing) > 0 {
		rows, err := lookup(missing)
		if err != nil {
			return nil, wrapEnqueueErr(err)
		}
		found, err := scanEnqueued(rows, true)
		if err != nil {
			return nil, err
		}
		for k, id := range found.byKey {
			got.byKey[k] = id
		}
		for _, k := range missing {
			if got.byKey[k] == "" {
				// The conflicting message was delivered and removed between
				// the insert and the lookup: nothing was enqueued for it.
				return nil, fmt.Errorf("wharf: enqueue: the message with DedupKey %q was delivered while this one was being enqueued; retry the transaction to enqueue it: %w", k, ErrDedupRace)
			}
		}
	}
	out := make([]string, len(msgs))
	j := 0
	for i := range msgs {
		if k := msgs[i].DedupKey; k != "" {
			out[i] = got.byKey[k]
			continue
		}
		if j >= len(got.plain) {
			return nil, errors.New("wharf: enqueue returned fewer ids than messages")
		}
		out[i] = got.plain[j]
		j++
	}
	return out, nil
}

// ErrDedupRace is returned (wrapped) by EnqueueTx when a message's DedupKey
// matched a message that was delivered and removed while the enqueue ran.
// The transaction is still usable but the message was not enqueued: retrying
// the transaction enqueues it.
var ErrDedupRace = errors.New("wharf: dedup key conflict with a message delivered meanwhile")

func wrapEnqueueErr(err error) error {
	if store.IsUndefined(err) {
		return fmt.Errorf("wharf: enqueue: %w: %w", ErrNotMigrated, err)
	}
	return fmt.Errorf("wharf: enqueue: %w", err)
}

// enqueueQueries holds the producers' SQL statements on the table outbox,
// with the schema filled in once.
type enqueueQueries struct {
	enqueueArrays      string
	enqueueArraysDedup string
	enqueueJSON        string
	enqueueJSONDedup   string
	dedupLookup        string
	dedupLookupJSON    string
}

func newEnqueueQueries(schema string) enqueueQueries {
	r := strings.NewReplacer("S.", schema+".")
	q := func(s string) string { return r.Replace(s) }

	const insertCols = `INSERT INTO S.outbox (topic, key, payload, headers, deliver_at, dedup_key) `
	const onConflict = ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`
	arrays := insertCols + `SELECT t, k, p, h::jsonb, d, u FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[]) AS m(t, k, p, h, d, u)`
	// database/sql drivers disagree on array parameters, so that path sends
	// the batch as one JSON document instead.
	jsonSrc := insertCols + `SELECT e->>'topic', e->>'key', decode(e->>'payload', 'base64'), e->'headers', (e->>'deliver_at')::timestamptz, e->>'dedup_key'
FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS m(e, n) ORDER BY n`

	return enqueueQueries{
		enqueueArrays:      q(arrays + ` RETURNING id, nonce`),
		enqueueArraysDedup: q(arrays + onConflict + ` RETURNING id, nonce, dedup_key`),
		enqueueJSON:        q(jsonSrc + ` RETURNING id, nonce`),
		enqueueJSONDedup:   q(jsonSrc + onConflict + ` RETURNING id, nonce, dedup_key`),
		dedupLookup:        q(`SELECT id, nonce, dedup_key FROM S.outbox WHERE dedup_key = ANY($1::text[])`),
		dedupLookupJSON:    q(`SELECT id, nonce, dedup_key FROM S.outbox WHERE dedup_key IN (SELECT jsonb_array_elements_text($1::jsonb))`),
	}
}
