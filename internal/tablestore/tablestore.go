package tablestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// hotPathSettings applies to the relay's transactions only: JIT off, because
// compiling cost more than the fetch itself; bitmap scans off, because every
// outbox access is a per-lane or per-row LATERAL probe that an index scan
// serves in order, and statistics taken while the queue was empty (every
// estimate one row) made the forward read a bitmap scan of the lane's whole
// backlog above the cursor, sorted, to keep the first rows.
const hotPathSettings = `SELECT set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// fetchSettings are hotPathSettings plus sequential scans off, for the
// fetch's read-only transaction, whose every part (and every load and
// refill) is a per-lane or per-row index probe. Statistics of a backlog that
// lies in one lane (one key's: a WAL outbox's held key moved to the table, a
// hot key) make lane::integer = l.lane match every row for the generic plan:
// the late-commit part then became a sequential scan of the whole outbox,
// once per lane of the fetch (175 ms per fetch for 6,000 rows, against
// 0.2 ms through outbox_lane_xid).
const fetchSettings = `SELECT set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

// Store is the table outbox: messages are rows of <schema>.outbox, read by
// per-lane cursors plus exact late-commit probes, removed by fenced batched
// deletes (docs/architecture.md).
type Store struct {
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

// Config is what a table store needs: the pool, the outbox's schema, the
// relay's id, its logger and its clock (fetch times measure its offset from
// the database's).
type Config struct {
	Pool    *pgxpool.Pool
	Schema  string
	RelayID string
	Logger  *slog.Logger
	Now     func() time.Time
}

// New returns the table store of one relay incarnation (a random id that
// tells this run of the relay from an earlier one with the same relay id).
func New(c Config) *Store {
	var inc [8]byte
	_, _ = rand.Read(inc[:])
	return &Store{pool: c.Pool, q: newQueries(c.Schema), schema: c.Schema, owner: c.RelayID,
		incarnation: hex.EncodeToString(inc[:]), log: c.Logger, now: c.Now}
}

// RetrySQL is the fenced upsert of retry records, for a layout that keeps
// its retries in the same table but its messages elsewhere: unlike the
// table outbox's, it cannot check that each message is in the outbox (its
// arguments are those of Groups).
func (s *Store) RetrySQL() string { return s.q.retryHeld }

// pgPos is the table outbox's read position: the previous fetch's snapshot.
type pgPos struct {
	xmax string
	xip  []string
}

func (s *Store) Register(ctx context.Context, ttl time.Duration) error {
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
		return store.Wrap("register relay", err)
	}
	if !ok {
		return fmt.Errorf("%w: relay id %q is held by a relay on host %q (pid %d) that heartbeated %.1fs ago; give each relay its own --relay-id (or leave it unset for a unique one), or wait %s after that relay stopped",
			store.ErrRelayIDInUse, s.owner, ohost, opid, seconds, 3*ttl)
	}
	return nil
}

func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

func (s *Store) LeaseRound(ctx context.Context, ttl time.Duration) (store.LeaseRound, error) {
	var lr store.LeaseRound
	lr.Renewed = map[int16]int64{}
	iv := interval(ttl)
	var ours int
	// A batch runs as one transaction: the heartbeat extends the lease of
	// the lanes the renewal reads.
	b := &pgx.Batch{}
	b.Queue(s.q.heartbeat, s.owner, s.incarnation, iv, s.host, s.pid).QueryRow(func(row pgx.Row) error { return row.Scan(&ours, &lr.Live) })
	b.Queue(s.q.renew, s.owner).Query(func(rows pgx.Rows) error {
		var lane int16
		var fence int64
		_, err := pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
			lr.Renewed[lane] = fence
			return nil
		})
		return err
	})
	b.Queue(s.q.laneOwners, iv).QueryRow(func(row pgx.Row) error { return row.Scan(&lr.Uncovered) })
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return lr, store.Wrap("lease renewal", err)
	}
	lr.LostID = ours == 0
	return lr, nil
}

// ClaimAlone takes a transaction-scoped advisory lock first, in a statement
// of its own: the claim's snapshots are then taken after the previous
// exclusive claim committed, and see its owner live. (Waiting for the lane
// rows alone is not enough: a row checked again after its lock is granted is
// checked against the claim's older snapshot, which may not see the winner's
// registration yet, and the lanes would change hands twice.)
func (s *Store) ClaimAlone(ctx context.Context) ([]store.LaneLease, error) {
	return s.claim(ctx, true, nil)
}

// Claim takes up to n lanes that are free or whose owner's lease ran out.
func (s *Store) Claim(ctx context.Context, n int) ([]store.LaneLease, error) {
	return s.claim(ctx, false, &n)
}

// claim runs a claim as one READ COMMITTED transaction (queries.go says
// why it takes two statements): lock the candidate lanes, then take those
// still free or expired on a snapshot taken after the locks. The isolation
// level is explicit: under a database default of REPEATABLE READ the second
// statement would see the first one's snapshot, and the check would be as
// stale as the locks. n is the most lanes to take (nil: every one; alone:
// with claimAloneTake).
func (s *Store) claim(ctx context.Context, alone bool, n *int) ([]store.LaneLease, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if alone {
		// Held until the claim commits.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "wharf claimAlone "+s.schema); err != nil {
			return nil, store.Wrap("claim lanes", err)
		}
	}
	lanes, err := s.lockCandidates(ctx, tx, n)
	if err != nil || len(lanes) == 0 {
		return nil, err
	}
	got, err := s.takeLocked(ctx, tx, alone, lanes)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	return got, nil
}

// lockCandidates is a claim's first statement (queries.claimLock).
func (s *Store) lockCandidates(ctx context.Context, tx pgx.Tx, n *int) ([]int16, error) {
	rows, err := tx.Query(ctx, s.q.claimLock, n)
	if err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	lanes, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	return lanes, nil
}

// takeLocked is a claim's second statement (queries.claimTake or
// claimAloneTake), on lanes its first locked.
func (s *Store) takeLocked(ctx context.Context, tx pgx.Tx, alone bool, lanes []int16) ([]store.LaneLease, error) {
	sql := s.q.claimTake
	if alone {
		sql = s.q.claimAloneTake
	}
	rows, err := tx.Query(ctx, sql, s.owner, lanes)
	if err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	var got []store.LaneLease
	var lane int16
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&lane, &fence}, func() error {
		got = append(got, store.LaneLease{Lane: lane, Fence: fence})
		return nil
	})
	if err != nil {
		return nil, store.Wrap("claim lanes", err)
	}
	return got, nil
}

func (s *Store) Release(ctx context.Context, rel store.LaneRelease) error {
	_, err := s.pool.Exec(ctx, s.q.release, rel.Lane, s.owner, rel.Fence)
	return err
}

func (s *Store) ReleaseAll(ctx context.Context, lanes []int16) error {
	_, err := s.pool.Exec(ctx, s.q.releaseAll, s.owner, lanes)
	return err
}

func (s *Store) Unregister(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, s.q.unregister, s.owner, s.incarnation)
	return err
}

func (s *Store) LoadRetries(ctx context.Context, lanes []int16) (map[int16]map[int64]store.RetryInfo, error) {
	out := make(map[int16]map[int64]store.RetryInfo, len(lanes))
	for _, l := range lanes {
		out[l] = map[int64]store.RetryInfo{}
	}
	rows, err := s.pool.Query(ctx, s.q.loadRetries, lanes)
	if err != nil {
		return nil, store.Wrap("load retries", err)
	}
	var id int64
	var attempts int
	var next time.Time
	var lane int16
	var nonce pgtype.Int8
	_, err = pgx.ForEachRow(rows, []any{&id, &attempts, &next, &lane, &nonce}, func() error {
		// A record without a nonce was written before schema version 9:
		// it is the record of the message at its seq, as it was then.
		out[lane][id] = store.RetryInfo{Attempts: attempts, Next: next, Nonce: nonce.Int64, AnyNonce: !nonce.Valid}
		return nil
	})
	if err != nil {
		return nil, store.Wrap("load retries", err)
	}
	return out, nil
}

// Fetch runs the one-statement read described in queries.go, and the loads
// and refills the engine asked for, in one read-only transaction and one
// round trip.
func (s *Store) Fetch(ctx context.Context, req store.FetchRequest) (res store.FetchResult) {
	res = store.FetchResult{Req: req, Started: s.now()}
	defer func() { res.Finished = s.now() }()
	prev, _ := req.Pos.(pgPos)
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
	batch.Queue(fetchSettings)
	batch.Queue(s.q.fetch, req.Lanes, req.Cursors, req.Limits, prev.xmax, xip)
	loadN := 0
	if len(req.Loads) > 0 {
		var lanes []int16
		var seqs []int64
		for _, l := range req.Loads {
			for _, seq := range l.Seqs {
				lanes = append(lanes, l.Lane)
				seqs = append(seqs, seq)
			}
		}
		batch.Queue(s.q.load, lanes, seqs)
		loadN = len(seqs)
	}
	if len(req.Refills) > 0 {
		lanes := make([]int16, len(req.Refills))
		keys := make([]string, len(req.Refills))
		from := make([]int64, len(req.Refills))
		to := make([]int64, len(req.Refills))
		topics := make([]*string, len(req.Refills))
		for i, rf := range req.Refills {
			lanes[i], keys[i], from[i], to[i] = rf.Lane, rf.MsgKey, rf.From, rf.To
			if rf.Topic != "" {
				topics[i] = &req.Refills[i].Topic
			}
		}
		batch.Queue(s.q.refill, lanes, keys, from, to, req.RefillLimit, topics)
	}
	batch.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, batch)
	defer br.Close()
	for i := 0; i < 2; i++ {
		if _, err := br.Exec(); err != nil {
			res.Err = store.Wrap("fetch", err)
			return res
		}
	}
	var snap string
	var err error
	cut := newByteCut(req)
	res.Rows, snap, res.DBNow, err = scanRows(br, true, cut, req.ExpectedRows())
	if err != nil {
		res.Err = store.Wrap("fetch", err)
		return res
	}
	if len(req.Loads) > 0 {
		if res.LoadRows, _, _, err = scanRows(br, false, nil, loadN); err != nil {
			res.Err = store.Wrap("load held messages", err)
			return res
		}
	}
	if len(req.Refills) > 0 {
		if res.RefillRows, _, _, err = scanRows(br, false, nil, 0); err != nil {
			res.Err = store.Wrap("refill", err)
			return res
		}
	}
	if _, err := br.Exec(); err != nil {
		res.Err = store.Wrap("fetch", err)
		return res
	}
	if snap == "" {
		res.Err = errors.New("wharf: fetch returned no snapshot")
		return res
	}
	next, err := parseSnapshot(snap)
	if err != nil {
		res.Err = err
		return res
	}
	res.Pos = next
	// xids only grow; a smaller xmax means this is not the database history
	// the previous reads saw (asynchronous failover, point-in-time restore):
	// rows below the cursors may carry xids the previous snapshot already
	// counted as finished, so every lane must be read again.
	if a, b := xid8(prev.xmax), xid8(next.xmax); b < a {
		res.Rewound = true
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

func newByteCut(req store.FetchRequest) *byteCut {
	c := &byteCut{}
	for i, l := range req.Lanes {
		c.cursor[l] = req.Cursors[i]
		c.budget[l] = req.Bytes[i]
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
func scanRows(br pgx.BatchResults, snapshot bool, cut *byteCut, sizeHint int) (out []store.Row, snap string, dbNow time.Time, err error) {
	rows, err := br.Query()
	if err != nil {
		return nil, "", dbNow, err
	}
	defer rows.Close()
	out = make([]store.Row, 0, sizeHint)
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
		m := store.Row{Seq: id, Nonce: nonce, Topic: topic, Key: key.String, Payload: append([]byte{}, payload...), CreatedAt: createdAt.Time, Lane: lane, At: at}
		if deliverAt.Valid {
			m.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			m.Headers = DecodeHeaders(headers)
		}
		out = append(out, m)
	}
	return out, snap, dbNow, rows.Err()
}

// DecodeHeaders accepts any JSON object; non-string values (possible only
// when rows were inserted around wharf.enqueue) are kept as their JSON text.
func DecodeHeaders(b []byte) map[string]string {
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

// WriteResults writes a group of delivery results in one round trip and one
// transaction: removals of delivered rows, retry records, dead-letter moves.
// Each statement is fenced; the result says which lanes were still ours.
func (s *Store) WriteResults(ctx context.Context, ops []store.Op) store.OpsResult {
	return WriteIsolated(ctx, ops, s.writeTx)
}

// WriteIsolated writes ops with write, in one transaction. If it fails for a
// reason other than the connection (a statement PostgreSQL refuses), one bad
// result must not hold back the others: the acknowledgements are written
// alone first, then each retry and dead-letter move on its own, with its
// error text replaced if that text was the problem.
func WriteIsolated(ctx context.Context, ops []store.Op, write func(context.Context, []store.Op, map[int16]bool) error) store.OpsResult {
	res := store.OpsResult{Ops: ops, Valid: map[int16]bool{}}
	err := write(ctx, ops, res.Valid)
	if err == nil {
		return res
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || ctx.Err() != nil {
		res.Err = store.Wrap("write results", err)
		return res
	}
	res.Isolated = true
	var acks []store.Op
	for _, o := range ops {
		if o.Kind == store.OpAck {
			acks = append(acks, o)
		}
	}
	if len(acks) > 0 {
		if err := write(ctx, acks, res.Valid); err != nil {
			res.Err = store.Wrap("write acknowledgements", err)
			return res
		}
	}
	for i := range ops {
		if ops[i].Kind == store.OpAck {
			continue
		}
		one := ops[i : i+1]
		err := write(ctx, one, res.Valid)
		if err != nil && errors.As(err, &pgErr) {
			ops[i].Err = fmt.Sprintf("wharf: the delivery error could not be stored (%s); see the relay's log", pgErr.Code)
			err = write(ctx, one, res.Valid)
		}
		if err != nil {
			res.Err = store.Wrap("write results", err)
			return res
		}
	}
	return res
}

// Groups are a write's results as the statements take them: one record
// per message and statement, since an upsert cannot affect a row twice
// (SQLSTATE 21000). A write that failed is queued again ahead of newer
// results, so a message that failed again meanwhile has two retry records;
// the later one wins. A message acknowledged in the same write keeps no
// retry record (an acknowledgement of another message with its seq, a late
// one of the history before a restore, does not count). Retry records and their removals carry the message's nonce:
// a record is one message's, not its seq's.
type Groups struct {
	Lanes                              []int16 // every lane of the write, with its fence
	Fences                             []int64
	AckLane, RetryLane, DeadLane       []int16
	AckID, RetryID, DeadID, ClearRetry []int64
	AckNonce, DeadNonce                []int64
	RetryNonce, ClearNonce             []int64
	RetryAtt, DeadAtt                  []int32
	RetryAt                            []time.Time
	RetryErr, DeadErr                  []string
	AckAt                              []pgtype.TID // where each acknowledged row was read
}

// GroupOps sorts ops into the statements' arrays (see Groups).
func GroupOps(ops []store.Op) *Groups {
	g := &Groups{}
	fences := map[int16]int64{}
	// The maps cost only writes that hold failures: a write of
	// acknowledgements alone (the hot path) builds none.
	var acked map[[2]int64]bool // seq and nonce
	var retryAtIdx, deadAtIdx map[int64]int
	for _, o := range ops {
		if o.Kind != store.OpAck {
			acked, retryAtIdx, deadAtIdx = map[[2]int64]bool{}, map[int64]int{}, map[int64]int{}
			for _, a := range ops {
				if a.Kind == store.OpAck {
					acked[[2]int64{a.Seq, a.Nonce}] = true
				}
			}
			break
		}
	}
	for _, o := range ops {
		fences[o.Lane] = o.Fence
		switch o.Kind {
		case store.OpAck:
			g.AckLane = append(g.AckLane, o.Lane)
			g.AckID = append(g.AckID, o.Seq)
			g.AckNonce = append(g.AckNonce, o.Nonce)
			g.AckAt = append(g.AckAt, o.At)
			if o.Attempts > 0 {
				g.ClearRetry = append(g.ClearRetry, o.Seq)
				g.ClearNonce = append(g.ClearNonce, o.Nonce)
			}
		case store.OpRetry:
			if acked[[2]int64{o.Seq, o.Nonce}] {
				continue
			}
			if i, ok := retryAtIdx[o.Seq]; ok {
				g.RetryLane[i], g.RetryNonce[i], g.RetryAtt[i], g.RetryAt[i], g.RetryErr[i] = o.Lane, o.Nonce, int32(o.Attempts), o.NextAt, o.Err
				continue
			}
			retryAtIdx[o.Seq] = len(g.RetryID)
			g.RetryLane = append(g.RetryLane, o.Lane)
			g.RetryID = append(g.RetryID, o.Seq)
			g.RetryNonce = append(g.RetryNonce, o.Nonce)
			g.RetryAtt = append(g.RetryAtt, int32(o.Attempts))
			g.RetryAt = append(g.RetryAt, o.NextAt)
			g.RetryErr = append(g.RetryErr, o.Err)
		case store.OpDead:
			if i, ok := deadAtIdx[o.Seq]; ok {
				g.DeadLane[i], g.DeadNonce[i], g.DeadAtt[i], g.DeadErr[i] = o.Lane, o.Nonce, int32(o.Attempts), o.Err
				continue
			}
			deadAtIdx[o.Seq] = len(g.DeadID)
			g.DeadLane = append(g.DeadLane, o.Lane)
			g.DeadID = append(g.DeadID, o.Seq)
			g.DeadNonce = append(g.DeadNonce, o.Nonce)
			g.DeadAtt = append(g.DeadAtt, int32(o.Attempts))
			g.DeadErr = append(g.DeadErr, o.Err)
		}
	}
	for l, f := range fences {
		g.Lanes = append(g.Lanes, l)
		g.Fences = append(g.Fences, f)
	}
	return g
}

func (s *Store) writeTx(ctx context.Context, ops []store.Op, valid map[int16]bool) error {
	g := GroupOps(ops)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(hotPathSettings)
	if len(g.AckID) > 0 {
		b.Queue(s.q.ack, g.Lanes, g.Fences, s.owner, g.AckLane, g.AckID, g.ClearRetry, g.AckAt, g.AckNonce, g.ClearNonce)
	}
	if len(g.RetryID) > 0 {
		b.Queue(s.q.retry, g.Lanes, g.Fences, s.owner, g.RetryLane, g.RetryID, g.RetryAtt, g.RetryAt, g.RetryErr, g.RetryNonce)
	}
	if len(g.DeadID) > 0 {
		b.Queue(s.q.dead, g.Lanes, g.Fences, s.owner, g.DeadLane, g.DeadID, g.DeadAtt, g.DeadErr, g.DeadNonce)
	}
	b.Queue("COMMIT")
	return SendFenced(ctx, s.pool, b, 2, valid)
}

// SendFenced runs b in one round trip: its first skip statements (BEGIN,
// settings), then fenced statements that each return lanes still the
// caller's, then COMMIT. Those lanes go into valid once it committed.
func SendFenced(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch, skip int, valid map[int16]bool) error {
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

// Listen wakes the engine on every notification from the outbox trigger. It
// uses a connection of its own so it never holds one of the pool's.
func (s *Store) Listen(ctx context.Context, wake func()) {
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
