package wharf

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/internal/tablestore"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// PendingFilter selects messages still in the outbox (not yet delivered).
// Set fields combine with AND.
type PendingFilter struct {
	// IDs, when set, selects these message ids ([Message.ID]) only.
	IDs []string
	// Seqs, when set, selects these outbox positions ([Message.Seq]) only.
	// With IDs too, a message either names is selected.
	Seqs []int64
	// Topic, when set, selects one topic.
	Topic string
	// Key, when set, selects one key (found through its lane: no scan of
	// other lanes).
	Key string
	// All must be set for CancelMessages and RescheduleMessages to act on
	// every pending message when no other field is set: a filter left
	// empty by mistake must not empty the outbox.
	All bool
	// Limit bounds PendingMessages' result (0 means 100). Cancel and
	// reschedule ignore it.
	Limit int
}

// ErrNoSelection is returned by [Client.CancelMessages] and
// [Client.RescheduleMessages] for a [PendingFilter] that selects nothing in
// particular: set IDs, Seqs, Topic or Key, or All to mean every message.
var ErrNoSelection = errors.New("wharf: the filter selects no message in particular: set IDs, Seqs, Topic or Key, or All for every pending message")

func (f PendingFilter) selective() bool {
	return len(f.IDs) > 0 || len(f.Seqs) > 0 || f.Topic != "" || f.Key != ""
}

// where returns the condition on outbox rows (alias o) with its arguments
// numbered from $1. Each selector is written so that the (lane, id) index
// serves it: a seq is probed in every lane (a keyed message's lane is not
// known from its seq), a key in its own lane.
func (f PendingFilter) where() (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if len(f.IDs) > 0 || len(f.Seqs) > 0 {
		seqs := append([]int64(nil), f.Seqs...)
		var which []string
		if len(f.IDs) > 0 {
			// The nonce makes an id of another outbox (same seq, other
			// nonce) select nothing here. A plain filter, not a join: the
			// index probes below find the rows.
			pairs := make([]string, len(f.IDs))
			for i, id := range f.IDs {
				seq, nonce, err := ParseID(id)
				if err != nil {
					return "", nil, fmt.Errorf("wharf: PendingFilter.IDs: %w", err)
				}
				pairs[i] = fmt.Sprintf("%d:%d", seq, nonce)
				seqs = append(seqs, seq)
			}
			which = append(which, fmt.Sprintf("(o.id::text || ':' || o.nonce::text) = ANY(%s::text[])", arg(pairs)))
		}
		if len(f.Seqs) > 0 {
			which = append(which, fmt.Sprintf("o.id = ANY(%s::bigint[])", arg(f.Seqs)))
		}
		conds = append(conds, "("+strings.Join(which, " OR ")+")",
			fmt.Sprintf("o.lane = ANY(%s::smallint[]) AND o.id = ANY(%s::bigint[])", arg(allLanes()), arg(seqs)))
	}
	if f.Key != "" {
		k := arg(f.Key)
		conds = append(conds, fmt.Sprintf("o.lane = (hashtext(%s) & 63)::smallint AND o.key = %s", k, k))
	}
	if f.Topic != "" {
		conds = append(conds, "o.topic = "+arg(f.Topic))
	}
	if len(conds) == 0 {
		return "TRUE", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

func allLanes() []int16 {
	l := make([]int16, wharfmigrate.Lanes)
	for i := range l {
		l[i] = int16(i)
	}
	return l
}

// PendingMessage is a message still in the outbox, with its delivery state.
type PendingMessage struct {
	Message
	// Lane is the outbox lane holding the message: the relay that owns the
	// lane delivers it (see [Status.Lanes]).
	Lane int
	// Scheduled reports that DeliverAt is still in the future (by the
	// database's clock, which is the one the relay goes by).
	Scheduled bool
	// Attempts is how many deliveries of it failed so far; 0 when none did.
	Attempts int
	// LastError is the error of the last failed delivery ("" when none).
	LastError string
	// NextAttemptAt is when the relay tries it again after a failure (zero
	// when none failed).
	NextAttemptAt time.Time
	// HeldBehind, when not nil, is the earliest message of the same ordering
	// key (topic and key, or key alone with Config.OrderAcrossTopics) queued
	// before this one that is itself held — scheduled for later, or waiting
	// for a retry: this message is not delivered before that one is. It is
	// looked for among the first BlockedScanBound rows of the lane (those
	// before the message) and among the lane's retrying messages, so a
	// scheduled holder further into a lane than that is not reported.
	HeldBehind *Holder
}

// Holder is the held message that a [PendingMessage] waits behind.
type Holder struct {
	ID  string
	Seq int64
	// Reason is why the holder is not delivered yet.
	Reason BlockedReason
	// Until is the holder's DeliverAt (scheduled) or next attempt (retrying).
	Until time.Time
	// Attempts is how many deliveries of the holder failed so far.
	Attempts int
}

// Held reports that the message waits for an earlier held message of its key.
func (p PendingMessage) Held() bool { return p.HeldBehind != nil }

// PendingMessages lists messages still in the outbox, in Seq order, with
// their payload, headers, schedule and, for messages that failed, attempts
// and last error, and for a message held behind an earlier held message of
// its key, that message ([PendingMessage.HeldBehind]). Each lane is read in
// index order up to the limit and the lanes are merged, so the cost is
// bounded by 64 x Limit rows however large the backlog — except with Topic
// alone, where a lane is walked until Limit rows of that topic are found —
// plus, per keyed message returned, at most the first BlockedScanBound index
// entries of its lane and the lane's retrying messages.
func (c *Client) PendingMessages(ctx context.Context, f PendingFilter) ([]PendingMessage, error) {
	if err := c.requirePool(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	where, args, err := f.where()
	if err != nil {
		return nil, err
	}
	sc := c.cfg.Schema
	args = append(args, limit)
	lim := fmt.Sprintf("$%d", len(args))
	args = append(args, BlockedScanBound)
	bound := fmt.Sprintf("$%d", len(args))
	sameKey := "w.key = o.key AND w.topic = o.topic"
	if c.cfg.OrderAcrossTopics {
		sameKey = "w.key = o.key"
	}
	var out []PendingMessage
	err = c.adminTx(ctx, func(tx pgx.Tx) error {
		// Lanes 0-63: wharfmigrate.Lanes, fixed by migration 1. The holder
		// of a keyed message is looked for through the (lane, id) index:
		// the first BlockedScanBound rows of its lane before it, plus the lane's
		// retrying messages (the retries table holds one row per message
		// waiting for a retry, indexed by lane). A retry record is one
		// message's: it counts only for the message with its nonce (or
		// for the message at its seq, written before schema version 9).
		rows, err := tx.Query(ctx, `SELECT o.id, o.nonce, o.lane, o.topic, o.key, o.payload, o.headers, o.deliver_at, o.dedup_key, o.created_at,
    coalesce(o.deliver_at > now(), false), coalesce(r.attempts, 0), coalesce(r.last_error, ''), r.next_attempt_at,
    b.id, b.nonce, b.deliver_at, b.next_attempt_at, coalesce(b.attempts, 0)
FROM generate_series(0, 63) AS l(lane)
CROSS JOIN LATERAL (
    SELECT * FROM `+sc+`.outbox o WHERE o.lane = l.lane AND `+where+` ORDER BY o.id LIMIT `+lim+`) o
LEFT JOIN `+sc+`.retries r ON r.id = o.id AND (r.nonce = o.nonce OR r.nonce IS NULL)
LEFT JOIN LATERAL (
    SELECT h.id, h.nonce, h.deliver_at, hr.next_attempt_at, hr.attempts
    FROM (
        SELECT w.id, w.nonce, w.deliver_at FROM (
            SELECT w.id, w.nonce, w.deliver_at, w.topic, w.key FROM `+sc+`.outbox w
            WHERE w.lane = o.lane AND w.id < o.id ORDER BY w.id LIMIT `+bound+`) w
        WHERE `+sameKey+`
        UNION ALL
        SELECT w.id, w.nonce, w.deliver_at FROM `+sc+`.retries rr
        CROSS JOIN LATERAL (
            SELECT w.id, w.nonce, w.deliver_at, w.topic, w.key FROM `+sc+`.outbox w
            WHERE w.lane = rr.lane AND w.id = rr.id LIMIT 1) w
        WHERE rr.lane = o.lane AND rr.id < o.id AND (rr.nonce = w.nonce OR rr.nonce IS NULL) AND `+sameKey+`
    ) h
    LEFT JOIN `+sc+`.retries hr ON hr.id = h.id AND (hr.nonce = h.nonce OR hr.nonce IS NULL)
    WHERE h.deliver_at > now() OR hr.id IS NOT NULL
    ORDER BY h.id LIMIT 1
) b ON o.key IS NOT NULL
ORDER BY o.id LIMIT `+lim, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanPending)
		return err
	})
	if err != nil {
		return nil, store.Wrap("list pending messages", err)
	}
	return out, nil
}

func scanPending(row pgx.CollectableRow) (PendingMessage, error) {
	var p PendingMessage
	var key, dedup pgtype.Text
	var headers []byte
	var deliverAt, nextAt, holdDeliverAt, holdNextAt pgtype.Timestamptz
	var holdSeq, holdNonce pgtype.Int8
	var holdAttempts int
	var nonce int64
	var lane int16
	err := row.Scan(&p.Seq, &nonce, &lane, &p.Topic, &key, &p.Payload, &headers, &deliverAt, &dedup, &p.CreatedAt,
		&p.Scheduled, &p.Attempts, &p.LastError, &nextAt, &holdSeq, &holdNonce, &holdDeliverAt, &holdNextAt, &holdAttempts)
	if holdSeq.Valid {
		h := &Holder{ID: FormatID(holdSeq.Int64, holdNonce.Int64), Seq: holdSeq.Int64, Reason: BlockedScheduled, Attempts: holdAttempts}
		switch {
		case holdNextAt.Valid:
			h.Reason, h.Until = BlockedRetrying, holdNextAt.Time
		case holdDeliverAt.Valid:
			h.Until = holdDeliverAt.Time
		}
		p.HeldBehind = h
	}
	p.ID = FormatID(p.Seq, nonce)
	p.Lane = int(lane)
	p.Key = key.String
	p.DedupKey = dedup.String
	if deliverAt.Valid {
		p.DeliverAt = deliverAt.Time
	}
	if nextAt.Valid {
		p.NextAttemptAt = nextAt.Time
	}
	if len(headers) > 0 {
		p.Headers = tablestore.DecodeHeaders(headers)
	}
	return p, err
}

// adminTx runs f in a transaction with JIT off: the admin statements probe
// 64 lanes, which puts their estimated cost over jit_above_cost, and
// compiling them cost more than running them (a 100-row listing by topic on
// a 300k-row outbox: 100-120 ms per fresh session with JIT, 70-80 ms
// without). SET LOCAL keeps the setting inside the transaction, so this is
// safe behind PgBouncer's transaction pooling.
func (c *Client) adminTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL jit = off"); err != nil {
			return err
		}
		return f(tx)
	})
}

// CancelMessages deletes the selected messages from the outbox, with their
// retry state, and returns how many it deleted. A message that is held — it
// is scheduled for later, or waiting for a retry, or behind such a message of
// its key — is read again from the outbox before it is delivered, so once
// cancelled it is never delivered. A deletion wakes no relay: the messages
// of its key queued behind a cancelled held message go out when the relay
// reads it again at the time it would have been delivered (its DeliverAt or
// next retry) and finds it gone, or sooner if its lane changes hands. A
// message that is already due may be at the sink at this moment: it can
// still be delivered (once; its removal then finds nothing to remove).
// Cancelling is not undone by anything: the payload is gone.
func (c *Client) CancelMessages(ctx context.Context, f PendingFilter) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	if !f.selective() && !f.All {
		return 0, ErrNoSelection
	}
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	sc := c.cfg.Schema
	var n int
	err = c.pool.QueryRow(ctx, `WITH gone AS (
    DELETE FROM `+sc+`.outbox o WHERE `+where+` RETURNING o.id
), r AS (
    DELETE FROM `+sc+`.retries WHERE id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`, args...).Scan(&n)
	if err != nil {
		return 0, store.Wrap("cancel messages", err)
	}
	return n, nil
}

// RescheduleMessages sets the selected messages' DeliverAt to at (a zero at
// means now: the message is due at once) and returns how many it changed.
//
// It deletes each row and inserts it again in one statement, with the same
// seq, nonce (so the same [Message.ID]), topic, key, payload, headers,
// dedup key and creation time: the new row belongs to this transaction, so
// relays read it again as a late commit, and the copy they read replaces the
// one they hold. A held message (scheduled, or waiting for a retry) is read
// again before it is delivered, so it goes out at its new time; its key's
// later messages stay behind it. A message waiting for a retry keeps its
// attempt count; its next attempt moves to at. A message that is already
// due may be at the sink at this moment: it is delivered now, whatever the
// new time.
func (c *Client) RescheduleMessages(ctx context.Context, f PendingFilter, at time.Time) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	if !f.selective() && !f.All {
		return 0, ErrNoSelection
	}
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	var atArg *time.Time
	if !at.IsZero() {
		atArg = &at
	}
	args = append(args, atArg)
	p := fmt.Sprintf("$%d::timestamptz", len(args))
	sc := c.cfg.Schema
	var n int
	err = c.pool.QueryRow(ctx, `WITH moved AS (
    DELETE FROM `+sc+`.outbox o WHERE `+where+`
    RETURNING o.id, o.nonce, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.created_at
), r AS (
    UPDATE `+sc+`.retries x SET next_attempt_at = coalesce(`+p+`, now()), updated_at = now()
    FROM moved m WHERE x.id = m.id AND (x.nonce = m.nonce OR x.nonce IS NULL)
), ins AS (
    INSERT INTO `+sc+`.outbox (id, nonce, topic, key, payload, headers, deliver_at, dedup_key, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT id, nonce, topic, key, payload, headers, `+p+`, dedup_key, created_at FROM moved ORDER BY id
    RETURNING 1
)
SELECT count(*) FROM ins`, args...).Scan(&n)
	if err != nil {
		return 0, store.Wrap("reschedule messages", err)
	}
	return n, nil
}
