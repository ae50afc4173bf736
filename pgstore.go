package wharf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// hotPathSettings applies to the relay's transactions only: JIT off, because
// compiling cost more than the fetch itself; bitmap scans off, because every
// outbox access is a per-lane or per-row LATERAL probe that an index scan
// serves in order, and statistics taken while the queue was empty (every
// estimate one row) made the forward read a bitmap scan of the lane's whole
// backlog above the cursor, sorted, to keep the first rows.
const hotPathSettings = `SELECT set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// pgStore is the table outbox: messages are rows of <schema>.outbox, read by
// per-lane cursors plus exact late-commit probes, removed by fenced batched
// deletes (docs/architecture.md).
type pgStore struct {
	pool        *pgxpool.Pool
	q           queries
	schema      string
	owner       string
	incarnation string
	host        string // this process, for its registration
	pid         int
	log         *slog.Logger
	now         func() time.Time // the relay's clock: fetch times measure its offset from the database's
}

// pgPos is the table outbox's read position: the previous fetch's snapshot.
type pgPos struct {
	xmax string
	xip  []string
}

func (s *pgStore) register(ctx context.Context, ttl time.Duration) error {
	host, _ := os.Hostname()
	s.host, s.pid = host, os.Getpid()
	var (
		ok      bool
		ohost   string
		opid    int
		seconds float64
	)
	err := s.pool.QueryRow(ctx, s.q.register, s.owner, host, os.Getpid(), s.incarnation, interval(ttl)).Scan(&ok, &ohost, &opid, &seconds)
	if err != nil {
		return storeErr("register relay", err)
	}
	if !ok {
		return fmt.Errorf("%w: relay id %q is held by a relay on host %q (pid %d) that heartbeated %.1fs ago; give each relay its own --relay-id (or leave it unset for a unique one), or wait %s after that relay stopped",
			ErrRelayIDInUse, s.owner, ohost, opid, seconds, 3*ttl)
	}
	return nil
}

func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

func (s *pgStore) leaseRound(ctx context.Context, ttl time.Duration) (leaseRound, error) {
	var lr leaseRound
	lr.renewed = map[int16]int64{}
	iv := interval(ttl)
	var ours int
	// A batch runs as one transaction: the heartbeat extends the lease of
	// the lanes the renewal reads.
	b := &pgx.Batch{}
	b.Queue(s.q.heartbeat, s.owner, s.incarnation, iv, s.host, s.pid).QueryRow(func(row pgx.Row) error { return row.Scan(&ours, &lr.live) })
	b.Queue(s.q.renew, s.owner).Query(func(rows pgx.Rows) error {
		var lane int16
		var fence int64
		_, err := pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
			lr.renewed[lane] = fence
			return nil
		})
		return err
	})
	b.Queue(s.q.laneOwners, iv).QueryRow(func(row pgx.Row) error { return row.Scan(&lr.uncovered) })
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return lr, storeErr("lease renewal", err)
	}
	lr.lostID = ours == 0
	return lr, nil
}

// claimAlone takes a transaction-scoped advisory lock first, in a statement
// of its own: the claim's snapshot is then taken after the previous exclusive
// claim committed, and sees its owner live. (Waiting for the lane rows alone
// is not enough: a row checked again after its lock is granted is checked
// against the claim's older snapshot, which may not see the winner's
// registration yet, and the lanes would change hands twice.)
func (s *pgStore) claimAlone(ctx context.Context) ([]laneLease, error) {
	var got []laneLease
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "wharf claimAlone "+s.schema)
	b.Queue(s.q.claimAlone, s.owner).Query(func(rows pgx.Rows) error {
		var lane int16
		var fence int64
		_, err := pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
			got = append(got, laneLease{lane: lane, fence: fence})
			return nil
		})
		return err
	})
	// A batch runs as one transaction: the lock is held until the claim
	// commits.
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, storeErr("claim lanes", err)
	}
	return got, nil
}

func (s *pgStore) claim(ctx context.Context, n int) ([]laneLease, error) {
	rows, err := s.pool.Query(ctx, s.q.claim, s.owner, n)
	if err != nil {
		return nil, storeErr("claim lanes", err)
	}
	var got []laneLease
	var lane int16
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
		got = append(got, laneLease{lane: lane, fence: fence})
		return nil
	})
	if err != nil {
		return nil, storeErr("claim lanes", err)
	}
	return got, nil
}

func (s *pgStore) release(ctx context.Context, rel laneRelease) error {
	_, err := s.pool.Exec(ctx, s.q.release, rel.lane, s.owner, rel.fence)
	return err
}

func (s *pgStore) releaseAll(ctx context.Context, lanes []int16) error {
	_, err := s.pool.Exec(ctx, s.q.releaseAll, s.owner, lanes)
	return err
}

func (s *pgStore) unregister(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, s.q.unregister, s.owner, s.incarnation)
	return err
}

func (s *pgStore) loadRetries(ctx context.Context, lanes []int16) (map[int16]map[int64]retryInfo, error) {
	out := make(map[int16]map[int64]retryInfo, len(lanes))
	for _, l := range lanes {
		out[l] = map[int64]retryInfo{}
	}
	rows, err := s.pool.Query(ctx, s.q.loadRetries, lanes)
	if err != nil {
		return nil, storeErr("load retries", err)
	}
	var id int64
	var attempts int
	var next time.Time
	var lane int16
	_, err = pgx.ForEachRow(rows, []any{&id, &attempts, &next, &lane}, func() error {
		out[lane][id] = retryInfo{attempts: attempts, next: next}
		return nil
	})
	if err != nil {
		return nil, storeErr("load retries", err)
	}
	return out, nil
}

// fetch runs the one-statement read described in queries.go, and the loads
// and refills the engine asked for, in one read-only transaction and one
// round trip.
func (s *pgStore) fetch(ctx context.Context, req fetchRequest) (res fetchResult) {
	res = fetchResult{req: req, started: s.now()}
	defer func() { res.finished = s.now() }()
	prev, _ := req.pos.(pgPos)
	if prev.xmax == "" {
		prev.xmax = "0"
	}
	xip := prev.xip
	if xip == nil {
		xip = []string{}
	}
	// The settings are local to an explicit transaction, pipelined into one
	// round trip: no session state is left behind (safe behind PgBouncer in
	// transaction mode).
	batch := &pgx.Batch{}
	batch.Queue("BEGIN READ ONLY")
	batch.Queue(hotPathSettings)
	batch.Queue(s.q.fetch, req.lanes, req.cursors, req.limits, prev.xmax, xip)
	loadN := 0
	if len(req.loads) > 0 {
		var lanes []int16
		var seqs []int64
		for _, l := range req.loads {
			for _, seq := range l.seqs {
				lanes = append(lanes, l.lane)
				seqs = append(seqs, seq)
			}
		}
		batch.Queue(s.q.load, lanes, seqs)
		loadN = len(seqs)
	}
	if len(req.refills) > 0 {
		lanes := make([]int16, len(req.refills))
		keys := make([]string, len(req.refills))
		from := make([]int64, len(req.refills))
		to := make([]int64, len(req.refills))
		topics := make([]*string, len(req.refills))
		for i, rf := range req.refills {
			lanes[i], keys[i], from[i], to[i] = rf.lane, rf.okey, rf.from, rf.to
			if rf.topic != "" {
				topics[i] = &req.refills[i].topic
			}
		}
		batch.Queue(s.q.refill, lanes, keys, from, to, req.refillLimit, topics)
	}
	batch.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, batch)
	defer br.Close()
	for i := 0; i < 2; i++ {
		if _, err := br.Exec(); err != nil {
			res.err = storeErr("fetch", err)
			return res
		}
	}
	var snap string
	var err error
	cut := newByteCut(req)
	res.rows, snap, res.dbNow, err = scanRows(br, true, cut, req.expectedRows())
	if err != nil {
		res.err = storeErr("fetch", err)
		return res
	}
	if len(req.loads) > 0 {
		if res.loadRows, _, _, err = scanRows(br, false, nil, loadN); err != nil {
			res.err = storeErr("load held messages", err)
			return res
		}
	}
	if len(req.refills) > 0 {
		if res.refillRows, _, _, err = scanRows(br, false, nil, 0); err != nil {
			res.err = storeErr("refill", err)
			return res
		}
	}
	if _, err := br.Exec(); err != nil {
		res.err = storeErr("fetch", err)
		return res
	}
	if snap == "" {
		res.err = errors.New("wharf: fetch returned no snapshot")
		return res
	}
	next, err := parseSnapshot(snap)
	if err != nil {
		res.err = err
		return res
	}
	res.pos = next
	// xids only grow; a smaller xmax means this is not the database history
	// the previous reads saw (asynchronous failover, point-in-time restore):
	// rows below the cursors may carry xids the previous snapshot already
	// counted as finished, so every lane must be read again.
	if a, b := xid8(prev.xmax), xid8(next.xmax); b < a {
		res.rewound = true
	}
	return res
}

// xid8 is s as an xid, 0 for the empty position before the first fetch.
func xid8(s string) uint64 {
	v, _ := parseXid(s)
	return v
}

// byteCut bounds the payload bytes a fetch keeps per lane: the statement
// reads up to each lane's row limit, and once a lane's forward rows (seq above
// its cursor) used up its share, its further forward rows are dropped as they
// are read — never copied — and read again by the next fetch (the lane's
// cursor stops at the last row kept). The first row of a lane is always kept.
// Doing this while reading, not in SQL, keeps the statement as cheap as a
// plain per-lane LIMIT: a running sum in a window function cost 70 % more
// per fetch on a 1M backlog.
type byteCut struct {
	cursor [wharfmigrate.Lanes]int64
	budget [wharfmigrate.Lanes]int64
	used   [wharfmigrate.Lanes]int64
	full   [wharfmigrate.Lanes]bool
	asked  [wharfmigrate.Lanes]bool // the request reads the lane
}

func newByteCut(req fetchRequest) *byteCut {
	c := &byteCut{}
	for i, l := range req.lanes {
		c.cursor[l] = req.cursors[i]
		c.budget[l] = req.bytes[i]
		c.asked[l] = true
	}
	return c
}

// keep reports whether a row of lane with seq and size payload bytes is kept.
func (c *byteCut) keep(lane int16, seq int64, size int) bool {
	if c == nil || lane < 0 || lane >= wharfmigrate.Lanes || !c.asked[lane] || seq <= c.cursor[lane] {
		return true // a late commit below the cursor: always read
	}
	if c.full[lane] {
		return false
	}
	c.used[lane] += int64(size)
	if c.used[lane] >= c.budget[lane] {
		c.full[lane] = true // this row is kept; the lane's next ones are not
	}
	return true
}

// scanRows reads one result set of outbox rows; with snapshot, the row of
// lane -1 carries the snapshot and the database clock. sizeHint is the rows
// expected: growing the slice row by row copied every row about twice.
func scanRows(br pgx.BatchResults, snapshot bool, cut *byteCut, sizeHint int) (out []fetchedRow, snap string, dbNow time.Time, err error) {
	rows, err := br.Query()
	if err != nil {
		return nil, "", dbNow, err
	}
	defer rows.Close()
	out = make([]fetchedRow, 0, sizeHint)
	var (
		lane      int16
		id, nonce int64
		topic     string
		key       pgtype.Text
		payload   pgtype.DriverBytes
		headers   []byte
		deliverAt pgtype.Timestamptz
		createdAt pgtype.Timestamptz
		snapText  pgtype.Text
		now       pgtype.Timestamptz
		at        pgtype.TID
	)
	dest := []any{&lane, &id, &nonce, &topic, &key, &payload, &headers, &deliverAt, &createdAt, &at}
	if snapshot {
		dest = append(dest, &snapText, &now)
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, "", dbNow, err
		}
		if lane < 0 {
			snap, dbNow = snapText.String, now.Time
			continue
		}
		if !cut.keep(lane, id, len(payload)) {
			continue
		}
		m := Message{ID: FormatID(id, nonce), Seq: id, Topic: topic, Key: key.String, Payload: append([]byte{}, payload...), CreatedAt: createdAt.Time}
		if deliverAt.Valid {
			m.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			m.Headers = decodeHeaders(headers)
		}
		out = append(out, fetchedRow{Message: m, lane: lane, at: at})
	}
	return out, snap, dbNow, rows.Err()
}

// decodeHeaders accepts any JSON object; non-string values (possible only
// when rows were inserted around wharf.enqueue) are kept as their JSON text.
func decodeHeaders(b []byte) map[string]string {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return map[string]string{"wharf-invalid-headers": string(b)}
	}
	h := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if json.Unmarshal(v, &s) == nil {
			h[k] = s
		} else {
			h[k] = string(v)
		}
	}
	return h
}

// parseSnapshot splits "xmin:xmax:xip,xip" (pg_snapshot text form) and
// checks it the way PostgreSQL builds it: decimal xids, xmin <= xmax, every
// xip in [xmin, xmax) and in ascending order. The next fetch sends xmax and
// the xips back, and the rewind check compares xmaxes as numbers, so
// anything else is refused here rather than read as 0.
func parseSnapshot(s string) (pgPos, error) {
	bad := func(why string) (pgPos, error) {
		return pgPos{}, fmt.Errorf("wharf: unexpected snapshot %.100q: %s", s, why)
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return bad("want xmin:xmax:xip,...")
	}
	xmin, err1 := parseXid(parts[0])
	xmax, err2 := parseXid(parts[1])
	if err1 != nil || err2 != nil {
		return bad("xmin and xmax must be decimal transaction ids")
	}
	if xmin > xmax {
		return bad("xmin above xmax")
	}
	p := pgPos{xmax: parts[1]}
	if parts[2] != "" {
		p.xip = strings.Split(parts[2], ",")
		prev := xmin
		for i, x := range p.xip {
			v, err := parseXid(x)
			switch {
			case err != nil:
				return bad("in-progress xids must be decimal transaction ids")
			case v >= xmax || v < prev || i > 0 && v == prev:
				return bad("in-progress xids must be ascending, from xmin and below xmax")
			}
			prev = v
		}
	}
	return p, nil
}

// parseXid reads a decimal xid8 (base 10 admits no sign, space or
// underscore).
func parseXid(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }

// writeResults writes a group of delivery results in one round trip and one
// transaction: removals of delivered rows, retry records, dead-letter moves.
// Each statement is fenced; the result says which lanes were still ours.
func (s *pgStore) writeResults(ctx context.Context, ops []op) opsResult {
	return writeIsolated(ctx, ops, s.writeTx)
}

// writeIsolated writes ops with write, in one transaction. If it fails for a
// reason other than the connection (a statement PostgreSQL refuses), one bad
// result must not hold back the others: the acknowledgements are written
// alone first, then each retry and dead-letter move on its own, with its
// error text replaced if that text was the problem.
func writeIsolated(ctx context.Context, ops []op, write func(context.Context, []op, map[int16]bool) error) opsResult {
	res := opsResult{ops: ops, valid: map[int16]bool{}}
	err := write(ctx, ops, res.valid)
	if err == nil {
		return res
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || ctx.Err() != nil {
		res.err = storeErr("write results", err)
		return res
	}
	res.isolated = true
	var acks []op
	for _, o := range ops {
		if o.kind == opAck {
			acks = append(acks, o)
		}
	}
	if len(acks) > 0 {
		if err := write(ctx, acks, res.valid); err != nil {
			res.err = storeErr("write acknowledgements", err)
			return res
		}
	}
	for i := range ops {
		if ops[i].kind == opAck {
			continue
		}
		one := ops[i : i+1]
		err := write(ctx, one, res.valid)
		if err != nil && errors.As(err, &pgErr) {
			ops[i].err = fmt.Sprintf("wharf: the delivery error could not be stored (%s); see the relay's log", pgErr.Code)
			err = write(ctx, one, res.valid)
		}
		if err != nil {
			res.err = storeErr("write results", err)
			return res
		}
	}
	return res
}

// opGroups are a write's results as the statements take them: one record
// per message and statement, since an upsert cannot affect a row twice
// (SQLSTATE 21000). A write that failed is queued again ahead of newer
// results, so a message that failed again meanwhile has two retry records;
// the later one wins. A message acknowledged in the same write keeps no
// retry record.
type opGroups struct {
	lanes                              []int16 // every lane of the write, with its fence
	fences                             []int64
	ackLane, retryLane, deadLane       []int16
	ackID, retryID, deadID, clearRetry []int64
	retryAtt, deadAtt                  []int32
	retryAt                            []time.Time
	retryErr, deadErr                  []string
	ackAt                              []pgtype.TID // where each acknowledged row was read
}

func groupOps(ops []op) *opGroups {
	g := &opGroups{}
	fences := map[int16]int64{}
	// The maps cost only writes that hold failures: a write of
	// acknowledgements alone (the hot path) builds none.
	var acked map[int64]bool
	var retryAtIdx, deadAtIdx map[int64]int
	for _, o := range ops {
		if o.kind != opAck {
			acked, retryAtIdx, deadAtIdx = map[int64]bool{}, map[int64]int{}, map[int64]int{}
			for _, a := range ops {
				if a.kind == opAck {
					acked[a.seq] = true
				}
			}
			break
		}
	}
	for _, o := range ops {
		fences[o.lane] = o.fence
		switch o.kind {
		case opAck:
			g.ackLane = append(g.ackLane, o.lane)
			g.ackID = append(g.ackID, o.seq)
			var at pgtype.TID
			if o.m != nil {
				at = o.m.at
			}
			g.ackAt = append(g.ackAt, at)
			if o.attempts > 0 {
				g.clearRetry = append(g.clearRetry, o.seq)
			}
		case opRetry:
			if acked[o.seq] {
				continue
			}
			if i, ok := retryAtIdx[o.seq]; ok {
				g.retryLane[i], g.retryAtt[i], g.retryAt[i], g.retryErr[i] = o.lane, int32(o.attempts), o.nextAt, o.err
				continue
			}
			retryAtIdx[o.seq] = len(g.retryID)
			g.retryLane = append(g.retryLane, o.lane)
			g.retryID = append(g.retryID, o.seq)
			g.retryAtt = append(g.retryAtt, int32(o.attempts))
			g.retryAt = append(g.retryAt, o.nextAt)
			g.retryErr = append(g.retryErr, o.err)
		case opDead:
			if i, ok := deadAtIdx[o.seq]; ok {
				g.deadLane[i], g.deadAtt[i], g.deadErr[i] = o.lane, int32(o.attempts), o.err
				continue
			}
			deadAtIdx[o.seq] = len(g.deadID)
			g.deadLane = append(g.deadLane, o.lane)
			g.deadID = append(g.deadID, o.seq)
			g.deadAtt = append(g.deadAtt, int32(o.attempts))
			g.deadErr = append(g.deadErr, o.err)
		}
	}
	for l, f := range fences {
		g.lanes = append(g.lanes, l)
		g.fences = append(g.fences, f)
	}
	return g
}

func (s *pgStore) writeTx(ctx context.Context, ops []op, valid map[int16]bool) error {
	g := groupOps(ops)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(hotPathSettings)
	if len(g.ackID) > 0 {
		b.Queue(s.q.ack, g.lanes, g.fences, s.owner, g.ackLane, g.ackID, g.clearRetry, g.ackAt)
	}
	if len(g.retryID) > 0 {
		b.Queue(s.q.retry, g.lanes, g.fences, s.owner, g.retryLane, g.retryID, g.retryAtt, g.retryAt, g.retryErr)
	}
	if len(g.deadID) > 0 {
		b.Queue(s.q.dead, g.lanes, g.fences, s.owner, g.deadLane, g.deadID, g.deadAtt, g.deadErr)
	}
	b.Queue("COMMIT")
	return sendFenced(ctx, s.pool, b, 2, valid)
}

// sendFenced runs b in one round trip: its first skip statements (BEGIN,
// settings), then fenced statements that each return lanes still the
// caller's, then COMMIT. Those lanes go into valid once it committed.
func sendFenced(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch, skip int, valid map[int16]bool) error {
	got := map[int16]bool{}
	br := pool.SendBatch(ctx, b)
	err := func() error {
		for i := 0; i < skip; i++ {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for i := skip; i < b.Len()-1; i++ {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			var l int16
			if _, err := pgx.ForEachRow(rows, []any{&l}, func() error { got[l] = true; return nil }); err != nil {
				return err
			}
		}
		_, err := br.Exec()
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for l := range got {
		valid[l] = true
	}
	return nil
}

// listen wakes the engine on every notification from the outbox trigger. It
// uses a connection of its own so it never holds one of the pool's.
func (s *pgStore) listen(ctx context.Context, wake func()) {
	channel := wharfmigrate.NotifyChannel(s.schema)
	logged := false
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(ctx, `LISTEN "`+channel+`"`); err == nil {
				logged = false
				for {
					if _, err = conn.WaitForNotification(ctx); err != nil {
						break
					}
					wake()
				}
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		if !logged {
			// Polling covers for it; say so once per outage, not per second.
			logged = true
			s.log.Warn("wharf: LISTEN connection failed; polling until it is back", "err", err)
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

func isUndefined(err error) bool {
	return wharfmigrate.IsUndefinedTable(err) || wharfmigrate.IsUndefinedColumn(err)
}
