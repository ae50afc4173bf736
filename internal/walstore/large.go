package walstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wharfhq/wharf/internal/store"
)

// largeTx is a streamed transaction being moved to the outbox table while
// it streams: pgoutput sends a transaction whole, after its commit, and one
// larger than the store may hold must not be held whole (moveLarge).
type largeTx struct {
	tx      pgx.Tx         // the database transaction the messages are inserted in; nil: none moved yet
	lanes   map[int16]bool // the lanes of the messages inserted
	counted int            // rows[:counted] are counted in bytes
	bytes   int64          // what the rows not moved yet count for in Store.held
}

// moveLarge is called with the rows of the transaction being received so
// far. Once they count for a quarter of the budget (what the store reads
// ahead of the engine), they go to the outbox table, and so does every
// further row of the transaction: it returns the rows still to hold.
func (s *Store) moveLarge(ctx context.Context, lt *largeTx, rows []*walRow) ([]*walRow, error) {
	for _, r := range rows[lt.counted:] {
		lt.bytes += r.size()
	}
	lt.counted = len(rows)
	if lt.tx == nil && lt.bytes < max(1, s.budget/readAhead) {
		s.setReceiving(lt.bytes)
		return rows, nil
	}
	if err := s.insertLarge(ctx, lt, rows); err != nil {
		return nil, err
	}
	clear(rows) // the payloads can go
	lt.counted, lt.bytes = 0, 0
	s.setReceiving(0)
	return rows[:0], nil
}

// commitLarge is called at the commit of the transaction being received,
// before its rows are taken. A transaction moved to the outbox table is
// committed there: its last rows are inserted, the lanes' fences checked
// and the database transaction committed (with synchronous_commit on: the
// slot is confirmed past the transaction right after), and no row is left
// to hold.
func (s *Store) commitLarge(ctx context.Context, lt *largeTx, rows []*walRow) ([]*walRow, error) {
	defer func() {
		lt.counted, lt.bytes = 0, 0
		s.setReceiving(0)
	}()
	if lt.tx == nil {
		return rows, nil
	}
	if err := s.insertLarge(ctx, lt, rows); err != nil {
		return nil, err
	}
	s.mu.Lock()
	leases := s.leases
	s.mu.Unlock()
	var lanes []int16
	var fences []int64
	for lane := range lt.lanes {
		f, ok := leases[lane]
		if !ok {
			s.abortLarge(lt)
			return nil, fmt.Errorf("wharf: moving a large WAL transaction to the outbox table: lane %d is no longer this relay's", lane)
		}
		lanes, fences = append(lanes, lane), append(fences, f)
	}
	got := map[int16]bool{}
	q, err := lt.tx.Query(ctx, s.wq.fence, lanes, fences, s.owner)
	if err == nil {
		var l int16
		_, err = pgx.ForEachRow(q, []any{&l}, func() error { got[l] = true; return nil })
	}
	if err == nil && len(got) < len(lanes) {
		err = errors.New("a lane is no longer this relay's")
	}
	if err == nil {
		err = lt.tx.Commit(ctx)
	}
	if err != nil {
		s.abortLarge(lt)
		return nil, store.Wrap("move a large WAL transaction to the outbox table", err)
	}
	lt.tx, lt.lanes = nil, nil
	s.mu.Lock()
	s.tableRows = true
	s.tableWrites++
	s.mu.Unlock()
	s.log.Debug("wharf: moved a WAL transaction larger than a quarter of the memory budget to the outbox table")
	return nil, nil
}

// insertLarge inserts rows into the large transaction's database
// transaction, starting it first. The lanes' fences are checked at its
// commit only: no lane row stays locked while the transaction streams. A
// row whose id its lane already holds is left out: after a crash between
// that commit and the slot's confirmation, the transaction streams again.
func (s *Store) insertLarge(ctx context.Context, lt *largeTx, rows []*walRow) error {
	if len(rows) == 0 {
		return nil
	}
	if lt.tx == nil {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return store.Wrap("move a large WAL transaction to the outbox table", err)
		}
		lt.tx, lt.lanes = tx, map[int16]bool{}
		// The trigger that refuses rows in WAL mode lets these through.
		for _, set := range []string{`SET LOCAL wharf.spill = 'on'`, `SET LOCAL synchronous_commit = on`} {
			if _, err := tx.Exec(ctx, set); err != nil {
				s.abortLarge(lt)
				return store.Wrap("move a large WAL transaction to the outbox table", err)
			}
		}
	}
	a := newTableArgs(rows)
	if _, err := lt.tx.Exec(ctx, s.wq.moveLarge, a.lanes, a.ids, a.nonces, a.topics, a.keys, a.payloads, a.headers, a.deliverAt, a.created); err != nil {
		s.abortLarge(lt)
		return store.Wrap("move a large WAL transaction to the outbox table", err)
	}
	for _, r := range rows {
		lt.lanes[r.Lane] = true
	}
	return nil
}

// abortLarge rolls back the large transaction's inserts, if any: the stream
// ended before its commit, or the transaction is one already taken.
func (s *Store) abortLarge(lt *largeTx) {
	if lt.tx != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = lt.tx.Rollback(ctx)
		cancel()
	}
	lt.tx, lt.lanes, lt.counted, lt.bytes = nil, nil, 0, 0
	s.setReceiving(0)
}

// setReceiving records what the transaction being received counts for: it
// shows in the held bytes gauge.
func (s *Store) setReceiving(n int64) {
	s.mu.Lock()
	s.receiving = n
	s.gauges.HeldBytes.Store(s.held + n)
	s.mu.Unlock()
}

// dropTableCopiesLocked leaves out the streamed messages whose seqs the
// store saw as rows of the outbox table (after a crash, a spilled message
// whose transaction the slot was not confirmed past is streamed again): the
// table row is delivered, or was, and the stream's copy would only go out
// again, after newer messages of its key. The caller holds mu.
func (s *Store) dropTableCopiesLocked(rows []*walRow) []*walRow {
	if !s.tableRows {
		return rows
	}
	var out []*walRow // a copy: the caller's slice stays as it was
	for i, r := range rows {
		if _, known := s.lanes[r.Lane].table[r.Seq]; known {
			if out == nil {
				out = append(make([]*walRow, 0, len(rows)), rows[:i]...)
			}
			continue
		}
		if out != nil {
			out = append(out, r)
		}
	}
	if out == nil {
		return rows
	}
	return out
}

// tableArgs are rows as the columns of an insert into the outbox table.
type tableArgs struct {
	lanes         []int16
	ids, nonces   []int64
	topics        []string
	keys, headers []*string
	payloads      [][]byte
	deliverAt     []*time.Time
	created       []time.Time
}

func newTableArgs(rows []*walRow) tableArgs {
	n := len(rows)
	a := tableArgs{lanes: make([]int16, n), ids: make([]int64, n), nonces: make([]int64, n), topics: make([]string, n),
		keys: make([]*string, n), headers: make([]*string, n), payloads: make([][]byte, n), deliverAt: make([]*time.Time, n),
		created: make([]time.Time, n)}
	for i, r := range rows {
		a.lanes[i], a.ids[i], a.nonces[i], a.topics[i], a.payloads[i] = r.Lane, r.Seq, r.Nonce, r.Topic, r.Payload
		a.keys[i] = nonEmpty(r.Key)
		if len(r.Headers) > 0 {
			b, _ := json.Marshal(r.Headers)
			h := string(b)
			a.headers[i] = &h
		}
		if !r.DeliverAt.IsZero() {
			d := r.DeliverAt
			a.deliverAt[i] = &d
		}
		a.created[i] = r.CreatedAt
	}
	return a
}
