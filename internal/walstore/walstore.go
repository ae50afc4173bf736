package walstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/backoff"
	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/internal/tablestore"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Store is the outbox in WAL mode (wharfmigrate.SetWALMode; the relay
// picks it when the outbox's mode is WAL: newRelay). Producers write
// each enqueue call's messages as one transactional
// logical decoding message (internal/walmsg); the store streams them from a
// logical replication slot in commit order and keeps every message that is
// not settled in memory, where the engine's fetches, loads and refills read
// it. Nothing is deleted: the slot is confirmed up to the end of the longest
// run of streamed transactions whose messages are all settled
// (walstream.Progress). Leases, registration, retry records and dead letters
// stay in the tables (the embedded table store), fenced as in the table outbox;
// the relay holds every lane or none (Exclusive), and the slot itself admits
// one stream at a time.
//
// A message's Seq is its id's seq: a position inside the WAL record that
// carried it (walmsg.FirstSeq), growing in WAL order. Two transactions can
// commit in the other order than they wrote their records, so a message can
// reach the engine below its lane's cursor: the engine's late-commit rule,
// as for the table outbox's rows.
type Store struct {
	*tablestore.Store // leases, registration, retry records, dead letters, spilled rows
	pool              *pgxpool.Pool
	schema            string
	owner             string
	log               *slog.Logger
	now               func() time.Time
	slot              string
	publication       string
	prefix            string // the outbox's schema: the logical messages' prefix
	// budget bounds the payload bytes of the messages held in memory (plus
	// walRowOverhead each); past it the store stops reading the stream
	// (walstream.Conn.Hold), and the walsender waits. It also stops
	// reading while what it holds and has not handed to the engine reaches
	// a quarter of the budget (readAhead): a fetch asks for at most that
	// much, and reading further ahead only takes memory.
	budget int64

	mu       sync.Mutex
	lanes    [wharfmigrate.Lanes]walLane
	progress walstream.Progress
	held     int64 // bytes held: payloads plus walRowOverhead per message
	// receiving is what the transaction being received counts for so far
	// (largeTx): not in held until its commit, bounded by moveLarge.
	receiving int64
	leases    map[int16]int64 // the lanes this relay holds, with their fences
	queued    int64           // the part of held in the lanes' queues, not handed to the engine
	lastEnd   walstream.LSN   // end of the last transaction taken: a stream started again skips up to it
	// confirmed is the furthest position confirmed to the slot; the relay
	// writes it to <schema>.wal_progress (recordProgress), which outlives a
	// crash of PostgreSQL (the slot's own position is saved only at
	// checkpoints): a stream started later skips up to it too.
	confirmed walstream.LSN
	// The WAL history the held state belongs to (checkHistory): the
	// identity of the server the last stream started on, the highest WAL
	// end the server reported since (confirmLocked goes no further), and
	// the position this relay last wrote to wal_progress on it.
	sys       walstream.System
	serverEnd walstream.LSN
	recorded  walstream.LSN
	// rewound is set when the history changed: the next fetch tells the
	// engine (FetchResult.Rewound), which reads every lane again.
	rewound bool
	// doubt is set when the outbox table's transaction ids went back: the
	// next stream start treats the history as changed.
	doubt bool
	// endStream ends the running stream, for a start that checks the
	// history again.
	endStream context.CancelCauseFunc
	conn      *walstream.Conn
	err       error  // the stream's last failure, for the next fetch to report
	wake      func() // the engine's wake-up (set by listen)
	gauges    Gauges
	wq        walQ // the writes to the tables
	stopRun   context.CancelFunc
	runDone   chan struct{}
	// tableRows is set while the outbox table may hold spilled messages
	// (spill): fetches then read it too, through the embedded table store, from
	// tablePos.
	tableRows bool
	tablePos  store.Pos
	// tableWrites counts the store's inserts of new rows into the table
	// (moveLarge); a fetch that saw it change hands no memory row forward.
	tableWrites int64
	fetches     int64         // fetches started (tableNote)
	spillAfter  time.Duration // DefaultSpillAfter, unless a test shortens it
	// spilling holds the seqs a spill is writing to the table; a message
	// settled from memory meanwhile (delivered while the spill ran) is
	// noted as gone from the table (walLane.table) and its row deleted
	// again (staleOps, retried each round until it succeeds).
	spilling  map[int64]bool
	staleOps  []store.Op
	emptySeen bool // the table was empty at the last lease round
	// target is the WAL flush position when the stream started (or the
	// slot's confirmed position, if later); caughtUp is set once the
	// stream passed it: until then an empty fetch does not mean an empty
	// outbox (store.FetchResult.More), which Drain relies on.
	target   walstream.LSN
	caughtUp bool
	// afterWrite, if set (tests), runs in WriteResults between the writes
	// and the settling of the messages they wrote.
	afterWrite func()
}

// Gauges are the relay's metrics a WAL store keeps current: the bytes it
// holds in memory, and the slot's lag in bytes and in nanoseconds.
type Gauges struct {
	HeldBytes, LagBytes, Lag *atomic.Int64
	// SlotGone is set to 1 when the stream fails because the slot is
	// missing or lost (invalidated), and back to 0 once it streams (nil:
	// not kept).
	SlotGone *atomic.Int64
}

// Config is what a WAL store needs besides the table store it keeps its
// leases, retries and dead letters in.
type Config struct {
	Table   *tablestore.Store
	Pool    *pgxpool.Pool
	Schema  string // the outbox's schema: also the slot's, the publication's and the messages' prefix
	RelayID string
	Logger  *slog.Logger
	Now     func() time.Time
	// Budget bounds the payload bytes held in memory (Store.budget).
	Budget int64
	// SpillAfter is how long a message handed to the engine may stay
	// unsettled before it moves to the table; 0 means DefaultSpillAfter.
	SpillAfter time.Duration
	Gauges     Gauges
}

// New returns the WAL store of an outbox in WAL mode.
func New(c Config) *Store {
	if c.SpillAfter <= 0 {
		c.SpillAfter = DefaultSpillAfter
	}
	return &Store{Store: c.Table, pool: c.Pool, schema: c.Schema, owner: c.RelayID, log: c.Logger, now: c.Now,
		slot: c.Schema, publication: c.Schema, prefix: c.Schema, budget: c.Budget, gauges: c.Gauges,
		wq: walQueries(c.Schema), spillAfter: c.SpillAfter}
}

// walRowOverhead approximates a held message's memory besides its payload
// (measured: about 600 bytes with the engine's copy, 200-byte payloads).
const walRowOverhead = 512

// readAhead is the budget's share the store reads ahead of the engine's
// fetches: 1/readAhead.
const readAhead = 4

type walLane struct {
	fence int64             // the fence of the requests the lane's messages were handed out under
	rows  map[int64]*walRow // unsettled, by seq
	// table holds the seqs of the lane's messages that are, or were, rows
	// of the outbox table (spilled, or read from it): true while the row
	// is there (its results are the table outbox's: tablestore.Store.WriteResults),
	// false once it was settled. The engine knows every seq noted here, so
	// a fetch of the table hands none of them again as a new row (a
	// snapshot from before their move or their removal shows them as late
	// commits); only loads and refills, which the engine asks for, do.
	table map[int64]tableNote
	queue []*walRow // queue[head:]: not handed to the engine yet, by seq
	head  int
}

type walRow struct {
	store.Row
	tx      walstream.Tx
	settled bool
	queued  bool      // in its lane's queue, not handed to the engine (counted in Store.queued)
	handed  time.Time // when it was last handed to the engine
}

// size is what the row counts for in Store.held and queued.
func (r *walRow) size() int64 { return int64(len(r.Payload)) + walRowOverhead }

func (s *Store) Listen(ctx context.Context, wake func()) {
	s.mu.Lock()
	s.wake = wake
	s.mu.Unlock()
	<-ctx.Done()
}

// startStream starts the goroutine that streams the slot, unless it runs.
func (s *Store) startStream() {
	if s.stopRun != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopRun, s.runDone = cancel, make(chan struct{})
	go func() {
		defer close(s.runDone)
		s.run(ctx)
	}()
}

// stopStream ends the stream and forgets every message held: whoever streams
// the slot next starts from its confirmed position. Results of messages
// handed out before are ignored from here on (they arrive for rows that are
// gone), which stays within at least once.
func (s *Store) stopStream() {
	s.mu.Lock()
	cancel, done := s.stopRun, s.runDone
	s.stopRun, s.runDone = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetLocked()
	s.err = nil
}

// resetLocked forgets every message held.
func (s *Store) resetLocked() {
	for i := range s.lanes {
		s.lanes[i] = walLane{fence: -1} // hands everything out again, whatever the next fence
	}
	s.progress = walstream.Progress{}
	s.held, s.queued, s.lastEnd, s.caughtUp = 0, 0, 0, false
	s.tableRows, s.tablePos = false, nil
	s.gauges.HeldBytes.Store(0)
}

func (s *Store) ClaimAlone(ctx context.Context) ([]store.LaneLease, error) {
	got, err := s.Store.ClaimAlone(ctx)
	if err == nil && len(got) > 0 {
		s.mu.Lock()
		s.leases = make(map[int16]int64, len(got))
		for _, l := range got {
			s.leases[l.Lane] = l.Fence
		}
		s.startStream()
		s.mu.Unlock()
	}
	return got, err
}

func (s *Store) Claim(context.Context, int) ([]store.LaneLease, error) {
	return nil, errors.New("wharf: an outbox in WAL mode is streamed by one relay: lanes are claimed all at once (Exclusive)")
}

// LeaseRound stops the stream once the relay owns no lane: another relay
// may take the slot over. The relay that streams reads the slot's lag for
// the metrics too: in bytes, and in time as the age of the oldest commit it
// streamed and has not settled, on the database's clock (commit times are
// the server's); and records how far it confirmed (recordProgress).
func (s *Store) LeaseRound(ctx context.Context, ttl time.Duration) (store.LeaseRound, error) {
	lr, err := s.Store.LeaseRound(ctx, ttl)
	if err == nil && len(lr.Renewed) == 0 {
		s.stopStream()
		s.gauges.LagBytes.Store(0)
		s.gauges.Lag.Store(0)
	}
	if err == nil && len(lr.Renewed) > 0 {
		s.mu.Lock()
		oldest := s.progress.Oldest()
		s.leases = lr.Renewed
		s.mu.Unlock()
		var since pgtype.Timestamptz
		if !oldest.IsZero() {
			since = pgtype.Timestamptz{Time: oldest, Valid: true}
		}
		var bytes int64
		var age float64
		if s.pool.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn), 0)::bigint,
       coalesce(greatest(extract(epoch FROM now() - $2::timestamptz), 0), 0)::float8
FROM pg_replication_slots WHERE slot_name = $1`, s.slot, since).Scan(&bytes, &age) == nil {
			s.gauges.LagBytes.Store(bytes)
			s.gauges.Lag.Store(int64(age * float64(time.Second)))
		}
		if err := s.spill(ctx, lr.Renewed); err != nil {
			s.log.Warn("wharf: moving held WAL messages to the outbox table failed; they stay in memory", "err", err)
		}
		s.tableRound(ctx)
		if err := s.recordProgress(ctx, oldest); err != nil {
			s.log.Warn("wharf: recording the settled WAL position failed; a crash of PostgreSQL would deliver more again", "err", err)
		}
	}
	return lr, err
}

// tableRound looks at the outbox table once a lease round. Rows that
// appeared while the store read no table (dead letters retried) make the
// fetches read it from now on. The table empty at two rounds in a row, once
// the stream caught up with the WAL end it started at: every fetch that
// could have read a row from it has been merged, and no message streamed
// again after a crash can still be a copy of one of its rows, so the notes
// can go.
func (s *Store) tableRound(ctx context.Context) {
	var there bool
	if s.pool.QueryRow(ctx, s.wq.tableRows).Scan(&there) != nil {
		return // tried again at the next round
	}
	s.mu.Lock()
	var wake func()
	switch {
	case there && !s.tableRows:
		s.tableRows = true
		wake = s.wake
	case !there && s.tableRows && s.emptySeen && s.caughtUp && len(s.staleOps) == 0:
		s.tableRows = false
		for i := range s.lanes {
			s.lanes[i].table = nil
		}
	}
	s.emptySeen = !there
	s.mu.Unlock()
	if wake != nil {
		wake()
	}
}

func (s *Store) ReleaseAll(ctx context.Context, lanes []int16) error {
	s.stopAndRecord(ctx)
	return s.Store.ReleaseAll(ctx, lanes)
}

func (s *Store) Release(ctx context.Context, rel store.LaneRelease) error {
	s.stopAndRecord(ctx)
	return s.Store.Release(ctx, rel)
}

func (s *Store) Unregister(ctx context.Context) error {
	s.stopAndRecord(ctx)
	return s.Store.Unregister(ctx)
}

// stopAndRecord stops the stream and records how far it was settled, for
// whoever streams next. A relay that was not streaming (a standby) records
// nothing: another relay may be streaming.
func (s *Store) stopAndRecord(ctx context.Context) {
	s.mu.Lock()
	streaming := s.stopRun != nil
	s.mu.Unlock()
	s.stopStream()
	if !streaming {
		return
	}
	if err := s.recordProgress(ctx, time.Time{}); err != nil {
		s.log.Warn("wharf: recording the settled WAL position failed; a crash of PostgreSQL would deliver more again", "err", err)
	}
}

// run streams the slot until ctx ends, starting again after a failure.
func (s *Store) run(ctx context.Context) {
	retry := backoff.State{}
	for ctx.Err() == nil {
		began := time.Now()
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 10*time.Second {
			retry.OK() // it streamed: start the backoff over
		}
		d := retry.Fail(time.Now())
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, walstream.ErrSlotMissing):
			// Producers' enqueue_wal refuses while the slot is missing, so
			// nothing is committed meanwhile; what was committed before it
			// went and was not delivered is lost.
			s.setSlotGone(1)
			err = fmt.Errorf("%w (enqueueing is refused until it exists: run `wharf migrate up --mode wal --schema %s`, which creates it again; messages committed before the slot went and not yet delivered are lost)", err, s.schema)
		case errors.As(err, &pgErr) && pgErr.Code == "42704":
			err = fmt.Errorf("%w (run `wharf migrate up --mode wal --schema %s`, which creates the publication and the slot again)", err, s.schema)
		case errors.Is(err, walstream.ErrSlotInvalidated):
			s.setSlotGone(1)
			err = fmt.Errorf("%w; enqueueing is refused while it is lost: run `wharf migrate up --mode wal --schema %s`, which drops the lost slot and creates it again", err, s.schema)
		case errors.Is(err, walstream.ErrSlotActive):
			// The relay that held the lanes before has not closed its
			// stream yet: a takeover, not a failure.
			s.log.Warn("wharf: the replication slot is still streamed by another connection; waiting for it to close", "slot", s.slot, "retry_in", d.Round(time.Millisecond))
		}
		if !errors.Is(err, walstream.ErrSlotActive) {
			s.log.Error("wharf: WAL stream failed; starting it again", "slot", s.slot, "err", err, "retry_in", d.Round(time.Millisecond))
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

// stream reads the slot from its confirmed position. Transactions that end
// at or before the last one taken are already held (or settled): a stream
// started again after a failure skips them, so they are not delivered twice.
func (s *Store) stream(ctx context.Context) (err error) {
	ctx, end := context.WithCancelCause(ctx)
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, errOtherHistory) {
			err = cause // ended by endStream
		}
		end(nil)
	}()
	conn, err := walstream.ConnectConfig(ctx, &s.pool.Config().ConnConfig.Config, walstream.Options{Prefix: s.prefix, StatusInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	defer func() {
		s.mu.Lock()
		s.conn, s.endStream = nil, nil
		s.mu.Unlock()
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
	}()
	w, err := s.walEnd(ctx)
	if err != nil {
		return err
	}
	sys, err := conn.Identify(ctx)
	if err != nil {
		return err
	}
	if err := conn.Start(ctx, s.slot, s.publication, 0); err != nil {
		return err
	}
	settled, err := s.checkHistory(ctx, sys, w)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.tableRows = s.tableRows || w.tableRows
	s.target = w.end
	s.lastEnd = max(s.lastEnd, settled)
	s.caughtUp = s.caughtUp || w.end <= w.confirmed || w.end <= s.lastEnd
	s.conn, s.endStream = conn, end
	s.confirmLocked(max(s.progress.Confirmable(), settled))
	s.mu.Unlock()

	var (
		begin walstream.Begin
		inTx  bool
		rows  []*walRow
		bad   []badContent
		// msgs are the transaction's decoded contents, origin[i] the one
		// rows[i] came from: a content whose record the store refuses at
		// take is dead-lettered whole.
		msgs   []walstream.Message
		origin []int
		large  largeTx
	)
	defer s.abortLarge(&large)
	for {
		if s.full() {
			if err := conn.Hold(ctx, 20*time.Millisecond); err != nil {
				return err
			}
			continue
		}
		ev, err := conn.Receive(ctx)
		if err != nil {
			return err
		}
		switch ev := ev.(type) {
		case walstream.Begin:
			s.setSlotGone(0)
			// The slices are reused from one transaction to the next (take
			// and the large-transaction path keep the rows, never the
			// slice): with one message per transaction, three allocations
			// a message less.
			clear(rows)
			clear(msgs)
			begin, inTx, rows, bad, msgs, origin = ev, true, rows[:0], nil, msgs[:0], origin[:0]
			s.abortLarge(&large)
		case walstream.Message:
			if !ev.Transactional {
				continue // not an outbox message: producers write transactional ones
			}
			recs, err := walmsg.Decode(ev.Content)
			if err != nil {
				bad = append(bad, badContent{lsn: ev.LSN, content: ev.Content, err: err, topic: topicUndecodable})
				continue
			}
			// A seq is where the record carrying the message ends in the
			// WAL, which the relay reads itself: a content that names one,
			// or that Wharf's enqueue could not have written, is refused
			// whole and kept as a dead letter.
			if err := checkRecords(recs); err != nil {
				bad = append(bad, badContent{lsn: ev.LSN, content: ev.Content, err: err, topic: topicMalformed})
				continue
			}
			first := walmsg.FirstSeq(uint64(ev.LSN), len(recs))
			for i := range recs {
				rows = append(rows, newWALRow(&recs[i], first+int64(i), begin.CommitTime))
				origin = append(origin, len(msgs))
			}
			msgs = append(msgs, ev)
			if rows, err = s.moveLarge(ctx, &large, rows); err != nil {
				return err
			}
			if len(rows) == 0 {
				// Moved to the table: neither the rows nor the contents
				// they came from stay in memory (keeping the contents
				// would hold the whole transaction after all).
				origin, msgs = origin[:0], nil
			}
		case walstream.Commit:
			inTx = false
			if ev.EndLSN <= s.lastEndLocked() {
				s.abortLarge(&large)
				continue
			}
			if rows, err = s.commitLarge(ctx, &large, rows); err != nil {
				return err
			}
			if len(rows) == 0 {
				origin, msgs = origin[:0], nil // moved to the table
			}
			for {
				if len(bad) > 0 {
					if err := s.deadLetterContents(ctx, bad, begin.CommitTime); err != nil {
						return err
					}
					bad = nil
				}
				held, err := s.take(ev.EndLSN, begin.CommitTime, rows)
				if err != nil {
					return err
				}
				if len(held) == 0 {
					break
				}
				// take took nothing: the contents of the refused rows go to
				// the dead letters first, then the rest is taken.
				rows, origin, bad = refuseContents(rows, origin, msgs, held)
			}
		case walstream.Keepalive:
			s.setSlotGone(0)
			s.keepalive(ev, inTx, conn.ServerWALEnd())
		}
	}
}

// setSlotGone sets the SlotGone gauge, when it is kept.
func (s *Store) setSlotGone(v int64) {
	if s.gauges.SlotGone != nil {
		s.gauges.SlotGone.Store(v)
	}
}

// keepalive notes a keepalive received outside a transaction (inTx unset):
// the stream has caught up once it reaches the target, and with nothing
// held the slot is confirmed up to it.
func (s *Store) keepalive(ev walstream.Keepalive, inTx bool, serverEnd walstream.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serverEnd = max(s.serverEnd, ev.WALEnd, serverEnd)
	if !inTx && ev.WALEnd >= s.target {
		s.caughtUp = true
	}
	if !inTx && s.progress.Pending() == 0 {
		// Nothing held: WAL up to here holds nothing of this outbox
		// that is not settled, and other writes keep adding WAL the
		// slot would otherwise retain.
		s.confirmLocked(ev.WALEnd)
	}
}

// DefaultSpillAfter is how long a message handed to the engine may stay
// unsettled before it is moved to the outbox table (spill): a message
// scheduled for later, or waiting behind its key's failing message.
const DefaultSpillAfter = 5 * time.Second

// spill moves the messages handed to the engine at least DefaultSpillAfter ago
// and still unsettled (held: scheduled, or behind a failing message of
// their key) to the outbox table, which a WAL outbox has and otherwise
// leaves empty, as ordinary rows with their ids: written fenced in lanes
// the relay still holds (fences), they settle in the stream's progress (the
// slot is confirmed past them, and the WAL behind them is released) and
// leave memory. From then on they are the table outbox's rows: fetched,
// loaded, acknowledged and dead-lettered by the embedded table store.
func (s *Store) spill(ctx context.Context, fences map[int16]int64) error {
	if err := s.deleteStale(ctx); err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	var rows []*walRow
	for lane := range s.lanes {
		for _, r := range s.lanes[lane].rows {
			if !r.queued && !r.settled && !r.handed.IsZero() && now.Sub(r.handed) >= s.spillAfter {
				rows = append(rows, r)
			}
		}
	}
	if len(rows) > 0 {
		s.spilling = make(map[int64]bool, len(rows))
		for _, r := range rows {
			s.spilling[r.Seq] = true
		}
	}
	s.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	defer func() {
		s.mu.Lock()
		s.spilling = nil
		s.mu.Unlock()
	}()
	var lanes []int16
	var lf []int64
	for lane, fence := range fences {
		lanes, lf = append(lanes, lane), append(lf, fence)
	}
	n := len(rows)
	rl, ids, nonces := make([]int16, n), make([]int64, n), make([]int64, n)
	topics, payloads := make([]string, n), make([][]byte, n)
	keys, headers := make([]*string, n), make([]*string, n)
	deliverAt, created := make([]*time.Time, n), make([]time.Time, n)
	for i, r := range rows {
		rl[i], ids[i], nonces[i], topics[i], payloads[i] = r.Lane, r.Seq, r.Nonce, r.Topic, r.Payload
		keys[i] = nonEmpty(r.Key)
		if len(r.Headers) > 0 {
			b, _ := json.Marshal(r.Headers)
			h := string(b)
			headers[i] = &h
		}
		if !r.DeliverAt.IsZero() {
			d := r.DeliverAt
			deliverAt[i] = &d
		}
		created[i] = r.CreatedAt
	}
	type pos struct {
		lane int16
		seq  int64
	}
	var moved []pos
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The trigger that refuses rows in WAL mode lets these through.
		if _, err := tx.Exec(ctx, `SET LOCAL wharf.spill = 'on'`); err != nil {
			return err
		}
		// The slot is confirmed past these messages once this commits.
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		q, err := tx.Query(ctx, s.wq.spill, lanes, lf, s.owner, rl, ids, nonces, topics, keys, payloads, headers, deliverAt, created)
		if err != nil {
			return err
		}
		var p pos
		_, err = pgx.ForEachRow(q, []any{&p.lane, &p.seq}, func() error {
			moved = append(moved, p)
			return nil
		})
		return err
	})
	if err != nil {
		return store.Wrap("move held WAL messages to the outbox table", err)
	}
	s.mu.Lock()
	for _, p := range moved {
		l := &s.lanes[p.lane]
		r := l.rows[p.seq]
		if r == nil {
			// Settled while it was being written (delivered, or
			// dead-lettered from memory): the row must go again, and
			// fetches of the table drop it until then.
			s.noteGoing(l, p.seq)
			s.staleOps = append(s.staleOps, store.Op{Kind: store.OpAck, Lane: p.lane, Fence: fences[p.lane], Seq: p.seq, Nonce: nonceOf(rows, p.seq)})
			continue
		}
		s.noteTable(l, p.seq, true)
		delete(l.rows, p.seq)
		r.settled = true
		s.held -= r.size()
		if err := s.progress.Settle(r.tx); err != nil {
			s.log.Error("wharf: settling a WAL message failed (a bug)", "err", err)
		}
	}
	s.tableRows = s.tableRows || len(moved) > 0
	s.confirmLocked(s.progress.Confirmable())
	s.gauges.HeldBytes.Store(s.held)
	s.mu.Unlock()
	s.log.Debug("wharf: moved held WAL messages to the outbox table", "messages", len(moved))
	return s.deleteStale(ctx)
}

// deleteStale writes the results of messages that became table rows while
// they were settled from memory: the table rows a spill wrote for messages
// settled meanwhile (acknowledgements, fenced), and results routed to memory
// for messages a spill moved meanwhile (acknowledgements and dead-letter
// moves); walLane.table keeps fetches from handing them out until then. What
// fails is tried again at the next round.
func (s *Store) deleteStale(ctx context.Context) error {
	s.mu.Lock()
	ops := s.staleOps
	s.staleOps = nil
	s.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	// A lane lost meanwhile keeps its row: its next owner delivers it
	// again (at least once).
	w := s.Store.WriteResults(ctx, ops)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Err != nil {
		s.staleOps = append(s.staleOps, ops...)
		return w.Err
	}
	for _, o := range ops {
		if l := &s.lanes[o.Lane]; w.Valid[o.Lane] && l.table[o.Seq].fetches == math.MaxInt64 {
			s.noteTable(l, o.Seq, false) // removed: a fetch that starts from now on does not see it
		}
	}
	return nil
}

// confirmLocked confirms the slot up to lsn (never back), and never past
// the WAL end the server reported on the stream (at its start, in its
// keepalives, or as a transaction's end): PostgreSQL accepts a confirmation
// past its WAL end, and the slot would then skip what commits there later.
func (s *Store) confirmLocked(lsn walstream.LSN) {
	limit := max(s.serverEnd, s.lastEnd)
	s.confirmed = max(s.confirmed, min(lsn, limit))
	if s.conn != nil {
		s.conn.Confirm(min(s.confirmed, limit))
	}
}

// recordProgress writes the furthest position confirmed to wal_progress,
// and the commit time of the oldest message held unsettled (zero: none, or
// the stream stopped) for status. The write needs no fence: a position any
// relay confirmed is settled, and the position only grows. It writes only
// where the row names the WAL history of the relay's stream (checkHistory
// stamped it) and only a position at or below the server's WAL insert
// position: a write refused means the database is on another history than
// the stream, which ends so that its next start checks it.
func (s *Store) recordProgress(ctx context.Context, oldest time.Time) error {
	s.mu.Lock()
	lsn, sys := s.confirmed, s.sys
	s.mu.Unlock()
	if sys.ID == 0 {
		return nil // no stream started yet: nothing confirmed
	}
	var at pgtype.Timestamptz
	if !oldest.IsZero() {
		at = pgtype.Timestamptz{Time: oldest, Valid: true}
	}
	// Durable before it counts as written (recorded): a stream start that
	// finds the row below it takes the history as changed.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = on")
	update := b.Queue(s.wq.recordProgress, lsn.String(), at, int64(sys.ID), sys.Timeline)
	b.Queue("COMMIT")
	var tag pgconn.CommandTag
	update.Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.Wrap("record the settled WAL position", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if tag.RowsAffected() == 1 {
		if sameHistory(s.sys, sys) {
			s.recorded = max(s.recorded, lsn)
		}
		return nil
	}
	if sameHistory(s.sys, sys) && s.endStream != nil {
		s.log.Warn("wharf: wal_progress refused the settled WAL position: the database is not on the WAL history the relay streams (failover, restore); starting the stream again",
			"position", lsn.String(), "system_identifier", sys.ID, "timeline", sys.Timeline)
		s.endStream(errOtherHistory)
	}
	return nil
}

// sameHistory reports whether a and b name one WAL history: the same
// cluster and timeline.
func sameHistory(a, b walstream.System) bool { return a.ID == b.ID && a.Timeline == b.Timeline }

var errOtherHistory = errors.New("wharf: the database is not on the WAL history the relay streamed (failover or restore); starting the stream again")

// checkHistory compares what a stream start read (w, then the server's
// identity) with what the store remembers of the streams before, and
// returns the recorded settled position the stream may skip up to (0 when
// it may not use it). A position names a place in one WAL history: after a
// failover to a standby that lost commits, a point-in-time restore or a copy
// of the data directory put back, new commits reuse positions the relay
// streamed before, and a dump restored on another server brings another
// cluster's position along. When the history changed, the store forgets
// what it holds and its positions (the stream starts from the slot's
// confirmed position) and the next fetch tells the engine to read every
// lane again. A recorded position of another history is not used, and the
// row is written again with this one's identity. The caller holds the slot
// (the stream started), so no other relay writes the row meanwhile.
func (s *Store) checkHistory(ctx context.Context, sys walstream.System, w walStart) (walstream.LSN, error) {
	if w.confirmed > w.end {
		s.log.Error("wharf: the replication slot is confirmed past the server's WAL end: PostgreSQL skips every transaction that commits below that position; create the slot again (see the README, WAL mode)",
			"slot", s.slot, "confirmed", w.confirmed.String(), "wal_end", w.end.String())
	}
	stamped := w.sysID != nil && w.timeline != nil && uint64(*w.sysID) == sys.ID && *w.timeline == sys.Timeline
	s.mu.Lock()
	var changed string
	switch {
	case s.sys.ID != 0 && !sameHistory(s.sys, sys):
		changed = fmt.Sprintf("the server's system identifier and timeline are %d/%d, the previous stream's were %d/%d (failover, point-in-time restore, or another server)",
			sys.ID, sys.Timeline, s.sys.ID, s.sys.Timeline)
	case sys.WALEnd < max(s.lastEnd, s.confirmed):
		changed = fmt.Sprintf("the server's WAL ends at %s, below %s that this relay streamed (a restore, or a failover to a standby that lost commits)",
			sys.WALEnd, max(s.lastEnd, s.confirmed))
	case (stamped || w.sysID == nil) && w.settled < w.recorded:
		// This relay wrote w.recorded there, with the cluster's identity:
		// a lower position, or a row without the identity (a copy taken
		// before the first stamp), is the row of an earlier state. The WAL
		// end cannot tell when the new history has already written past
		// what this relay streamed before it reconnected.
		changed = fmt.Sprintf("wal_progress went back from %s, which this relay wrote, to %s (a restore)", w.recorded, w.settled)
	case s.doubt:
		changed = "the outbox table's transaction ids went back (a restore, or a failover to a standby that lost commits)"
	}
	if changed != "" {
		s.log.Warn("wharf: the database's WAL history changed: forgetting every held message, streaming again from the replication slot's position and reading every lane again",
			"why", changed)
		s.resetLocked()
		s.confirmed, s.recorded, s.serverEnd = 0, 0, 0
		s.rewound, s.doubt = true, false
		// Deletes of rows the old history spilled could hit the new one's.
		s.staleOps = nil
		if s.wake != nil {
			defer s.wake() // after the unlock below
		}
	}
	var ignored string
	switch {
	case changed != "":
		ignored = "the WAL history changed"
	case w.sysID == nil || w.timeline == nil:
		ignored = "it was recorded without the cluster's identity (by an earlier build)"
	case uint64(*w.sysID) != sys.ID:
		ignored = fmt.Sprintf("it was recorded on another cluster (system identifier %d; this server's is %d)", uint64(*w.sysID), sys.ID)
	case *w.timeline != sys.Timeline:
		ignored = fmt.Sprintf("it was recorded on timeline %d; the server is on timeline %d", *w.timeline, sys.Timeline)
	case w.settled > w.end:
		ignored = fmt.Sprintf("it is past the server's WAL insert position %s", w.end)
	}
	s.mu.Unlock()
	settled := w.settled
	if ignored != "" {
		// From the slot's position, which this history has.
		settled = min(w.confirmed, w.end)
		if w.settled != 0 && changed == "" { // a change was logged above
			s.log.Warn("wharf: wal_progress is not used to skip transactions: "+ignored+"; writing it again",
				"settled", w.settled.String(), "slot_confirmed", w.confirmed.String(), "wal_end", w.end.String())
		}
	}
	if ignored != "" || !stamped {
		tag, err := s.pool.Exec(ctx, s.wq.stampProgress, settled.String(), int64(sys.ID), sys.Timeline)
		if err != nil {
			return 0, store.Wrap("write the settled WAL position again", err)
		}
		if tag.RowsAffected() != 1 {
			return 0, fmt.Errorf("wharf: outbox %s: wal_progress has no row: run `wharf migrate up --mode wal` again to add it", s.schema)
		}
	}
	s.mu.Lock()
	if !sameHistory(s.sys, sys) {
		s.serverEnd, s.recorded = 0, 0
	}
	s.sys = sys
	s.serverEnd = max(s.serverEnd, sys.WALEnd)
	s.recorded = max(s.recorded, settled)
	s.mu.Unlock()
	if ignored != "" {
		return 0, nil // the slot's own position: nothing to skip past it
	}
	return settled, nil
}

// walStart is what a stream start reads from the database (walEnd).
type walStart struct {
	end       walstream.LSN // the WAL insert position: every commit so far ends at or before it
	confirmed walstream.LSN // the slot's confirmed position
	settled   walstream.LSN // the position recorded in wal_progress
	// The identity of the WAL history settled was recorded on (NULL: by an
	// earlier build).
	sysID     *int64
	timeline  *int32
	tableRows bool // the outbox table holds rows (moved there by a spill)
	// recorded is the position this relay had written to wal_progress, and
	// seen committed, before the row was read: the row holds at least that
	// on the same history. (A lease round's write that commits while a
	// stream start reads the row is newer than what the start read, not a
	// sign of a restore.)
	recorded walstream.LSN
}

// walEnd reads the WAL end now, the slot's confirmed position, the row of
// wal_progress, and whether the outbox table holds rows. The stream sends
// only flushed WAL, and commits made with synchronous_commit off, and what
// follows them, can wait unflushed on an idle server, so the WAL end is read
// in a transaction that writes (the row, unchanged) and commits with
// synchronous_commit on: its commit flushes everything before it, and the
// server's flushed WAL end (walstream.Conn.Identify) is past w.end from
// then on.
func (s *Store) walEnd(ctx context.Context) (walStart, error) {
	var w walStart
	s.mu.Lock()
	w.recorded = s.recorded
	s.mu.Unlock()
	var e, c, st string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, s.wq.walEnd, s.slot).Scan(&e, &c, &st, &w.sysID, &w.timeline, &w.tableRows)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return w, fmt.Errorf("wharf: replication slot %q: %w", s.slot, walstream.ErrSlotMissing)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return w, fmt.Errorf("wharf: outbox %s has no wal_progress table (WAL mode from an earlier build): run `wharf migrate up --mode wal` again to add it", s.schema)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42703" {
		return w, fmt.Errorf("wharf: outbox %s has a wal_progress table without the WAL history columns (WAL mode from an earlier build): run `wharf migrate up --mode wal` again to add them", s.schema)
	}
	if err != nil {
		return w, store.Wrap("read the WAL end", err)
	}
	var err1, err2, err3 error
	w.end, err1 = walstream.ParseLSN(e)
	w.confirmed, err2 = walstream.ParseLSN(c)
	w.settled, err3 = walstream.ParseLSN(st)
	return w, errors.Join(err1, err2, err3)
}

func (s *Store) lastEndLocked() walstream.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastEnd
}

func (s *Store) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held >= s.budget || s.queued >= s.budget/readAhead
}

// newWALRow is the row of a checked record (checkRecords) whose seq the
// store computed from its WAL position (always positive): its lane is its
// key's, or the seq's for an unkeyed message, in [0, Lanes) either way.
func newWALRow(rec *walmsg.Record, seq int64, committed time.Time) *walRow {
	lane := int16(uint64(seq) % wharfmigrate.Lanes)
	if rec.Key != "" {
		lane = walmsg.Lane(rec.Key)
	}
	return &walRow{Row: store.Row{Lane: lane, Seq: seq, Nonce: rec.Nonce, Topic: rec.Topic, Key: rec.Key,
		Headers: rec.Headers, DeliverAt: rec.DeliverAt, Payload: rec.Payload, CreatedAt: committed,
	}}
}

// Topics of the dead letters the stream makes of the logical messages it
// cannot deliver.
const (
	// topicUndecodable: the content is not in Wharf's format (walmsg).
	topicUndecodable = "wharf.undecodable"
	// topicMalformed: the content decodes, but Wharf's enqueue could not
	// have written it (checkRecords), or it names a seq the store holds.
	topicMalformed = "wharf.malformed"
)

// maxNonce bounds a message id's random part (62 bits).
const maxNonce = 1<<62 - 1

// checkRecords refuses what Wharf's enqueue functions never write: a seq
// (the relay assigns every seq from the WAL position, so a content naming
// one was written around the enqueue API), an empty topic, text PostgreSQL
// could not store (the relay writes messages to its tables: retries, dead
// letters, spilled rows) and a nonce outside its 62 bits.
func checkRecords(recs []walmsg.Record) error {
	text := func(v string) bool { return utf8.ValidString(v) && strings.IndexByte(v, 0) < 0 }
	for i := range recs {
		r := &recs[i]
		var why string
		switch {
		case r.Seq != 0:
			why = fmt.Sprintf("carries seq %d, but a seq is assigned by the relay from the message's WAL position: this content was not written by Wharf's enqueue", r.Seq)
		case r.Nonce < 0 || r.Nonce > maxNonce:
			why = fmt.Sprintf("has nonce %d, outside the 62 bits of an id", r.Nonce)
		case r.Topic == "":
			why = "has no topic"
		case !text(r.Topic):
			why = "has a topic that is not valid UTF-8 without NUL bytes"
		case !text(r.Key):
			why = "has a key that is not valid UTF-8 without NUL bytes"
		}
		for k, v := range r.Headers {
			if why == "" && (!text(k) || !text(v)) {
				why = "has a header that is not valid UTF-8 without NUL bytes"
			}
		}
		if why != "" {
			return fmt.Errorf("message %d of %d %s", i+1, len(recs), why)
		}
	}
	return nil
}

// refuseContents moves the contents of the refused rows (take's held seqs:
// seqs the store already holds) out of rows and into the dead letters: none
// of such a content is delivered.
func refuseContents(rows []*walRow, from []int, msgs []walstream.Message, held []int64) ([]*walRow, []int, []badContent) {
	refused := map[int]int64{}
	for i, r := range rows {
		if slices.Contains(held, r.Seq) {
			if _, ok := refused[from[i]]; !ok {
				refused[from[i]] = r.Seq
			}
		}
	}
	var bad []badContent
	var keep []*walRow
	var keepFrom []int
	for i, r := range rows {
		if seq, ok := refused[from[i]]; ok {
			if r.Seq == seq {
				m := msgs[from[i]]
				bad = append(bad, badContent{lsn: m.LSN, content: m.Content, topic: topicMalformed,
					err: fmt.Errorf("its message at seq %d would replace a message the relay holds with that seq", seq)})
			}
			continue
		}
		keep, keepFrom = append(keep, r), append(keepFrom, from[i])
	}
	return keep, keepFrom, bad
}

// take adds a committed transaction's messages and wakes the engine. A
// message whose seq the store already holds in its lane never replaces it:
// take then takes nothing and returns the seqs it refused, for the caller
// to dead-letter their contents and take the rest.
func (s *Store) take(end walstream.LSN, committed time.Time, rows []*walRow) ([]int64, error) {
	held, wake, err := s.takeLocked(end, committed, rows)
	if wake != nil {
		wake()
	}
	return held, err
}

// takeLocked is take under s.mu (released however it returns); it returns
// the engine's wake-up to call once the lock is released.
func (s *Store) takeLocked(end walstream.LSN, committed time.Time, rows []*walRow) (held []int64, wake func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rows {
		if r.Lane < 0 || int(r.Lane) >= len(s.lanes) || r.Seq <= 0 {
			// newWALRow never makes one; a bug, refused like a held seq.
			held = append(held, r.Seq)
			continue
		}
		if _, ok := s.lanes[r.Lane].rows[r.Seq]; ok {
			held = append(held, r.Seq)
		}
	}
	if len(held) > 0 {
		return held, nil, nil
	}
	rows = s.dropTableCopiesLocked(rows)
	tx, err := s.progress.Add(end, committed, len(rows))
	if err != nil {
		// The stream is in commit order and ends only grow, so this is a
		// bug. Forget everything held and stream again from the slot's
		// confirmed position: what was held is delivered again (at least
		// once), nothing is skipped.
		s.resetLocked()
		return nil, nil, fmt.Errorf("wharf: WAL stream out of order (a bug; streaming again from the slot's confirmed position): %w", err)
	}
	s.lastEnd = end
	if end >= s.target {
		s.caughtUp = true
	}
	for _, r := range rows {
		r.tx = tx
		l := &s.lanes[r.Lane]
		if l.rows == nil {
			l.rows = map[int64]*walRow{}
		}
		l.rows[r.Seq] = r
		s.held += r.size()
		s.queued += r.size()
		r.queued = true
		// Messages arrive in commit order; their seqs are in WAL order, so
		// a late one goes before the tail of what was not handed out yet.
		i := len(l.queue)
		for i > l.head && l.queue[i-1].Seq > r.Seq {
			i--
		}
		l.queue = slices.Insert(l.queue, i, r)
	}
	if len(rows) == 0 && s.conn != nil {
		s.confirmLocked(s.progress.Confirmable())
	}
	s.gauges.HeldBytes.Store(s.held)
	if len(rows) > 0 {
		wake = s.wake
	}
	return nil, wake, nil
}

type badContent struct {
	lsn     walstream.LSN
	content []byte
	err     error
	topic   string // topicUndecodable or topicMalformed
}

// deadLetterContents keeps a logical message of the outbox's prefix that is
// not a Wharf content (written around the enqueue API, or by a newer
// format): it cannot be delivered, and dropping it would lose it, so it
// becomes a dead letter of topic wharf.undecodable with the raw content as
// its payload.
func (s *Store) deadLetterContents(ctx context.Context, bad []badContent, committed time.Time) error {
	b := &pgx.Batch{}
	for _, c := range bad {
		seq := int64(c.lsn) - 1
		s.log.Error("wharf: a logical message of the outbox's prefix is not one Wharf's enqueue writes; moved to the dead letters, nothing of it delivered", "lsn", c.lsn.String(), "topic", c.topic, "err", c.err)
		topic := c.topic
		if topic == "" {
			topic = topicUndecodable
		}
		b.Queue(`INSERT INTO `+s.schema+`.dead_letters (id, nonce, topic, payload, created_at, attempts, last_error)
VALUES ($1, 0, $5, $2, $3, 0, $4) ON CONFLICT (id) DO NOTHING`, seq, c.content, committed, "at WAL position "+c.lsn.String()+": "+c.err.Error(), topic)
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.Wrap("move an undecodable WAL message to the dead letters", err)
	}
	return nil
}

// Fetch hands out, per lane asked, the messages not handed out yet: every one
// at or below the lane's cursor (late commits), then the next ones above it
// up to the lane's limit and byte share. Loads and refills read the held
// messages. Nothing here waits for the database, unless the outbox table may
// hold rows.
func (s *Store) Fetch(ctx context.Context, req store.FetchRequest) (res store.FetchResult) {
	res = store.FetchResult{Req: req, Started: s.now()}
	defer func() { res.Finished = s.now() }()
	// Spilled messages are rows of the outbox table: while there may be
	// some, the table outbox's fetch reads them too (forward, late, loads
	// and refills), first, and the memory's rows are merged with its.
	s.mu.Lock()
	s.fetches++
	useTable, pos, writes, fetch := s.tableRows, s.tablePos, s.tableWrites, s.fetches
	s.mu.Unlock()
	var table store.FetchResult
	if useTable {
		treq := req
		treq.Pos = pos
		if table = s.Store.Fetch(ctx, treq); table.Err != nil {
			res.Err = table.Err
			return res
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rewound || table.Rewound {
		s.rewindLocked(table.Rewound)
		res.Rewound = true
		return res
	}
	if useTable {
		s.tablePos = table.Pos
		res.DBNow = table.DBNow
	}
	if s.err != nil {
		res.Err, s.err = store.Wrap("stream the WAL", s.err), nil
		return res
	}
	res.More = !s.caughtUp
	for i, lane := range req.Lanes {
		l := &s.lanes[lane]
		if l.fence != req.Fences[i] {
			// The lane was claimed again: every held message goes out
			// again, and every table row is new to the engine.
			l.fence = req.Fences[i]
			l.queue, l.head = l.queue[:0], 0
			l.table = nil
			for _, r := range l.rows {
				l.queue = append(l.queue, r)
				if !r.queued {
					r.queued = true
					s.queued += r.size()
				}
			}
			slices.SortFunc(l.queue, func(a, b *walRow) int { return cmp.Compare(a.Seq, b.Seq) })
		}
	}
	// Rows the table part may not have seen: the store wrote new rows to
	// the table since it read it, or the table came into use after this
	// fetch looked (a stream that started, rows found at a lease round).
	moved := writes != s.tableWrites || s.tableRows && !useTable
	// The rows handed out are at most what the lanes' queues hold, and the
	// queues are usually far shorter than the lanes' limits (a stream of
	// small transactions is fetched as it arrives): sized by the limits,
	// the slice cost more than the rows it carried.
	queued := 0
	for i, lane := range req.Lanes {
		l := &s.lanes[lane]
		queued += min(len(l.queue)-l.head, int(req.Limits[i]))
	}
	res.Rows = make([]store.Row, 0, queued+len(table.Rows))
	upTo := s.addTableRows(&res, &table, useTable, moved, fetch)
	for i, lane := range req.Lanes {
		l := &s.lanes[lane]
		cursor, limit, budget := req.Cursors[i], int(req.Limits[i]), req.Bytes[i]
		var used int64
		n := 0
		for l.head < len(l.queue) {
			r := l.queue[l.head]
			if r.settled {
				l.head++
				continue
			}
			if r.Seq > cursor {
				if n >= limit || used >= budget || r.Seq > upTo[lane] {
					break
				}
				n++
				used += int64(len(r.Payload))
			}
			res.Rows = append(res.Rows, r.Row)
			r.handed = res.Started
			r.queued = false
			s.queued -= r.size()
			l.queue[l.head] = nil
			l.head++
		}
		if l.head > 0 && l.head >= len(l.queue)/2 {
			l.queue = append(l.queue[:0], l.queue[l.head:]...)
			l.head = 0
		}
	}
	for _, ld := range req.Loads {
		l := &s.lanes[ld.Lane]
		for _, seq := range ld.Seqs {
			if r := l.rows[seq]; r != nil {
				res.LoadRows = append(res.LoadRows, r.Row)
			}
		}
	}
	for _, rf := range req.Refills {
		var got []*walRow
		for _, r := range s.lanes[rf.Lane].rows {
			if r.Seq >= rf.From && r.Seq <= rf.To && r.Key == rf.MsgKey && (rf.Topic == "" || r.Topic == rf.Topic) {
				got = append(got, r)
			}
		}
		slices.SortFunc(got, func(a, b *walRow) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, r := range got[:min(len(got), req.RefillLimit)] {
			res.RefillRows = append(res.RefillRows, r.Row)
		}
	}
	return res
}

// rewindLocked answers a fetch after the database went back in time (the
// stream's start found another WAL history, or the table part's transaction
// ids went back): the engine drops what it buffered and reads every lane
// again, so every lane hands out all it holds again, and the notes about
// table rows and the table's read position, which may belong to the other
// history, go (a row can come twice, none is skipped). When only the table
// saw it, the stream starts again, and its start forgets what it holds.
func (s *Store) rewindLocked(table bool) {
	s.rewound = false
	for i := range s.lanes {
		s.lanes[i].fence = -1
		s.lanes[i].table = nil
	}
	s.tablePos = nil
	if table {
		s.doubt = true
		if s.endStream != nil {
			s.endStream(errOtherHistory)
		}
	}
}

// addTableRows adds the rows a fetch of the outbox table returned to res,
// and notes them as table rows (their results go to the table store); it
// returns, per lane, the highest seq the fetch's memory part may hand out
// forward. The caller holds mu.
//
// A lane's memory rows may not overtake its table rows: where the table part
// filled the lane's row limit or byte share (more rows may wait above what it
// read), memory rows go forward only up to the highest seq it returned, so
// the engine's cursor never passes a table row no fetch has read (a row
// below the cursor is found again only if its transaction is newer than the
// previous snapshot). moved says the table part may have missed rows: the
// store inserted new rows into the table while it ran (a large transaction,
// moveLarge), or the fetch read no table and the table came into use since;
// then no memory row goes forward.
//
// A table row whose seq memory also holds (after a crash, a spilled message
// whose transaction the slot had not been confirmed past is streamed again)
// is the one that counts: the memory copy is settled and dropped, unless a
// spill is writing that very row.
func (s *Store) addTableRows(res, table *store.FetchResult, useTable, moved bool, fetch int64) (upTo [wharfmigrate.Lanes]int64) {
	req := &res.Req
	for i := range upTo {
		upTo[i] = math.MaxInt64
	}
	if moved {
		for i, lane := range req.Lanes {
			upTo[lane] = req.Cursors[i]
		}
	}
	if !useTable {
		return upTo
	}
	var cursor, top, bytes [wharfmigrate.Lanes]int64
	var n [wharfmigrate.Lanes]int
	for i, lane := range req.Lanes {
		cursor[lane], top[lane] = req.Cursors[i], req.Cursors[i]
	}
	for j := range table.Rows {
		if r := &table.Rows[j]; r.Lane >= 0 && int(r.Lane) < len(cursor) && r.Seq > cursor[r.Lane] {
			n[r.Lane]++
			bytes[r.Lane] += int64(len(r.Payload))
			top[r.Lane] = max(top[r.Lane], r.Seq)
		}
	}
	for i, lane := range req.Lanes {
		if !moved && (n[lane] >= int(req.Limits[i]) || bytes[lane] >= req.Bytes[i]) {
			upTo[lane] = top[lane]
		}
	}
	add := func(dst *[]store.Row, rows []store.Row, asked bool) {
		for _, r := range rows {
			l := &s.lanes[r.Lane]
			if s.spilling[r.Seq] {
				continue // being moved by this store: the engine has it, or memory serves it
			}
			if note, known := l.table[r.Seq]; known && (note.there && !asked || !note.there && note.fetches >= fetch) {
				continue // a new row the engine already holds, or settled (a snapshot from before its removal)
			}
			if m := l.rows[r.Seq]; m != nil {
				s.dropCopy(l, m)
				if !m.handed.IsZero() && !asked {
					s.noteTable(l, r.Seq, true)
					continue // the engine has the memory copy: its results now go to the table
				}
			}
			s.noteTable(l, r.Seq, true)
			*dst = append(*dst, r)
		}
	}
	add(&res.Rows, table.Rows, false)
	add(&res.LoadRows, table.LoadRows, true)
	add(&res.RefillRows, table.RefillRows, true)
	return upTo
}

// dropCopy settles a held message that is a row of the outbox table too and
// forgets it: the row is delivered instead. The caller holds mu.
func (s *Store) dropCopy(l *walLane, r *walRow) {
	delete(l.rows, r.Seq)
	r.settled = true
	s.held -= r.size()
	if r.queued {
		r.queued = false
		s.queued -= r.size()
	}
	if err := s.progress.Settle(r.tx); err != nil {
		s.log.Error("wharf: settling a WAL message failed (a bug)", "err", err)
	}
	if s.conn != nil {
		s.confirmLocked(s.progress.Confirmable())
	}
	s.gauges.HeldBytes.Store(s.held)
}

// noteTable records that seq is a row of the outbox table (there) or was,
// with the fetches started so far. The caller holds mu.
func (s *Store) noteTable(l *walLane, seq int64, there bool) {
	if l.table == nil {
		l.table = map[int64]tableNote{}
	}
	l.table[seq] = tableNote{there: there, fetches: s.fetches}
}

// noteGoing records that seq is a row of the outbox table whose result is
// still to be written (staleOps): until deleteStale wrote it, every fetch
// drops the row. The caller holds mu.
func (s *Store) noteGoing(l *walLane, seq int64) {
	s.noteTable(l, seq, false)
	l.table[seq] = tableNote{fetches: math.MaxInt64}
}

// tableNote is what the store knows of a seq that is, or was, a row of the
// outbox table.
type tableNote struct {
	there bool
	// fetches is how many fetches had started when the note was made: a
	// fetch that started later has a snapshot taken after the row's
	// removal, so a row of that seq it reads is a new one (a dead letter
	// retried), not the removed one.
	fetches int64
}

// WriteResults settles what was delivered or moved to the dead letters. An
// acknowledgement of a message that never failed needs no write: nothing
// of it is in a table. Retry records, the acknowledgements that clear one
// and dead-letter moves are written fenced, as in the table outbox; only
// after they committed are their messages settled.
func (s *Store) WriteResults(ctx context.Context, all []store.Op) store.OpsResult {
	res := store.OpsResult{Ops: all, Valid: map[int16]bool{}}
	// The results of messages that are rows of the outbox table (spilled)
	// are the table outbox's.
	ops, table := all, []store.Op(nil)
	s.mu.Lock()
	if s.tableRows { // else no seq is a table row: no copy of the results
		ops = nil
		for _, o := range all {
			if l := &s.lanes[o.Lane]; l.table[o.Seq].there && l.rows[o.Seq] == nil {
				table = append(table, o)
			} else {
				ops = append(ops, o)
			}
		}
	}
	s.mu.Unlock()
	if len(table) > 0 {
		t := s.Store.WriteResults(ctx, table)
		if t.Err != nil {
			res.Err = t.Err
			return res
		}
		res.Isolated = t.Isolated
		s.mu.Lock()
		for _, o := range table {
			if t.Valid[o.Lane] {
				res.Valid[o.Lane] = true
				if o.Kind != store.OpRetry {
					s.noteTable(&s.lanes[o.Lane], o.Seq, false)
				}
			}
		}
		s.mu.Unlock()
	}
	var db []store.Op
	for _, o := range ops {
		if o.Kind != store.OpAck || o.Attempts > 0 {
			db = append(db, o)
		}
	}
	if len(db) > 0 {
		w := tablestore.WriteIsolated(ctx, db, s.writeTables)
		if w.Err != nil {
			res.Err = w.Err
			return res
		}
		res.Isolated = res.Isolated || w.Isolated
		for l := range w.Valid {
			res.Valid[l] = true
		}
	}
	if s.afterWrite != nil {
		s.afterWrite()
	}
	s.mu.Lock()
	moved := false
	defer func() {
		s.mu.Unlock()
		if moved {
			if err := s.deleteStale(ctx); err != nil {
				s.log.Warn("wharf: writing results of messages moved to the outbox table failed; retried at the next lease round", "err", err)
			}
		}
	}()
	for _, o := range ops {
		if o.Kind == store.OpAck && o.Attempts == 0 && s.lanes[o.Lane].fence == o.Fence && s.stopRun != nil {
			res.Valid[o.Lane] = true // the lanes are the stream's while it runs
		}
		if o.Kind == store.OpRetry || !res.Valid[o.Lane] {
			continue
		}
		l := &s.lanes[o.Lane]
		r := l.rows[o.Seq]
		if r == nil {
			if l.table[o.Seq].there {
				// A spill moved the message to the table after this result
				// was routed here (or the table's copy replaced this one):
				// the row must go too, or it stays there, handed out.
				s.noteGoing(l, o.Seq)
				s.staleOps = append(s.staleOps, o)
				moved = true
			}
			continue
		}
		if r.Nonce != o.Nonce {
			// Another message with this seq: a result of the history
			// before a restore, written late. It settles nothing here.
			continue
		}
		delete(l.rows, o.Seq)
		r.settled = true
		s.held -= r.size()
		if r.queued {
			r.queued = false
			s.queued -= r.size()
		}
		if s.spilling[o.Seq] {
			s.noteTable(l, o.Seq, false) // the spill writes it to the table: not a message there
		}
		if err := s.progress.Settle(r.tx); err != nil {
			// Each held message settles once, so this is a bug; the slot
			// stays where it is, which delivers again, never skips.
			s.log.Error("wharf: settling a WAL message failed (a bug)", "err", err)
		}
	}
	if s.conn != nil {
		s.confirmLocked(s.progress.Confirmable())
	}
	s.gauges.HeldBytes.Store(s.held)
	return res
}

// writeTables writes retry records, their removal on acknowledgement and
// dead-letter moves in one fenced transaction (grouped as the table
// outbox's, groupOps); the dead letters' content comes from the held
// messages. A dead letter whose message is no longer held (the stream was
// started over) is left out: it is streamed and tried again.
func (s *Store) writeTables(ctx context.Context, ops []store.Op, valid map[int16]bool) error {
	g := tablestore.GroupOps(ops)
	var deadLane []int16
	var deadID, deadNonce []int64
	var deadAtt []int32
	var deadErr, deadTopic []string
	var deadKey, deadHeaders []*string
	var deadPayload [][]byte
	var deadDeliver []*time.Time
	var deadCreated []time.Time
	s.mu.Lock()
	for i, seq := range g.DeadID {
		r := s.lanes[g.DeadLane[i]].rows[seq]
		if r == nil || r.Nonce != g.DeadNonce[i] {
			// Not held, or another message with this seq (a late result
			// of the history before a restore): nothing to move.
			continue
		}
		deadLane = append(deadLane, g.DeadLane[i])
		deadID = append(deadID, seq)
		deadNonce = append(deadNonce, r.Nonce)
		deadTopic = append(deadTopic, r.Topic)
		deadKey = append(deadKey, nonEmpty(r.Key))
		var h *string
		if len(r.Headers) > 0 {
			b, _ := json.Marshal(r.Headers)
			hs := string(b)
			h = &hs
		}
		deadHeaders = append(deadHeaders, h)
		deadPayload = append(deadPayload, r.Payload)
		var d *time.Time
		if !r.DeliverAt.IsZero() {
			d = &r.DeliverAt
		}
		deadDeliver = append(deadDeliver, d)
		deadCreated = append(deadCreated, r.CreatedAt)
		deadAtt = append(deadAtt, g.DeadAtt[i])
		deadErr = append(deadErr, g.DeadErr[i])
	}
	s.mu.Unlock()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// A dead letter's message is confirmed past once this commits.
	b.Queue("SET LOCAL synchronous_commit = on")
	if len(g.ClearRetry) > 0 {
		b.Queue(s.wq.clear, g.Lanes, g.Fences, s.owner, g.ClearRetry, g.ClearNonce)
	}
	if len(g.RetryID) > 0 {
		b.Queue(s.RetrySQL(), g.Lanes, g.Fences, s.owner, g.RetryLane, g.RetryID, g.RetryAtt, g.RetryAt, g.RetryErr, g.RetryNonce)
	}
	if len(deadID) > 0 {
		b.Queue(s.wq.dead, g.Lanes, g.Fences, s.owner, deadLane, deadID, deadNonce, deadTopic, deadKey, deadPayload, deadHeaders, deadDeliver, deadCreated, deadAtt, deadErr)
	}
	if b.Len() == 2 {
		b.Queue(s.wq.fence, g.Lanes, g.Fences, s.owner) // only dead letters no longer held: still learn the lanes
	}
	b.Queue("COMMIT")
	return tablestore.SendFenced(ctx, s.pool, b, 2, valid)
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type walQ struct {
	fence, clear, dead, walEnd, recordProgress, stampProgress, spill, moveLarge, tableRows string
}

// walQueries are the WAL outbox's queries of its tables. The writes of
// results lock the caller's lanes whose fence still matches, as the table
// outbox's do, and return them (tablestore.SendFenced).
func walQueries(schema string) walQ {
	r := func(s string) string { return strings.ReplaceAll(s, "S.", schema+".") }
	return walQ{
		fence: r(`WITH ` + tablestore.Fenced + ` SELECT lane FROM f`),
		// A retry record goes with its message's acknowledgement or
		// dead-letter move only if it is that message's (its nonce, or
		// none: written before schema version 9), never the record of
		// another message with the same seq (a late result of the
		// history before a restore).
		clear: r(`WITH ` + tablestore.Fenced + `, c AS (
    DELETE FROM S.retries x WHERE x.id = ANY($4::bigint[]) AND x.lane IN (SELECT lane FROM f)
        AND (x.nonce IS NULL OR (x.id, x.nonce) IN (SELECT * FROM unnest($4::bigint[], $5::bigint[])))
)
SELECT lane FROM f`),
		dead: r(`WITH ` + tablestore.Fenced + `, ins AS (
    INSERT INTO S.dead_letters (id, nonce, topic, key, payload, headers, deliver_at, created_at, attempts, last_error)
    SELECT d.id, d.nonce, d.topic, d.key, d.payload, d.headers::jsonb, d.deliver_at, d.created_at, d.attempts, d.err
    FROM unnest($4::smallint[], $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::timestamptz[], $12::timestamptz[], $13::int[], $14::text[])
        AS d(lane, id, nonce, topic, key, payload, headers, deliver_at, created_at, attempts, err)
    WHERE d.lane IN (SELECT lane FROM f)
    ON CONFLICT (id) DO UPDATE SET attempts = excluded.attempts, last_error = excluded.last_error, failed_at = now()
    RETURNING id
), c AS (
    DELETE FROM S.retries x USING unnest($5::bigint[], $6::bigint[]) AS d(id, nonce)
    WHERE x.id = d.id AND (x.nonce = d.nonce OR x.nonce IS NULL) AND d.id IN (SELECT id FROM ins)
)
SELECT lane FROM f`),
		// The update writes WAL, so the commit (synchronous_commit on)
		// flushes the WAL up to it: a commit that wrote none is not flushed.
		walEnd: r(`WITH p AS (
    UPDATE S.wal_progress SET recorded_at = recorded_at RETURNING settled, system_identifier, timeline_id
)
SELECT pg_current_wal_insert_lsn()::text, coalesce(confirmed_flush_lsn, '0/0')::text, coalesce(p.settled, '0/0')::text,
       p.system_identifier, p.timeline_id, EXISTS (SELECT 1 FROM S.outbox)
FROM pg_replication_slots LEFT JOIN p ON true WHERE slot_name = $1`),
		recordProgress: r(`UPDATE S.wal_progress SET settled = greatest(settled, $1::pg_lsn), oldest_unsettled = $2, recorded_at = now()
WHERE system_identifier = $3 AND timeline_id = $4 AND $1::pg_lsn <= pg_current_wal_insert_lsn()`),
		stampProgress: r(`UPDATE S.wal_progress SET settled = $1::pg_lsn, system_identifier = $2, timeline_id = $3, oldest_unsettled = NULL, recorded_at = now()`),
		spill: r(`WITH ` + tablestore.Fenced + `
INSERT INTO S.outbox (id, nonce, topic, key, payload, headers, deliver_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT d.id, d.nonce, d.topic, d.key, d.payload, d.headers::jsonb, d.deliver_at, d.created_at
FROM unnest($4::smallint[], $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::timestamptz[], $12::timestamptz[])
    AS d(lane, id, nonce, topic, key, payload, headers, deliver_at, created_at)
WHERE d.lane IN (SELECT lane FROM f)
RETURNING lane, id`),
		// moveLarge inserts the messages of a transaction too large to hold
		// (commitLarge checks the fences), leaving out ids already there.
		moveLarge: r(`INSERT INTO S.outbox (id, nonce, topic, key, payload, headers, deliver_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT d.id, d.nonce, d.topic, d.key, d.payload, d.headers::jsonb, d.deliver_at, d.created_at
FROM unnest($1::smallint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::timestamptz[], $9::timestamptz[])
    AS d(lane, id, nonce, topic, key, payload, headers, deliver_at, created_at)
WHERE NOT EXISTS (SELECT 1 FROM S.outbox o WHERE o.lane = d.lane AND o.id = d.id)`),
		tableRows: r(`SELECT EXISTS (SELECT 1 FROM S.outbox)`),
	}
}

// nonceOf is the nonce of the row of rows with seq, 0 if none has it.
func nonceOf(rows []*walRow, seq int64) int64 {
	for i := range rows {
		if rows[i].Seq == seq {
			return rows[i].Nonce
		}
	}
	return 0
}
