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

// DeadLetter is a message that exhausted its attempts or failed permanently.
type DeadLetter struct {
	Message
	Attempts  int
	LastError string
	FailedAt  time.Time
}

// DeadLetterFilter selects dead letters. The zero value selects all.
type DeadLetterFilter struct {
	// IDs, when set, selects these message ids ([Message.ID]) only.
	IDs []string
	// Seqs, when set, selects these outbox positions ([Message.Seq]) only.
	// With IDs too, a dead letter either names is selected.
	Seqs []int64
	// Topic, when set, selects one topic.
	Topic string
	// Key, when set, selects one key.
	Key string
	// Limit bounds DeadLetters' result (0 means 1000). Retry and purge ignore it.
	Limit int
}

func (f DeadLetterFilter) where() (string, []any, error) {
	var conds []string
	var args []any
	var which []string
	if len(f.IDs) > 0 {
		seqs := make([]int64, len(f.IDs))
		nonces := make([]int64, len(f.IDs))
		for i, id := range f.IDs {
			var err error
			if seqs[i], nonces[i], err = ParseID(id); err != nil {
				return "", nil, fmt.Errorf("wharf: DeadLetterFilter.IDs: %w", err)
			}
		}
		args = append(args, seqs, nonces)
		which = append(which, fmt.Sprintf("(id, nonce) IN (SELECT * FROM unnest($%d::bigint[], $%d::bigint[]))", len(args)-1, len(args)))
	}
	if len(f.Seqs) > 0 {
		args = append(args, f.Seqs)
		which = append(which, fmt.Sprintf("id = ANY($%d::bigint[])", len(args)))
	}
	if len(which) > 0 {
		conds = append(conds, "("+strings.Join(which, " OR ")+")")
	}
	if f.Topic != "" {
		args = append(args, f.Topic)
		conds = append(conds, fmt.Sprintf("topic = $%d", len(args)))
	}
	if f.Key != "" {
		args = append(args, f.Key)
		conds = append(conds, fmt.Sprintf("key = $%d", len(args)))
	}
	if len(conds) == 0 {
		return "TRUE", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

func (c *Client) requirePool() error {
	if c.pool == nil {
		return ErrNoPool
	}
	return nil
}

// DeadLetters lists dead letters in Seq order.
func (c *Client) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	if err := c.requirePool(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	where, args, err := f.where()
	if err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, `SELECT id, nonce, topic, key, payload, headers, deliver_at, dedup_key, created_at, attempts, last_error, failed_at
FROM `+c.cfg.Schema+`.dead_letters WHERE `+where+` ORDER BY id LIMIT `+fmt.Sprint(limit), args...)
	if err != nil {
		return nil, store.Wrap("list dead letters", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var key, dedup pgtype.Text
		var headers []byte
		var deliverAt pgtype.Timestamptz
		var nonce int64
		err := row.Scan(&d.Seq, &nonce, &d.Topic, &key, &d.Payload, &headers, &deliverAt, &dedup, &d.CreatedAt, &d.Attempts, &d.LastError, &d.FailedAt)
		d.ID = FormatID(d.Seq, nonce)
		d.Key = key.String
		d.DedupKey = dedup.String
		if deliverAt.Valid {
			d.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			d.Headers = tablestore.DecodeHeaders(headers)
		}
		return d, err
	})
}

// RetryDeadLetters moves the selected dead letters back into the outbox with
// their original ids (so consumers deduplicate redeliveries), dedup keys and
// a fresh attempt count, in one transaction with their removal. The relay
// picks them up as late commits and delivers each key's retried messages in
// Seq order. An outbox in WAL mode takes them as rows of its table too (the
// table its relay moves held messages to), which its relay reads as well. A dedup key that a message now in
// the outbox holds is dropped from the retried one (both are delivered). It
// returns how many were moved.
func (c *Client) RetryDeadLetters(ctx context.Context, f DeadLetterFilter) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	wal, err := c.isWAL(ctx, pgxQueryRow(c.pool))
	if err != nil {
		return 0, err
	}
	sc := c.cfg.Schema
	var n int64
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if wal {
			// An outbox in WAL mode keeps its table for messages its relay
			// moved there; the trigger that refuses producers' rows lets
			// these through. The relay finds them at its next lease round.
			if _, err := tx.Exec(ctx, `SET LOCAL wharf.spill = 'on'`); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, `WITH moved AS (
    DELETE FROM `+sc+`.dead_letters WHERE `+where+`
    RETURNING id, nonce, topic, key, payload, headers, deliver_at, dedup_key, created_at)
INSERT INTO `+sc+`.outbox (id, nonce, topic, key, payload, headers, deliver_at, dedup_key, created_at)
OVERRIDING SYSTEM VALUE
SELECT id, nonce, topic, key, payload, headers, deliver_at,
       CASE WHEN EXISTS (SELECT 1 FROM `+sc+`.outbox o WHERE o.dedup_key = moved.dedup_key) THEN NULL ELSE dedup_key END,
       created_at
FROM moved ORDER BY id`, args...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, store.Wrap("retry dead letters", err)
	}
	return int(n), nil
}

// PurgeDeadLetters deletes the selected dead letters for good and returns how
// many were deleted.
func (c *Client) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (int, error) {
	if err := c.requirePool(); err != nil {
		return 0, err
	}
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	tag, err := c.pool.Exec(ctx, `DELETE FROM `+c.cfg.Schema+`.dead_letters WHERE `+where, args...)
	if err != nil {
		return 0, store.Wrap("purge dead letters", err)
	}
	return int(tag.RowsAffected()), nil
}

// Count is a number of rows, counted or estimated.
type Count struct {
	N int64
	// Exact reports that the rows were counted. A table larger than
	// StatusExactPages pages is estimated instead, from a random sample of
	// about that many of its pages.
	Exact bool
}

// StatusExactPages is the size, in pages (8 KiB by default), up to which
// [Client.Status] counts a table's rows; a larger table is estimated from a
// random sample of about as many pages (TABLESAMPLE SYSTEM). Either way it
// reads at most about 16 MiB per table, however large the backlog.
//
// Why not PostgreSQL's statistics: a queue table's are wrong most of the
// time. n_live_tup lags commits by up to seconds (a few rows just enqueued
// read as an empty outbox) and is reset by a crash; reltuples/relpages is
// the density at the last vacuum, which for a queue table vacuumed while
// nearly empty is near zero while the backlog grows back into its free
// space.
const StatusExactPages = 2048

// StatusScanBound is how many rows per lane [Client.Status] reads past
// messages scheduled for later to find the lane's oldest due message.
const StatusScanBound = 2000

// RelayStatus is a relay registered in the outbox's relays table.
type RelayStatus struct {
	ID        string
	Host      string
	PID       int
	StartedAt time.Time
	// HeartbeatAge is how long ago the relay last renewed its registration
	// (database clock; relays renew every RebalanceInterval).
	HeartbeatAge time.Duration
	// Live reports a heartbeat younger than the lease TTL ([Status.LeaseTTL]).
	// A relay that crashed or was killed stays listed, not live, until a
	// live relay removes it three lease TTLs after its last heartbeat.
	Live bool
	// Lanes are the lanes this relay holds an unexpired lease on, in order.
	Lanes []int
	// LeaseLeft is how long the earliest of those leases lasts without a
	// renewal (0 with no lanes).
	LeaseLeft time.Duration
}

// LaneOwner is one lane's lease.
type LaneOwner struct {
	Lane int
	// Owner is the relay the lease names ("" for a free lane).
	Owner string
	// Fence grows with every change of owner.
	Fence      int64
	LeaseUntil time.Time
	// LeaseLeft is LeaseUntil minus the database's now: negative once the
	// lease expired (a crashed relay's lane, until another relay claims
	// it).
	LeaseLeft time.Duration
}

// Expired reports a lease that names an owner but has run out: nobody
// delivers the lane's messages until a live relay claims it.
func (l LaneOwner) Expired() bool { return l.Owner != "" && l.LeaseLeft <= 0 }

// Status is a snapshot of an outbox. Computing it reads a bounded amount
// whatever the backlog: counts read at most about StatusExactPages pages per
// table (see [Count]); the oldest due message is found with one index probe
// per lane, plus, for a lane whose first message is scheduled for later, a
// walk over at most StatusScanBound rows of that lane; relays and lanes are
// small tables. The probes also walk index entries of delivered rows that
// vacuum has not removed yet, which is slow only while a long transaction
// holds vacuum back.
type Status struct {
	Schema string
	// Messages counts every message in the outbox, due or scheduled.
	Messages Count
	// Scheduled counts the messages whose DeliverAt is still in the future
	// (database clock). The rest (Messages.N - Scheduled.N) are due, retrying,
	// or held behind a scheduled or retrying message of their key.
	Scheduled Count
	// OldestDueAge is how long the oldest message that should be on its way
	// has been due (since its DeliverAt, or its enqueue when it had none): a
	// message neither scheduled for later nor held behind a scheduled
	// message of its ordering key (by topic and key, or by key with
	// Config.OrderAcrossTopics). Messages waiting for a retry, or behind
	// one, count: they are late. 0 when there is none.
	OldestDueAge time.Duration
	// OldestDueUnknown lists the lanes whose first StatusScanBound messages
	// are all scheduled or held behind scheduled ones: their oldest due
	// message, if they have one, was not looked for, so OldestDueAge may be
	// too low.
	OldestDueUnknown []int
	// Retrying counts messages whose last delivery failed and that wait for
	// their next attempt.
	Retrying Count
	// DeadLetters counts the dead-letter table.
	DeadLetters Count
	// DeadTuples is the outbox's dead-row estimate (pg_stat_user_tables):
	// high values mean vacuum cannot keep up (often a long transaction).
	DeadTuples int64
	// Inserted and Deleted count the rows inserted into and deleted from
	// the outbox table since the server's statistics were reset
	// (pg_stat_user_tables; they lag commits by up to a second or so). Their
	// change between two Status calls gives the enqueue rate and the rate
	// messages leave the outbox (delivered, dead-lettered or cancelled; a
	// reschedule counts once in each). 0 in WAL mode.
	Inserted, Deleted int64
	// LeaseTTL is the relays' lease TTL as their leases show it (10s when no
	// lane is leased): a relay whose heartbeat is older is not live. Relays
	// extend a lease only once about a third of it has passed, so this
	// estimate lies between two thirds of the TTL and the TTL.
	LeaseTTL time.Duration
	// Relays are the registered relays, live or not, by id.
	Relays []RelayStatus
	// Lanes are the 64 lanes' leases.
	Lanes []LaneOwner
	// WAL is set for an outbox in WAL mode (wharfmigrate.SetWALMode), whose
	// messages are not rows: Messages and Scheduled count nothing there.
	WAL *WALStatus
}

// WALStatus is the replication slot a WAL outbox's relay streams.
type WALStatus struct {
	Slot string
	// Active is set while a relay streams the slot.
	Active bool
	// LagBytes is the WAL written since the slot's confirmed position: what
	// a relay that starts now reads again or for the first time (every
	// database's writes count, not only the outbox's messages).
	LagBytes int64
	// WALStatus is the server's word on the WAL the slot needs: reserved,
	// extended, unreserved (about to be removed under
	// max_slot_wal_keep_size) or lost (the slot is invalidated).
	WALStatus string
	// OldestUnsettled is, while a relay streams the slot, the age of the
	// oldest commit it holds unsettled, from what it recorded at its last
	// lease round (the database's clock); 0 when it holds none or no relay
	// streams. RecordedAgo is how long ago that was recorded.
	OldestUnsettled time.Duration
	RecordedAgo     time.Duration
}

// Due is how many messages are not scheduled for later.
func (s *Status) Due() int64 { return max(0, s.Messages.N-s.Scheduled.N) }

// UncoveredLanes lists the lanes no live lease covers (free, or expired):
// their messages wait until a live relay claims them.
func (s *Status) UncoveredLanes() []int {
	var out []int
	for _, l := range s.Lanes {
		if l.Owner == "" || l.Expired() {
			out = append(out, l.Lane)
		}
	}
	return out
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
	err = c.adminTx(ctx, func(tx pgx.Tx) error {
		if err := c.statusCounts(ctx, tx, s); err != nil {
			return err
		}
		if err := c.statusOldestDue(ctx, tx, s); err != nil {
			return err
		}
		if err := c.statusLeases(ctx, tx, s); err != nil {
			return err
		}
		return c.statusWAL(ctx, tx, s)
	})
	if err != nil {
		return nil, store.Wrap("status", err)
	}
	return s, nil
}

// statusCounts counts (or estimates, see Count) the outbox, its scheduled
// messages, the retries and the dead letters.
func (c *Client) statusCounts(ctx context.Context, tx pgx.Tx, s *Status) error {
	sc := c.cfg.Schema
	var outboxPages, retryPages, deadPages int64
	err := tx.QueryRow(ctx, `SELECT
    pg_relation_size($1::regclass) / current_setting('block_size')::bigint,
    pg_relation_size($2::regclass) / current_setting('block_size')::bigint,
    pg_relation_size($3::regclass) / current_setting('block_size')::bigint,
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
    coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
    coalesce((SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`,
		sc+".outbox", sc+".retries", sc+".dead_letters").Scan(&outboxPages, &retryPages, &deadPages, &s.DeadTuples, &s.Inserted, &s.Deleted)
	if err != nil {
		return err
	}
	count := func(table string, pages int64, outs ...*Count) error {
		sample, scale := "", 1.0
		if pages > StatusExactPages {
			pct := 100 * float64(StatusExactPages) / float64(pages)
			sample, scale = fmt.Sprintf(" TABLESAMPLE SYSTEM (%g)", pct), 100/pct
		}
		cols := "count(*)"
		if len(outs) > 1 {
			cols += ", count(*) FILTER (WHERE deliver_at > now())"
		}
		ns := make([]int64, len(outs))
		dest := make([]any, len(outs))
		for i := range ns {
			dest[i] = &ns[i]
		}
		if err := tx.QueryRow(ctx, `SELECT `+cols+` FROM `+sc+`.`+table+sample).Scan(dest...); err != nil {
			return err
		}
		for i, o := range outs {
			*o = Count{N: int64(float64(ns[i])*scale + 0.5), Exact: sample == ""}
		}
		return nil
	}
	if err := count("outbox", outboxPages, &s.Messages, &s.Scheduled); err != nil {
		return err
	}
	if err := count("retries", retryPages, &s.Retrying); err != nil {
		return err
	}
	return count("dead_letters", deadPages, &s.DeadLetters)
}

// statusOldestDue finds the oldest due message, aged from when it became
// due (its deliver_at, or its enqueue when it had none): the first message
// of each lane (one index probe), and for a lane whose first message has a
// deliver_at (scheduled, or due since its schedule passed), the first
// StatusScanBound rows of the lane, skipping scheduled messages and those
// behind a scheduled message of their ordering key.
func (c *Client) statusOldestDue(ctx context.Context, tx pgx.Tx, s *Status) error {
	sc := c.cfg.Schema
	// Lanes 0-63: wharfmigrate.Lanes, fixed by migration 1.
	rows, err := tx.Query(ctx, `SELECT l.lane, h.age, h.has_deliver_at
FROM generate_series(0, 63) AS l(lane)
CROSS JOIN LATERAL (
    SELECT extract(epoch FROM now() - o.created_at)::float8 AS age, o.deliver_at IS NOT NULL AS has_deliver_at
    FROM `+sc+`.outbox o WHERE o.lane = l.lane ORDER BY o.id LIMIT 1) h`)
	if err != nil {
		return err
	}
	var oldest float64
	var walk []int16
	var lane int16
	var age float64
	var hasDeliverAt bool
	_, err = pgx.ForEachRow(rows, []any{&lane, &age, &hasDeliverAt}, func() error {
		// A head with a deliver_at, scheduled or due by now, became due
		// later than it was enqueued, and later messages of the lane may
		// have been due for longer: walk the lane.
		if hasDeliverAt {
			walk = append(walk, lane)
		} else {
			oldest = max(oldest, age)
		}
		return nil
	})
	if err != nil || len(walk) == 0 {
		s.OldestDueAge = seconds(oldest)
		return err
	}
	scope := "w.topic, w.key"
	if c.cfg.OrderAcrossTopics {
		scope = "w.key"
	}
	rows, err = tx.Query(ctx, `SELECT b.lane, count(*) >= $2, max(b.age) FILTER (WHERE NOT b.scheduled AND NOT b.blocked)
FROM (
    SELECT w.lane, w.age, w.scheduled,
        w.key IS NOT NULL AND coalesce(bool_or(w.scheduled) OVER (PARTITION BY w.lane, `+scope+` ORDER BY w.id
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS blocked
    FROM unnest($1::smallint[]) AS l(lane)
    CROSS JOIN LATERAL (
        SELECT o.lane, o.id, o.topic, o.key, extract(epoch FROM now() - greatest(o.created_at, o.deliver_at))::float8 AS age,
            coalesce(o.deliver_at > now(), false) AS scheduled
        FROM `+sc+`.outbox o WHERE o.lane = l.lane ORDER BY o.id LIMIT $2) w
) b
GROUP BY b.lane ORDER BY b.lane`, walk, StatusScanBound)
	if err != nil {
		return err
	}
	var full bool
	var laneAge pgtype.Float8
	_, err = pgx.ForEachRow(rows, []any{&lane, &full, &laneAge}, func() error {
		switch {
		case laneAge.Valid:
			oldest = max(oldest, laneAge.Float64)
		case full:
			s.OldestDueUnknown = append(s.OldestDueUnknown, int(lane))
		}
		return nil
	})
	s.OldestDueAge = seconds(oldest)
	return err
}

// statusLeases reads the relays and the lanes' leases, with ages by the
// database's clock.
func (c *Client) statusLeases(ctx context.Context, tx pgx.Tx, s *Status) error {
	sc := c.cfg.Schema
	rows, err := tx.Query(ctx, `SELECT l.lane, coalesce(l.owner, ''), l.fence, r.lease_until,
    coalesce(extract(epoch FROM r.lease_until - now())::float8, 0),
    coalesce(extract(epoch FROM r.lease_until - r.heartbeat_at)::float8, 0)
FROM `+sc+`.lanes l LEFT JOIN `+sc+`.relays r ON r.relay_id = l.owner ORDER BY l.lane`)
	if err != nil {
		return err
	}
	var ttl float64
	s.Lanes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (LaneOwner, error) {
		var l LaneOwner
		var until pgtype.Timestamptz
		var left, leaseTTL float64
		err := row.Scan(&l.Lane, &l.Owner, &l.Fence, &until, &left, &leaseTTL)
		l.LeaseUntil = until.Time
		l.LeaseLeft = seconds(left)
		// A lane's lease is its owner's, extended by each heartbeat, so
		// lease_until - heartbeat_at is the relay's lease TTL.
		ttl = max(ttl, leaseTTL)
		return l, err
	})
	if err != nil {
		return err
	}
	s.LeaseTTL = seconds(ttl).Round(100 * time.Millisecond)
	if s.LeaseTTL <= 0 {
		s.LeaseTTL = 10 * time.Second
	}
	rows, err = tx.Query(ctx, `SELECT relay_id, host, pid, started_at, extract(epoch FROM now() - heartbeat_at)::float8
FROM `+sc+`.relays ORDER BY relay_id`)
	if err != nil {
		return err
	}
	s.Relays, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (RelayStatus, error) {
		var r RelayStatus
		var age float64
		err := row.Scan(&r.ID, &r.Host, &r.PID, &r.StartedAt, &age)
		r.HeartbeatAge = seconds(age)
		r.Live = r.HeartbeatAge < s.LeaseTTL
		return r, err
	})
	if err != nil {
		return err
	}
	byID := map[string]*RelayStatus{}
	for i := range s.Relays {
		byID[s.Relays[i].ID] = &s.Relays[i]
	}
	for _, l := range s.Lanes {
		r := byID[l.Owner]
		if r == nil || l.Expired() {
			continue
		}
		if len(r.Lanes) == 0 || l.LeaseLeft < r.LeaseLeft {
			r.LeaseLeft = l.LeaseLeft
		}
		r.Lanes = append(r.Lanes, l.Lane)
	}
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// statusWAL reads the slot of an outbox in WAL mode.
func (c *Client) statusWAL(ctx context.Context, tx pgx.Tx, s *Status) error {
	if wal, err := c.isWAL(ctx, pgxQueryRow(tx)); err != nil || !wal {
		return err
	}
	w := &WALStatus{Slot: c.cfg.Schema}
	err := tx.QueryRow(ctx, `SELECT active, coalesce(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn), 0)::bigint, coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1`, w.Slot).Scan(&w.Active, &w.LagBytes, &w.WALStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		w.WALStatus = "missing"
		err = nil
	}
	if err != nil {
		return err
	}
	s.WAL = w
	var progress bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.cfg.Schema+".wal_progress").Scan(&progress); err != nil || !progress {
		return err // no table: switched by an earlier build (`wharf migrate up --mode wal` adds it)
	}
	var oldest, ago pgtype.Float8
	if err := tx.QueryRow(ctx, `SELECT extract(epoch FROM now() - oldest_unsettled)::float8, extract(epoch FROM now() - recorded_at)::float8
FROM `+c.cfg.Schema+`.wal_progress`).Scan(&oldest, &ago); err != nil {
		return err
	}
	if w.Active && oldest.Valid {
		w.OldestUnsettled = time.Duration(max(0, oldest.Float64) * float64(time.Second))
	}
	if ago.Valid {
		w.RecordedAgo = time.Duration(max(0, ago.Float64) * float64(time.Second))
	}
	return nil
}
