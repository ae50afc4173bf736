package wharf

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// DeadLetter is a message that exhausted its attempts or failed permanently.
type DeadLetter struct {
	Message
	Attempts  int
	LastError string
	FailedAt  time.Time
}

// DeadLetterFilter selects dead letters. The zero value selects all.
type DeadLetterFilter struct {
	// IDs, when set, selects these message ids only.
	IDs []int64
	// Topic, when set, selects one topic.
	Topic string
	// Limit bounds DeadLetters' result (0 means 1000). Retry and purge ignore it.
	Limit int
}

func (f DeadLetterFilter) where() (string, []any) {
	var conds []string
	var args []any
	if len(f.IDs) > 0 {
		args = append(args, f.IDs)
		conds = append(conds, fmt.Sprintf("id = ANY($%d::bigint[])", len(args)))
	}
	if f.Topic != "" {
		args = append(args, f.Topic)
		conds = append(conds, fmt.Sprintf("topic = $%d", len(args)))
	}
	if len(conds) == 0 {
		return "TRUE", nil
	}
	return strings.Join(conds, " AND "), args
}

func (c *Client) requirePool() error {
	if c.pool == nil {
		return errors.New("wharf: this call needs a client created with a pool")
	}
	return nil
}

// DeadLetters lists dead letters in id order.
func (c *Client) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	if err := c.requirePool(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	where, args := f.where()
	rows, err := c.pool.Query(ctx, `SELECT id, topic, key, payload, headers, deliver_at, created_at, attempts, last_error, failed_at
FROM `+c.cfg.Schema+`.dead_letters WHERE `+where+` ORDER BY id LIMIT `+fmt.Sprint(limit), args...)
	if err != nil {
		return nil, storeErr("list dead letters", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var key pgtype.Text
		var headers []byte
		var deliverAt pgtype.Timestamptz
		err := row.Scan(&d.ID, &d.Topic, &key, &d.Payload, &headers, &deliverAt, &d.CreatedAt, &d.Attempts, &d.LastError, &d.FailedAt)
		d.Key = key.String
		if deliverAt.Valid {
			d.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			d.Headers = decodeHeaders(headers)
		}
		return d, err
	})
}

// RetryDeadLetters moves the selected dead letters back into the outbox with
// their original ids (so consumers deduplicate redeliveries) and a fresh
// attempt count. The relay picks them up as late commits and delivers each
// key's retried messages in id order. It returns how many were moved.
func (c *Client) RetryDeadLetters(ctx context.Context, f DeadLetterFilter) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	where, args := f.where()
	tag, err := c.pool.Exec(ctx, `WITH moved AS (
    DELETE FROM `+c.cfg.Schema+`.dead_letters WHERE `+where+`
    RETURNING id, topic, key, payload, headers, created_at)
INSERT INTO `+c.cfg.Schema+`.outbox (id, topic, key, payload, headers, created_at)
SELECT id, topic, key, payload, headers, created_at FROM moved ORDER BY id`, args...)
	if err != nil {
		return 0, storeErr("retry dead letters", err)
	}
	return int(tag.RowsAffected()), nil
}

// PurgeDeadLetters deletes the selected dead letters for good and returns how
// many were deleted.
func (c *Client) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	where, args := f.where()
	tag, err := c.pool.Exec(ctx, `DELETE FROM `+c.cfg.Schema+`.dead_letters WHERE `+where, args...)
	if err != nil {
		return 0, storeErr("purge dead letters", err)
	}
	return int(tag.RowsAffected()), nil
}

// LaneOwner is one lane's lease.
type LaneOwner struct {
	Lane       int
	Owner      string
	Fence      int64
	LeaseUntil time.Time
}

// Status is a snapshot of the outbox from statistics, the small lease tables
// and one index probe per lane; it never counts or scans the outbox. The
// oldest-message probe walks index entries of delivered rows that vacuum has
// not removed yet, which is slow (about 0.3 s per 300k such rows, see
// docs/plans.md) only while a long transaction holds vacuum back.
type Status struct {
	Schema string
	// BacklogEstimate is PostgreSQL's live-row estimate for the outbox
	// (pg_stat_user_tables.n_live_tup), which lags by up to a few seconds.
	BacklogEstimate int64
	// OldestAge is the age of the oldest undelivered message (0 when empty).
	OldestAge time.Duration
	// DeadTuples is the outbox's dead-row estimate: high values mean vacuum
	// cannot keep up (often a long-running transaction).
	DeadTuples  int64
	DeadLetters int64
	Retrying    int64
	Relays      []string
	Lanes       []LaneOwner
}

// Status reads the outbox's state (see [Status] for what it costs).
func (c *Client) Status(ctx context.Context) (*Status, error) {
	if err := c.requirePool(); err != nil {
		return nil, err
	}
	m, err := wharfmigrate.New(c.cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := m.Check(ctx, c.pool); err != nil {
		return nil, err
	}
	s := &Status{Schema: c.cfg.Schema}
	sc := c.cfg.Schema
	var oldest pgtype.Interval
	err = c.pool.QueryRow(ctx, `SELECT
    coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0),
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0),
    (SELECT now() - min(o.created_at) FROM `+sc+`.lanes l
        CROSS JOIN LATERAL (SELECT created_at FROM `+sc+`.outbox WHERE lane = l.lane ORDER BY id LIMIT 1) o),
    (SELECT count(*) FROM `+sc+`.dead_letters),
    (SELECT count(*) FROM `+sc+`.retries)`, sc).Scan(&s.BacklogEstimate, &s.DeadTuples, &oldest, &s.DeadLetters, &s.Retrying)
	if err != nil {
		return nil, storeErr("status", err)
	}
	if oldest.Valid {
		s.OldestAge = time.Duration(oldest.Microseconds)*time.Microsecond +
			time.Duration(oldest.Days)*24*time.Hour
	}
	rows, err := c.pool.Query(ctx, `SELECT relay_id FROM `+sc+`.relays WHERE heartbeat_at > now() - interval '1 minute' ORDER BY relay_id`)
	if err != nil {
		return nil, storeErr("status", err)
	}
	if s.Relays, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, storeErr("status", err)
	}
	rows, err = c.pool.Query(ctx, `SELECT lane, coalesce(owner, ''), fence, lease_until FROM `+sc+`.lanes ORDER BY lane`)
	if err != nil {
		return nil, storeErr("status", err)
	}
	s.Lanes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (LaneOwner, error) {
		var l LaneOwner
		var until pgtype.Timestamptz
		err := row.Scan(&l.Lane, &l.Owner, &l.Fence, &until)
		l.LeaseUntil = until.Time
		return l, err
	})
	if err != nil {
		return nil, storeErr("status", err)
	}
	return s, nil
}
