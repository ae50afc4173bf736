package wharf

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// hotPathSettings applies to the relay's transactions only: JIT off, because
// compiling cost more than the fetch itself. (Plans need no pinning: every
// outbox access is a per-lane or per-row LATERAL probe with nothing for wrong
// statistics to reorder; see queries.go.)
const hotPathSettings = `SELECT set_config('jit', 'off', true)`

// pgStore is the storage behind the relay: every statement the hot path runs
// goes through it, so another layout (an append-only log) can replace it.
type pgStore struct {
	pool  *pgxpool.Pool
	q     queries
	owner string
}

type fetchRequest struct {
	lanes       []int16
	cursors     []int64
	limits      []int32
	fences      []int64
	prevXmax    string
	prevXip     []string
	refills     []refillReq
	refillLimit int
}

// refillReq reads again the rows of a truncated key: id in [from, to].
type refillReq struct {
	lane  int16
	fence int64
	key   string
	from  int64
	to    int64
}

type refillKey struct {
	lane int16
	key  string
}

type fetchedRow struct {
	Message
	lane int16
}

type fetchResult struct {
	req        fetchRequest
	started    time.Time
	rows       []fetchedRow
	refillRows []fetchedRow
	xmax       string
	xip        []string
	err        error
}

func (f *fetchResult) fenceOf(lane int16) int64 {
	for i, l := range f.req.lanes {
		if l == lane {
			return f.req.fences[i]
		}
	}
	return -1
}

// fetch runs the one-statement read described in queries.go.
func (s *pgStore) fetch(ctx context.Context, req fetchRequest) fetchResult {
	res := fetchResult{req: req, started: time.Now()}
	xip := req.prevXip
	if xip == nil {
		xip = []string{}
	}
	// The settings are local to an explicit transaction, pipelined into one
	// round trip: no session state is left behind (safe behind PgBouncer in
	// transaction mode).
	batch := &pgx.Batch{}
	batch.Queue("BEGIN READ ONLY")
	batch.Queue(hotPathSettings)
	batch.Queue(s.q.fetch, req.lanes, req.cursors, req.limits, req.prevXmax, xip)
	if len(req.refills) > 0 {
		lanes := make([]int16, len(req.refills))
		keys := make([]string, len(req.refills))
		from := make([]int64, len(req.refills))
		to := make([]int64, len(req.refills))
		for i, rf := range req.refills {
			lanes[i], keys[i], from[i], to[i] = rf.lane, rf.key, rf.from, rf.to
		}
		batch.Queue(s.q.refill, lanes, keys, from, to, req.refillLimit)
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
	rows, err := br.Query()
	if err != nil {
		res.err = storeErr("fetch", err)
		return res
	}
	defer rows.Close()
	var (
		lane      int16
		id        int64
		topic     string
		key       pgtype.Text
		payload   []byte
		headers   []byte
		deliverAt pgtype.Timestamptz
		createdAt pgtype.Timestamptz
		snap      pgtype.Text
	)
	for rows.Next() {
		if err := rows.Scan(&lane, &id, &topic, &key, &payload, &headers, &deliverAt, &createdAt, &snap); err != nil {
			res.err = storeErr("fetch", err)
			return res
		}
		if lane < 0 {
			res.xmax, res.xip, err = parseSnapshot(snap.String)
			if err != nil {
				res.err = err
				return res
			}
			continue
		}
		m := Message{ID: id, Topic: topic, Key: key.String, Payload: payload, CreatedAt: createdAt.Time}
		if deliverAt.Valid {
			m.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			m.Headers = decodeHeaders(headers)
		}
		res.rows = append(res.rows, fetchedRow{Message: m, lane: lane})
	}
	if err := rows.Err(); err != nil {
		res.err = storeErr("fetch", err)
		return res
	}
	rows.Close()
	if len(req.refills) > 0 {
		if res.refillRows, err = scanRefill(br); err != nil {
			res.err = storeErr("refill", err)
			return res
		}
	}
	if _, err := br.Exec(); err != nil {
		res.err = storeErr("fetch", err)
		return res
	}
	if res.xmax == "" {
		res.err = fmt.Errorf("wharf: fetch returned no snapshot")
	}
	return res
}

func scanRefill(br pgx.BatchResults) ([]fetchedRow, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fetchedRow
	for rows.Next() {
		var (
			row       fetchedRow
			key       pgtype.Text
			headers   []byte
			deliverAt pgtype.Timestamptz
			createdAt pgtype.Timestamptz
		)
		if err := rows.Scan(&row.lane, &row.ID, &row.Topic, &key, &row.Payload, &headers, &deliverAt, &createdAt); err != nil {
			return nil, err
		}
		row.Key = key.String
		row.CreatedAt = createdAt.Time
		if deliverAt.Valid {
			row.DeliverAt = deliverAt.Time
		}
		if len(headers) > 0 {
			row.Headers = decodeHeaders(headers)
		}
		out = append(out, row)
	}
	return out, rows.Err()
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

// parseSnapshot splits "xmin:xmax:xip,xip" (pg_snapshot text form).
func parseSnapshot(s string) (xmax string, xip []string, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", nil, fmt.Errorf("wharf: unexpected snapshot %q", s)
	}
	xmax = parts[1]
	if parts[2] != "" {
		xip = strings.Split(parts[2], ",")
	}
	return xmax, xip, nil
}

type opKind uint8

const (
	opAck opKind = iota
	opRetry
	opDead
)

type op struct {
	kind     opKind
	m        *msg
	lane     int16
	fence    int64
	attempts int
	nextAt   time.Time
	err      string
}

type opsResult struct {
	ops   []op
	valid map[int16]bool
	err   error
}

// writeOps writes a group of delivery results in one round trip and one
// transaction: removals of delivered rows, retry records, dead-letter moves.
// Each statement is fenced; the result says which lanes were still ours.
func (s *pgStore) writeOps(ctx context.Context, ops []op) opsResult {
	res := opsResult{ops: ops, valid: map[int16]bool{}}
	fences := map[int16]int64{}
	var ackLane, retryLane, deadLane []int16
	var ackID, retryID, deadID, clearRetry []int64
	var retryAtt, deadAtt []int32
	var retryAt []time.Time
	var retryErr, deadErr []string
	for _, o := range ops {
		fences[o.lane] = o.fence
		switch o.kind {
		case opAck:
			ackLane = append(ackLane, o.lane)
			ackID = append(ackID, o.m.ID)
			if o.m.attempts > 0 {
				clearRetry = append(clearRetry, o.m.ID)
			}
		case opRetry:
			retryLane = append(retryLane, o.lane)
			retryID = append(retryID, o.m.ID)
			retryAtt = append(retryAtt, int32(o.attempts))
			retryAt = append(retryAt, o.nextAt)
			retryErr = append(retryErr, truncate(o.err, 4096))
		case opDead:
			deadLane = append(deadLane, o.lane)
			deadID = append(deadID, o.m.ID)
			deadAtt = append(deadAtt, int32(o.attempts))
			deadErr = append(deadErr, truncate(o.err, 4096))
		}
	}
	lanes := make([]int16, 0, len(fences))
	fs := make([]int64, 0, len(fences))
	for l, f := range fences {
		lanes = append(lanes, l)
		fs = append(fs, f)
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(hotPathSettings)
	if len(ackID) > 0 {
		b.Queue(s.q.ack, lanes, fs, s.owner, ackLane, ackID, clearRetry)
	}
	if len(retryID) > 0 {
		b.Queue(s.q.retry, lanes, fs, s.owner, retryLane, retryID, retryAtt, retryAt, retryErr)
	}
	if len(deadID) > 0 {
		b.Queue(s.q.dead, lanes, fs, s.owner, deadLane, deadID, deadAtt, deadErr)
	}
	b.Queue("COMMIT")
	// One transaction, pipelined into one round trip.
	err := func() error {
		br := s.pool.SendBatch(ctx, b)
		for i := 0; i < 2; i++ {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return err
			}
		}
		for i := 2; i < b.Len()-1; i++ {
			rows, err := br.Query()
			if err != nil {
				br.Close()
				return err
			}
			for rows.Next() {
				var l int16
				if err := rows.Scan(&l); err != nil {
					rows.Close()
					br.Close()
					return err
				}
				res.valid[l] = true
			}
			if err := rows.Err(); err != nil {
				br.Close()
				return err
			}
		}
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	}()
	if err != nil {
		res.err = storeErr("write results", err)
	}
	return res
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func storeErr(what string, err error) error {
	if wharfmigrate.IsUndefinedTable(err) {
		return fmt.Errorf("wharf: %s: %w: %w", what, ErrNotMigrated, err)
	}
	return fmt.Errorf("wharf: %s: %w", what, err)
}

// ---- goroutines around the engine ----

func (r *relay) fetcher() {
	for req := range r.fetchReq {
		res := r.st.fetch(r.hardCtx, req)
		// run returns without reading this only on a hard stop, which
		// cancels hardCtx: never block on it then.
		select {
		case r.fetchRes <- res:
		case <-r.hardCtx.Done():
			return
		}
	}
}

func (r *relay) completer() {
	for ops := range r.opsReq {
		res := r.st.writeOps(r.hardCtx, ops)
		select {
		case r.opsRes <- res:
		case <-r.hardCtx.Done():
			return
		}
	}
}

type sinkBatch struct {
	msgs []*msg
	pub  []*Message
	errs []error
}

func (r *relay) sinkWorker() {
	for b := range r.sinkReq {
		b.errs = r.publish(b)
		r.sinkRes <- b // buffered for every worker: never blocks
	}
}

// publish calls the sink and normalises what it returns: a panic or a result
// slice of the wrong length fails the whole batch rather than the relay.
func (r *relay) publish(b *sinkBatch) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			errs = FailAll(len(b.pub), fmt.Errorf("wharf: sink panicked: %v", p))
		}
	}()
	errs = r.sink.Publish(r.hardCtx, b.pub)
	if errs != nil && len(errs) != len(b.pub) {
		errs = FailAll(len(b.pub), fmt.Errorf("wharf: sink returned %d results for %d messages", len(errs), len(b.pub)))
	}
	allOK := true
	for _, e := range errs {
		if e != nil {
			allOK = false
			break
		}
	}
	if allOK {
		return nil
	}
	return errs
}

// ---- readiness structures ----

type readyItem struct {
	kq  *keyQ // a key whose head may be delivered
	gen uint64
	m   *msg // or one unkeyed message
}

// retrying reports whether the item is a message (or a key whose head is a
// message) waiting for a retry, as opposed to one scheduled for later.
func (it readyItem) retrying() bool {
	if it.m != nil {
		return it.m.attempts > 0 && !it.m.lane.dropped
	}
	kq := it.kq
	return it.gen == kq.gen && len(kq.msgs) > 0 && kq.msgs[0].attempts > 0 && !kq.lane.dropped
}

type readyQueue []readyItem

type timerEntry struct {
	at time.Time
	it readyItem
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = timerEntry{}
	*h = old[:n-1]
	return e
}
