package tablestore

import "strings"

// queries holds the relay's SQL statements on the table outbox, with the schema filled
// in once. The hot-path statements (fetch, load, ack) and their plans are
// described in docs/architecture.md (their plans: TestExplainHotPath).
type queries struct {
	fetch  string
	load   string
	refill string
	ack    string
	retry  string
	// retryHeld is retry for messages that are not rows of the outbox
	// table (the WAL outbox's held messages): it cannot check them there.
	retryHeld string
	dead      string

	register       string
	heartbeat      string
	renew          string
	claimLock      string
	claimTake      string
	claimAloneTake string
	release        string
	releaseAll     string
	unregister     string
	loadRetries    string
	laneOwners     string
}

// Fenced locks the caller's lanes whose fence still matches, FOR SHARE, so
// a takeover (UPDATE of the lane row) cannot commit between the check and
// the write: a relay that lost a lane writes nothing for it. Every
// statement that locks several lane rows locks them in lane order (the
// sort runs below the row locking): the lease loop renews the same rows
// while the completer writes, and two orders would deadlock. $1 are the
// lanes, $2 their fences, $3 the relay id.
const Fenced = `f AS (
    SELECT l.lane FROM S.lanes l
    JOIN unnest($1::smallint[], $2::bigint[]) AS mine(lane, fence) ON mine.lane = l.lane AND mine.fence = l.fence
    WHERE l.owner = $3
    ORDER BY l.lane
    FOR SHARE OF l)`

func newQueries(schema string) queries {
	r := strings.NewReplacer("S.", schema+".")
	q := func(s string) string { return r.Replace(s) }

	const cols = `o.lane, o.id, o.nonce, o.topic, o.key, o.payload, o.headers, o.deliver_at, o.created_at, o.ctid`

	return queries{
		// One statement, one snapshot: forward rows above each lane's cursor
		// (at most lim), plus rows below the cursor that were invisible to the
		// previous read (their transaction started after it, or was in
		// progress then and has finished now), plus the snapshot itself and
		// the database clock for the next read. Every part is an index range
		// scan bounded by the batch or by the rows written since the last
		// read, never by the backlog. OFFSET 0 keeps the late-commit parts
		// per lane: without it, on a table not yet analyzed (the default
		// estimate for xid >= $4 is a third of the table), the planner
		// flattened the second part into a sequential scan of the whole
		// outbox hashed against the lanes, on every fetch. The late-commit
		// parts give outbox_lane_id nothing it can use: they say
		// lane::integer, which only outbox_lane_xid is keyed by (schema
		// version 5), and part 2 checks the cursor on what the index found
		// (outside OFFSET 0). Part 3 keeps id <= cursor in the index, so a
		// large finished transaction is not read past the cursor; with
		// xid = x and lane::integer beside it, outbox_lane_xid wins even
		// when every estimate is one row (the plan tests check both). With
		// lane or id <= cursor within reach of outbox_lane_id, the planner read
		// these parts through it whenever a queue table's statistics
		// (ANALYZE saw it nearly empty or empty: every estimate one row)
		// made the two look alike, scanning each lane below its cursor over
		// every delivered row vacuum had not removed yet: 3-25 ms per
		// fetch, and the relay fell behind producers for good.
		fetch: q(`WITH l AS (
    SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::int[]) AS l(lane, cur, lim)
), s AS MATERIALIZED (
    SELECT pg_current_snapshot() AS snap, clock_timestamp() AS now
), fin AS MATERIALIZED (
    -- One row per transaction that was in progress at the previous read and
    -- has finished since. Rows, not an array: an array here is flattened
    -- into a hash join over the whole outbox (TestExplainHotPath).
    SELECT x FROM unnest($5::text[]::xid8[]) AS x, s WHERE pg_visible_in_snapshot(x, s.snap)
)
SELECT ` + cols + `, NULL::text AS snap, NULL::timestamptz AS now
FROM l CROSS JOIN LATERAL (
    SELECT o.*, o.ctid FROM S.outbox o WHERE o.lane = l.lane AND o.id > l.cur ORDER BY o.id LIMIT l.lim) o
UNION ALL
SELECT ` + cols + `, NULL, NULL
FROM l CROSS JOIN LATERAL (
    SELECT o.*, o.ctid FROM S.outbox o WHERE o.lane::integer = l.lane::integer AND o.xid >= $4::text::xid8 AND l.cur > 0 OFFSET 0) o
WHERE o.id <= l.cur
UNION ALL
SELECT ` + cols + `, NULL, NULL
FROM l CROSS JOIN fin CROSS JOIN LATERAL (
    SELECT o.*, o.ctid FROM S.outbox o WHERE o.lane::integer = l.lane::integer AND o.xid = fin.x AND o.id <= l.cur OFFSET 0) o
UNION ALL
SELECT -1, 0, 0, '', NULL, NULL, NULL, NULL, NULL, NULL, s.snap::text, s.now FROM s`),

		// Messages the relay keeps only as positions (held keys, scheduled
		// and retrying messages) are read again by exact (lane, id) probes
		// when they are due: one index probe each.
		load: q(`SELECT ` + cols + `
FROM unnest($1::smallint[], $2::bigint[]) AS r(lane, id)
CROSS JOIN LATERAL (SELECT o.*, o.ctid FROM S.outbox o WHERE o.lane = r.lane AND o.id = r.id LIMIT 1) o`),

		// Rows of keys with more held messages than the relay records one by
		// one (see relay_keys.go): rare, one range scan of the key's lane per
		// key.
		refill: q(`SELECT ` + cols + `
FROM unnest($1::smallint[], $2::text[], $3::bigint[], $4::bigint[], $6::text[]) AS r(lane, key, from_id, to_id, topic)
CROSS JOIN LATERAL (
    SELECT o.*, o.ctid FROM S.outbox o WHERE o.lane = r.lane AND o.id >= r.from_id AND o.id <= r.to_id AND o.key = r.key
        AND (r.topic IS NULL OR o.topic = r.topic)
    ORDER BY o.id LIMIT $5) o`),

		// Each acknowledged row is found where the fetch read it: a TID scan
		// of the ctid it had then ($7), checked against its id and nonce
		// (a database put back in time hands out the same ids again: a
		// late result of the old history must not remove a new row). A row that
		// moved since (VACUUM FULL, pg_repack) or that was read without one
		// (NULL) falls back to a probe of outbox_lane_id: UNION ALL under
		// LIMIT 1 runs the second branch only when the first found nothing.
		// The TID scan skips the index descent: the statement's time fell
		// 24 % at 100k msg/s (docs/architecture.md). Each row is
		// its own LATERAL ... LIMIT 1, and the rows go by ctid: the planner
		// has no join order to choose, so wrong statistics (a queue table
		// vacuumed while nearly empty) cannot turn the removal into a scan of
		// whole lanes. A message that failed before leaves a retry record
		// (ClearRetry, $6 and $9): the record goes with it, if it is this
		// message's (its nonce, or none: written before schema version 9),
		// never the record of another message with the same seq.
		ack: q(`WITH ` + Fenced + `, hit AS (
    SELECT x.ctid FROM unnest($4::smallint[], $5::bigint[], $7::tid[], $8::bigint[]) AS d(lane, id, at, nonce)
    CROSS JOIN LATERAL (
        SELECT o.ctid FROM S.outbox o WHERE o.ctid = d.at AND o.id = d.id AND o.nonce = d.nonce
        UNION ALL
        SELECT o.ctid FROM S.outbox o WHERE o.lane = d.lane AND o.id = d.id AND o.nonce = d.nonce
        LIMIT 1) x
    WHERE d.lane IN (SELECT lane FROM f)
), del AS (
    DELETE FROM S.outbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM hit))
    RETURNING id
), r AS (
    DELETE FROM S.retries x WHERE x.id = ANY($6::bigint[]) AND x.lane IN (SELECT lane FROM f)
        AND (x.nonce IS NULL OR (x.id, x.nonce) IN (SELECT * FROM unnest($6::bigint[], $9::bigint[])))
)
SELECT lane FROM f`),

		// A retry record is its message's: it carries the nonce, and the
		// message's next failure replaces it, as does a failure of another
		// message that took its seq (the engine applies a loaded record only
		// to the message with its nonce). A failure is recorded only while
		// its message (seq and nonce) is in the outbox: a late one of the
		// old history, after a restore, must not replace the record of the
		// new message that took its seq.
		retry: q(`WITH ` + Fenced + `, up AS (
INSERT INTO S.retries AS r (id, lane, nonce, attempts, next_attempt_at, last_error)
SELECT d.id, d.lane, d.nonce, d.attempts, d.next_at, d.err
FROM unnest($4::smallint[], $5::bigint[], $6::int[], $7::timestamptz[], $8::text[], $9::bigint[]) AS d(lane, id, attempts, next_at, err, nonce)
WHERE d.lane IN (SELECT lane FROM f)
    AND EXISTS (SELECT 1 FROM S.outbox o WHERE o.lane = d.lane AND o.id = d.id AND o.nonce = d.nonce)
ON CONFLICT (id) DO UPDATE SET nonce = excluded.nonce, attempts = excluded.attempts, next_attempt_at = excluded.next_attempt_at,
    last_error = excluded.last_error, updated_at = now()
)
SELECT lane FROM f`),
		retryHeld: q(`WITH ` + Fenced + `, up AS (
INSERT INTO S.retries AS r (id, lane, nonce, attempts, next_attempt_at, last_error)
SELECT d.id, d.lane, d.nonce, d.attempts, d.next_at, d.err
FROM unnest($4::smallint[], $5::bigint[], $6::int[], $7::timestamptz[], $8::text[], $9::bigint[]) AS d(lane, id, attempts, next_at, err, nonce)
WHERE d.lane IN (SELECT lane FROM f)
ON CONFLICT (id) DO UPDATE SET nonce = excluded.nonce, attempts = excluded.attempts, next_attempt_at = excluded.next_attempt_at,
    last_error = excluded.last_error, updated_at = now()
)
SELECT lane FROM f`),

		dead: q(`WITH ` + Fenced + `, hit AS (
    SELECT x.ctid, d.attempts, d.err FROM unnest($4::smallint[], $5::bigint[], $6::int[], $7::text[], $8::bigint[]) AS d(lane, id, attempts, err, nonce)
    CROSS JOIN LATERAL (SELECT o.ctid FROM S.outbox o WHERE o.lane = d.lane AND o.id = d.id AND o.nonce = d.nonce LIMIT 1) x
    WHERE d.lane IN (SELECT lane FROM f)
), moved AS (
    DELETE FROM S.outbox o USING hit WHERE o.ctid = hit.ctid
    RETURNING o.id, o.nonce, o.topic, o.key, o.payload, o.headers, o.deliver_at, o.dedup_key, o.created_at, hit.attempts, hit.err
), ins AS (
    INSERT INTO S.dead_letters (id, nonce, topic, key, payload, headers, deliver_at, dedup_key, created_at, attempts, last_error)
    SELECT * FROM moved
    ON CONFLICT (id) DO UPDATE SET attempts = excluded.attempts, last_error = excluded.last_error, failed_at = now()
), r AS (
    DELETE FROM S.retries x USING moved m WHERE x.id = m.id AND (x.nonce = m.nonce OR x.nonce IS NULL)
)
SELECT lane FROM f`),

		// register claims the relay id for this incarnation, unless another
		// incarnation heartbeated within three lease TTLs (then it returns
		// that one's host, pid and heartbeat age instead).
		register: q(`WITH up AS (
    INSERT INTO S.relays AS r (relay_id, host, pid, incarnation, lease_until) VALUES ($1, $2, $3, $4, now() + $5::interval)
    ON CONFLICT (relay_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, incarnation = excluded.incarnation,
        started_at = now(), heartbeat_at = now(), lease_until = excluded.lease_until
    WHERE r.incarnation = excluded.incarnation OR r.heartbeat_at < now() - 3 * $5::interval
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM up), coalesce(r.host, ''), coalesce(r.pid, 0),
    coalesce(extract(epoch FROM now() - r.heartbeat_at)::float8, 0)
FROM (SELECT 1) AS one LEFT JOIN S.relays r ON r.relay_id = $1`),
		// heartbeat renews this incarnation's registration and its lease (the
		// lease of every lane it owns: one row version per round, whatever
		// the lanes), or registers it again when its row is gone (other
		// relays delete a row three lease TTLs after its last heartbeat: a
		// relay cut off from the database that long comes back to no row,
		// and is not refused for it). Only a row of another incarnation, a
		// relay started with the same id meanwhile, makes it return 0.
		heartbeat: q(`WITH hb AS (
    INSERT INTO S.relays AS r (relay_id, host, pid, incarnation, lease_until) VALUES ($1, $4, $5, $2, now() + $3::interval)
    ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now(), lease_until = excluded.lease_until WHERE r.incarnation = excluded.incarnation
    RETURNING 1
), gone AS (
    DELETE FROM S.relays WHERE heartbeat_at < now() - 3 * $3::interval AND relay_id <> $1
)
SELECT (SELECT count(*) FROM hb), count(*) + 1 FROM S.relays WHERE heartbeat_at > now() - $3::interval AND relay_id <> $1`),
		// renew reads the caller's lanes, locking them so that a claim
		// racing with this round either waits for it or skips them, and
		// either way this relay learns here which lanes it still owns. It
		// writes nothing: the heartbeat in the same transaction extended
		// the lease of all of them.
		renew: q(`SELECT lane, fence FROM S.lanes WHERE owner = $1 ORDER BY lane FOR UPDATE`),
		// A claim runs in two statements of one READ COMMITTED transaction
		// (Store.Claim, Store.ClaimAlone). claimLock locks the candidates:
		// free lanes and lanes whose owner's lease ran out (or whose owner's
		// row is gone), skipping lanes another transaction has locked.
		// claimTake then takes those of the locked lanes that are still
		// candidates, checked on its own snapshot, taken after every lock was
		// granted. One statement doing both is not enough: a relay paused
		// past its lease renews in a transaction that locks its lane rows
		// but updates only its relays row, so a claim whose snapshot
		// predates that renewal's commit and whose lock comes after it gets
		// the lock with no recheck (the row was not updated) and would take
		// the lane on its stale view of the owner's lease, while the owner
		// believes its renewal. With the check after the locks, a renewal
		// either committed before the check (the owner is live and keeps
		// the lane) or still has to lock the lane row, which waits for the
		// claim to commit and then finds the lane gone. $1 is the most lanes
		// to lock (NULL: all).
		claimLock: q(`SELECT x.lane FROM S.lanes x
WHERE x.owner IS NULL OR NOT EXISTS (SELECT 1 FROM S.relays r WHERE r.relay_id = x.owner AND r.lease_until > now())
ORDER BY x.lane LIMIT $1 FOR UPDATE OF x SKIP LOCKED`),
		// claimTake: $1 the relay id, $2 the lanes claimLock locked.
		claimTake: q(`UPDATE S.lanes l SET owner = $1, fence = l.fence + 1
WHERE l.lane = ANY($2::smallint[])
AND (l.owner IS NULL OR NOT EXISTS (SELECT 1 FROM S.relays r WHERE r.relay_id = l.owner AND r.lease_until > now()))
RETURNING l.lane, l.fence`),
		// claimAloneTake is claimTake for an exclusive relay: it takes
		// nothing while another live relay holds a lane. Exclusive claims
		// take turns (Store.ClaimAlone), so the second of two finds every
		// lane taken.
		claimAloneTake: q(`UPDATE S.lanes l SET owner = $1, fence = l.fence + 1
WHERE l.lane = ANY($2::smallint[])
AND (l.owner IS NULL OR NOT EXISTS (SELECT 1 FROM S.relays r WHERE r.relay_id = l.owner AND r.lease_until > now()))
AND NOT EXISTS (SELECT 1 FROM S.lanes y JOIN S.relays r ON r.relay_id = y.owner WHERE y.owner <> $1 AND r.lease_until > now())
RETURNING l.lane, l.fence`),
		release: q(`UPDATE S.lanes SET owner = NULL WHERE lane = $1 AND owner = $2 AND fence = $3`),
		releaseAll: q(`UPDATE S.lanes l SET owner = NULL
FROM (SELECT lane FROM S.lanes WHERE owner = $1 AND lane = ANY($2::smallint[]) ORDER BY lane FOR UPDATE) mine
WHERE l.lane = mine.lane`),
		unregister:  q(`DELETE FROM S.relays WHERE relay_id = $1 AND incarnation = $2`),
		loadRetries: q(`SELECT id, attempts, next_attempt_at, lane, nonce FROM S.retries WHERE lane = ANY($1::smallint[])`),
		laneOwners: q(`SELECT count(*) FILTER (WHERE owner IS NULL OR owner NOT IN (
    SELECT relay_id FROM S.relays WHERE heartbeat_at > now() - $1::interval AND lease_until > now())) FROM S.lanes`),
	}
}
