package wharf

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wharfhq/wharf/internal/store"
)

// BlockedScanBound is how many rows per lane [Client.BlockedKeys] reads to
// find keys whose first message is scheduled for later, and how many rows
// after a blocked key's first message it reads to count the messages
// waiting behind it.
const BlockedScanBound = 2000

// BlockedReason says why a key's first message is not being delivered.
type BlockedReason string

const (
	// BlockedScheduled: the key's first message has a DeliverAt still in
	// the future.
	BlockedScheduled BlockedReason = "scheduled"
	// BlockedRetrying: the key's first message failed and waits for its
	// next attempt.
	BlockedRetrying BlockedReason = "retrying"
)

// BlockedKey is an ordering key (topic and key, or key alone with
// Config.OrderAcrossTopics) whose first pending message is held, holding
// every later message of the key behind it.
type BlockedKey struct {
	// Topic is the first message's topic.
	Topic string
	Key   string
	// Lane is the lane holding the key's messages.
	Lane   int
	Reason BlockedReason
	// HeadID and HeadSeq name the key's first message.
	HeadID  string
	HeadSeq int64
	// CreatedAt is when the first message was enqueued.
	CreatedAt time.Time
	// DeliverAt is the first message's schedule (zero when it has none).
	DeliverAt time.Time
	// Attempts, NextAttemptAt and LastError describe the first message's
	// failed deliveries (zero for a scheduled message that never failed).
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
	// Waiting is how many later messages of the key wait behind the first
	// one, among the BlockedScanBound rows of the lane that follow it.
	Waiting int
	// WaitingAtLeast reports that the count stopped at that bound: more
	// messages of the key may wait further on.
	WaitingAtLeast bool
}

// Blocked is the result of [Client.BlockedKeys].
type Blocked struct {
	// Keys are the blocked keys, oldest first message first.
	Keys []BlockedKey
	// More reports that more keys are blocked than the limit returned.
	More bool
	// UnscannedLanes lists the lanes with more than BlockedScanBound
	// messages: a key whose first message is scheduled and lies past the
	// first BlockedScanBound rows of such a lane is not listed. Keys whose
	// first message is retrying are always listed.
	UnscannedLanes []int
}

// BlockedKeys lists the keys whose first pending message is held, and why:
// it is scheduled for later, or it failed and waits for a retry (with its
// attempts, next attempt time and last error), with how many messages wait
// behind it. limit bounds the keys returned (0 means 100).
//
// Its cost is bounded whatever the backlog: one index range scan of at most
// BlockedScanBound rows per lane (64 lanes), one read of the retries table
// (one row per message waiting for a retry), and, for each key returned,
// one range scan of at most BlockedScanBound rows of its lane to count the
// messages behind it: at most 64 x BlockedScanBound + limit x
// BlockedScanBound index entries (about 330k with the default limit),
// however large the backlog.
func (c *Client) BlockedKeys(ctx context.Context, limit int) (*Blocked, error) {
	if err := c.requirePool(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	sc := c.cfg.Schema
	scope, wscope := "c.topic, c.key", "w.key = h.key AND w.topic = h.topic"
	winScope := "topic, key"
	if c.cfg.OrderAcrossTopics {
		scope, wscope, winScope = "c.key", "w.key = h.key", "key"
	}
	out := &Blocked{}
	err := c.adminTx(ctx, func(tx pgx.Tx) error {
		// Lanes 0-63: wharfmigrate.Lanes, fixed by migration 1.
		rows, err := tx.Query(ctx, `WITH win AS MATERIALIZED (
    SELECT w.lane, w.id, w.topic, w.key, w.deliver_at
    FROM generate_series(0, 63) AS l(lane)
    CROSS JOIN LATERAL (
        SELECT o.lane, o.id, o.topic, o.key, o.deliver_at FROM `+sc+`.outbox o
        WHERE o.lane = l.lane ORDER BY o.id LIMIT $1) w
), heads AS (
    SELECT DISTINCT ON (lane, `+winScope+`) lane, id, deliver_at FROM win
    WHERE key IS NOT NULL ORDER BY lane, `+winScope+`, id
), cand AS (
    SELECT lane, id, NULL::bigint AS nonce FROM heads WHERE deliver_at > now()
    UNION
    SELECT lane, id, nonce FROM `+sc+`.retries
), blocked AS (
    SELECT DISTINCT ON (c.lane, `+scope+`) c.*
    FROM (SELECT o.lane, o.id, o.nonce, o.topic, o.key, o.deliver_at, o.created_at
          FROM cand CROSS JOIN LATERAL (
              SELECT * FROM `+sc+`.outbox o WHERE o.lane = cand.lane AND o.id = cand.id LIMIT 1) o
          -- A retry record is one message's (its nonce; none: written
          -- before schema version 9, the message at its seq's).
          WHERE o.key IS NOT NULL AND (cand.nonce IS NULL OR cand.nonce = o.nonce)) c
    ORDER BY c.lane, `+scope+`, c.id
), top AS (
    SELECT * FROM blocked ORDER BY id LIMIT $2
)
SELECT h.lane, h.id, h.nonce, h.topic, h.key, h.deliver_at, h.created_at,
    coalesce(r.attempts, 0), r.next_attempt_at, coalesce(r.last_error, ''),
    n.waiting, n.scanned >= $1,
    (SELECT count(*) FROM blocked) > $3,
    ARRAY(SELECT lane FROM win GROUP BY lane HAVING count(*) >= $1 ORDER BY lane)
FROM top h
LEFT JOIN `+sc+`.retries r ON r.id = h.id AND (r.nonce = h.nonce OR r.nonce IS NULL)
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE `+wscope+`) AS waiting, count(*) AS scanned
    FROM (SELECT w.topic, w.key FROM `+sc+`.outbox w WHERE w.lane = h.lane AND w.id > h.id ORDER BY w.id LIMIT $1) w
) n
ORDER BY h.id`, BlockedScanBound, limit, limit)
		if err != nil {
			return err
		}
		var lane int16
		var nonce int64
		var deliverAt, nextAt pgtype.Timestamptz
		var more bool
		var unscanned []int16
		var b BlockedKey
		_, err = pgx.ForEachRow(rows, []any{&lane, &b.HeadSeq, &nonce, &b.Topic, &b.Key, &deliverAt, &b.CreatedAt,
			&b.Attempts, &nextAt, &b.LastError, &b.Waiting, &b.WaitingAtLeast, &more, &unscanned}, func() error {
			k := b
			k.Lane = int(lane)
			k.HeadID = FormatID(b.HeadSeq, nonce)
			k.Reason = BlockedScheduled
			if nextAt.Valid {
				k.Reason = BlockedRetrying
				k.NextAttemptAt = nextAt.Time
			}
			if deliverAt.Valid {
				k.DeliverAt = deliverAt.Time
			}
			out.Keys = append(out.Keys, k)
			out.More = more
			out.UnscannedLanes = out.UnscannedLanes[:0]
			for _, l := range unscanned {
				out.UnscannedLanes = append(out.UnscannedLanes, int(l))
			}
			return nil
		})
		if err != nil || len(out.Keys) > 0 {
			return err
		}
		// No blocked key: the lanes past the bound are still worth saying.
		var lanes []int16
		if err := tx.QueryRow(ctx, `SELECT ARRAY(SELECT l.lane FROM generate_series(0, 63) AS l(lane)
WHERE (SELECT count(*) FROM (SELECT 1 FROM `+sc+`.outbox o WHERE o.lane = l.lane ORDER BY o.id LIMIT $1) x) >= $1 ORDER BY l.lane)`,
			BlockedScanBound).Scan(&lanes); err != nil {
			return err
		}
		for _, l := range lanes {
			out.UnscannedLanes = append(out.UnscannedLanes, int(l))
		}
		return nil
	})
	if err != nil {
		return nil, store.Wrap("blocked keys", err)
	}
	return out, nil
}

// String describes the key's state in one line.
func (b BlockedKey) String() string {
	switch b.Reason {
	case BlockedRetrying:
		return fmt.Sprintf("%s/%s: retrying after %d attempts (next at %s): %s; %d waiting", b.Topic, b.Key, b.Attempts,
			b.NextAttemptAt.Format(time.RFC3339), b.LastError, b.Waiting)
	default:
		return fmt.Sprintf("%s/%s: scheduled for %s; %d waiting", b.Topic, b.Key, b.DeliverAt.Format(time.RFC3339), b.Waiting)
	}
}
