package walstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/internal/tablestore"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// One write can hold two results of one message (a failed write is queued
// again ahead of newer results): two retry records, or two dead-letter
// moves. The WAL store writes each message once, the later result winning,
// in one transaction, and settles a dead-lettered message once. (Its first
// version sent both, PostgreSQL refused the upsert, and the relay retried
// the write forever: a failing sink stalled the relay's stop.)
func TestWALWriteOfTwoResultsOfOneMessage(t *testing.T) {
	ctx := context.Background()
	pool, schema := walOutbox(t, "wi", nil)
	ws, leases := storeOnAllLanes(t, pool, schema)
	row := &walRow{Row: store.Row{Lane: 5, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("p"), CreatedAt: time.Now()}}
	takeAll(t, ws, 100, []*walRow{row})
	fence := leases[5].Fence
	require.Equal(t, int16(5), leases[5].Lane)
	ws.lanes[5].fence = fence

	now := time.Now()
	res := ws.WriteResults(ctx, []store.Op{
		{Kind: store.OpRetry, Lane: 5, Fence: fence, Seq: 42, Attempts: 1, NextAt: now, Err: "first"},
		{Kind: store.OpRetry, Lane: 5, Fence: fence, Seq: 42, Attempts: 2, NextAt: now, Err: "second"},
	})
	require.NoError(t, res.Err)
	require.False(t, res.Isolated, "the write was refused and split")
	require.True(t, res.Valid[5])
	var attempts int
	var last string
	require.NoError(t, pool.QueryRow(ctx, "SELECT attempts, last_error FROM "+schema+".retries WHERE id = 42").Scan(&attempts, &last))
	require.Equal(t, 2, attempts)
	require.Equal(t, "second", last)

	res = ws.WriteResults(ctx, []store.Op{
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 43, Nonce: 7, Attempts: 3, Err: "dead once"},
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 43, Nonce: 7, Attempts: 4, Err: "dead twice"},
	})
	require.NoError(t, res.Err)
	require.False(t, res.Isolated)
	require.NoError(t, pool.QueryRow(ctx, "SELECT attempts, last_error FROM "+schema+".dead_letters WHERE id = 43").Scan(&attempts, &last))
	require.Equal(t, 4, attempts)
	require.Equal(t, "dead twice", last)
	require.Zero(t, ws.progress.Pending(), "the dead-lettered message was not settled")
	require.Equal(t, walstream.LSN(100), ws.progress.Confirmable())
	require.Zero(t, ws.held)
}

// The WAL outbox's retry records belong to one message too (see
// tablestore.TestRetryRecordsBelongToOneMessage): each carries its
// message's nonce, and a late acknowledgement of another history's message
// with the same seq leaves the record of the message that has it now alone;
// the message's own acknowledgement and dead-letter move remove it.
func TestWALRetryRecordsBelongToOneMessage(t *testing.T) {
	ctx := context.Background()
	pool, schema := walOutbox(t, "wrn", nil)
	ws, leases := storeOnAllLanes(t, pool, schema)
	dead := &walRow{Row: store.Row{Lane: 5, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("p"), CreatedAt: time.Now()}}
	takeAll(t, ws, 100, []*walRow{dead})
	fence := leases[5].Fence
	require.Equal(t, int16(5), leases[5].Lane)
	ws.lanes[5].fence = fence

	type record struct {
		Nonce    int64
		Attempts int
	}
	records := func() map[int64]record {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT id, coalesce(nonce, -1), attempts FROM "+schema+".retries")
		require.NoError(t, err)
		out := map[int64]record{}
		var id int64
		var r record
		_, err = pgx.ForEachRow(rows, []any{&id, &r.Nonce, &r.Attempts}, func() error {
			out[id] = r
			return nil
		})
		require.NoError(t, err)
		return out
	}
	write := func(ops ...store.Op) {
		t.Helper()
		res := ws.WriteResults(ctx, ops)
		require.NoError(t, res.Err)
		require.False(t, res.Isolated, "the write was refused and split")
		require.True(t, res.Valid[5])
	}
	next := time.Now().Add(time.Hour)
	write(store.Op{Kind: store.OpRetry, Lane: 5, Fence: fence, Seq: 42, Nonce: 6, Attempts: 2, NextAt: next, Err: "refused"},
		store.Op{Kind: store.OpRetry, Lane: 5, Fence: fence, Seq: 43, Nonce: 7, Attempts: 2, NextAt: next, Err: "refused"})
	want := map[int64]record{42: {Nonce: 6, Attempts: 2}, 43: {Nonce: 7, Attempts: 2}}
	require.Equal(t, want, records(), "each record carries its message's nonce")

	write(store.Op{Kind: store.OpAck, Lane: 5, Fence: fence, Seq: 42, Nonce: 5, Attempts: 9})
	require.Equal(t, want, records(), "an acknowledgement of another message with the same seq removed the retry record")

	write(store.Op{Kind: store.OpAck, Lane: 5, Fence: fence, Seq: 42, Nonce: 6, Attempts: 2},
		store.Op{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 43, Nonce: 7, Attempts: 3, Err: "refused"})
	require.Empty(t, records())
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".dead_letters WHERE id = 43 AND nonce = 7").Scan(&n))
	require.Equal(t, 1, n)
}

// A database put back in time hands out the same seqs again. In WAL mode a
// late result of the old history's message (an acknowledgement or a
// dead-letter move written after the restore) carries that message's nonce:
// it must neither settle nor dead-letter the new message the store holds
// with its seq, which would then never be delivered. The new message's own
// results do.
func TestWALResultsOfAnotherHistoryLeaveAHeldMessageAlone(t *testing.T) {
	ctx := context.Background()
	pool, schema := walOutbox(t, "wah", nil)
	ws, leases := storeOnAllLanes(t, pool, schema)
	takeAll(t, ws, 100, []*walRow{{Row: store.Row{Lane: 5, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("acked"), CreatedAt: time.Now()}}})
	takeAll(t, ws, 200, []*walRow{{Row: store.Row{Lane: 5, Seq: 44, Nonce: 9, Topic: "t", Key: "k", Payload: []byte("dead"), CreatedAt: time.Now()}}})
	fence := leases[5].Fence
	require.Equal(t, int16(5), leases[5].Lane)
	ws.lanes[5].fence = fence
	ws.stopRun = func() {} // the lanes are the stream's
	deadLetters := func() (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".dead_letters").Scan(&n))
		return n
	}
	held := ws.held
	require.Equal(t, 2, ws.progress.Pending())

	res := ws.WriteResults(ctx, []store.Op{
		{Kind: store.OpAck, Lane: 5, Fence: fence, Seq: 43, Nonce: 8},
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 44, Nonce: 10, Attempts: 3, Err: "old history"},
	})
	require.NoError(t, res.Err)
	require.Equal(t, held, ws.held, "a result of another message with the same seq settled a held one")
	require.Equal(t, 2, ws.progress.Pending())
	require.Zero(t, deadLetters(), "a dead-letter move of another message with the same seq moved a held one")

	res = ws.WriteResults(ctx, []store.Op{
		{Kind: store.OpAck, Lane: 5, Fence: fence, Seq: 43, Nonce: 7},
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 44, Nonce: 9, Attempts: 3, Err: "refused"},
	})
	require.NoError(t, res.Err)
	require.True(t, res.Valid[5])
	require.Zero(t, ws.held)
	require.Zero(t, ws.progress.Pending())
	require.Equal(t, 1, deadLetters())
}

// The store reads ahead of the engine's fetches by at most a quarter of its
// budget: what it holds and has not handed out counts, what the engine has
// taken does not (it still counts in what is held), and a lane claimed again
// puts everything it holds back in the queue, counted once.
func TestWALStoreReadsAheadAQuarterOfItsBudget(t *testing.T) {
	ws := New(Config{Table: tablestore.New(tablestore.Config{Now: time.Now}), Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
	rows := func(from int64, n int) []*walRow {
		out := make([]*walRow, n)
		for i := range out {
			seq := from + int64(i)
			out[i] = &walRow{Row: store.Row{Lane: 3, Seq: seq, Key: "k", Payload: make([]byte, 1000)}}
		}
		return out
	}
	const size = 1000 + walRowOverhead
	takeAll(t, ws, 1000, rows(1, 100))
	require.False(t, ws.full())
	takeAll(t, ws, 2000, rows(101, 100))
	require.Equal(t, int64(200*size), ws.held)
	require.Less(t, ws.held, ws.budget)
	require.True(t, ws.full(), "%d bytes queued, past a quarter of the budget", ws.queued)

	fetch := func(fence int64, limit int32) []store.Row {
		res := ws.Fetch(context.Background(), store.FetchRequest{Lanes: []int16{3}, Cursors: []int64{0}, Limits: []int32{limit},
			Bytes: []int64{1 << 30}, Fences: []int64{fence}})
		require.NoError(t, res.Err)
		return res.Rows
	}
	require.Len(t, fetch(1, 150), 150)
	require.Equal(t, int64(50*size), ws.queued)
	require.Equal(t, int64(200*size), ws.held, "handed out, not settled: still held")
	require.False(t, ws.full())

	require.Empty(t, fetch(2, 0), "a limit of 0 hands nothing out")
	require.Equal(t, int64(200*size), ws.queued, "claimed again: all 200 queued, the 50 not handed out counted once")
	require.True(t, ws.full())
}

// takeAll takes rows committed at end, none of which may be refused.
func takeAll(t *testing.T, ws *Store, end walstream.LSN, rows []*walRow) {
	t.Helper()
	held, err := ws.take(end, time.Now(), rows)
	require.NoError(t, err)
	require.Empty(t, held)
}

// A message whose seq the store already holds never replaces the held one:
// take takes none of its transaction and names the seq, and once the
// refused row is left out the rest is taken.
func TestWALStoreNeverReplacesAHeldMessage(t *testing.T) {
	ws := New(Config{Table: tablestore.New(tablestore.Config{Now: time.Now}), Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
	held := &walRow{Row: store.Row{Lane: 7, Seq: 900, Key: "k", Payload: []byte("held")}}
	takeAll(t, ws, 1000, []*walRow{held})
	newcomer := &walRow{Row: store.Row{Lane: 7, Seq: 900, Key: "k", Payload: []byte("newcomer")}}
	other := &walRow{Row: store.Row{Lane: 2, Seq: 1990, Key: "o", Payload: []byte("other")}}
	refused, err := ws.take(2000, time.Now(), []*walRow{other, newcomer})
	require.NoError(t, err)
	require.Equal(t, []int64{900}, refused)
	require.Same(t, held, ws.lanes[7].rows[900], "the held message was replaced")
	require.Empty(t, ws.lanes[2].rows, "a refused transaction was taken in part")
	require.Equal(t, 1, ws.progress.Pending())
	require.Equal(t, walstream.LSN(1000), ws.lastEnd)

	rows, origin, bad := refuseContents([]*walRow{other, newcomer}, []int{0, 1},
		[]walstream.Message{{LSN: 1991, Content: []byte("a")}, {LSN: 1995, Content: []byte("b")}}, refused)
	require.Equal(t, []*walRow{other}, rows)
	require.Equal(t, []int{0}, origin)
	require.Len(t, bad, 1)
	require.Equal(t, walstream.LSN(1995), bad[0].lsn)
	require.Equal(t, topicMalformed, bad[0].topic)
	require.ErrorContains(t, bad[0].err, "seq 900")
	takeAll(t, ws, 2000, rows)
	require.Same(t, other, ws.lanes[2].rows[1990])

	// A row outside the lanes (never made by newWALRow) is refused, not a panic.
	refused, err = ws.take(3000, time.Now(), []*walRow{{Row: store.Row{Lane: -3, Seq: 2990}}})
	require.NoError(t, err)
	require.Equal(t, []int64{2990}, refused)
}

// What Wharf's enqueue never writes is refused: a seq of its own (the relay
// assigns seqs from WAL positions), no topic, text PostgreSQL cannot hold,
// a nonce outside 62 bits. Every seq the relay assigns gives a lane in range.
func TestWALStoreChecksRecords(t *testing.T) {
	ok := walmsg.Record{Nonce: 5, Topic: "t", Key: "k", Headers: map[string]string{"h": "v"}, Payload: []byte("p")}
	require.NoError(t, checkRecords([]walmsg.Record{ok, {Topic: "t"}}))
	for _, c := range []struct {
		name string
		edit func(*walmsg.Record)
		want string
	}{
		{"seq", func(r *walmsg.Record) { r.Seq = 42 }, "carries seq 42"},
		{"negative seq", func(r *walmsg.Record) { r.Seq = -5 }, "carries seq -5"},
		{"no topic", func(r *walmsg.Record) { r.Topic = "" }, "has no topic"},
		{"topic NUL", func(r *walmsg.Record) { r.Topic = "a\x00b" }, "topic that is not valid UTF-8"},
		{"key not UTF-8", func(r *walmsg.Record) { r.Key = "\xff" }, "key that is not valid UTF-8"},
		{"header", func(r *walmsg.Record) { r.Headers = map[string]string{"h": "\x00"} }, "header that is not valid UTF-8"},
		{"nonce", func(r *walmsg.Record) { r.Nonce = -1 }, "nonce -1"},
	} {
		bad := ok
		c.edit(&bad)
		err := checkRecords([]walmsg.Record{ok, bad})
		require.ErrorContains(t, err, "message 2 of 2 ", c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
	for _, seq := range []int64{1, 63, 64, 1<<62 + 17, 1<<63 - 1} {
		r := newWALRow(&walmsg.Record{Topic: "t"}, seq, time.Now())
		require.True(t, r.Lane >= 0 && r.Lane < wharfmigrate.Lanes, "seq %d: lane %d", seq, r.Lane)
	}
}

func testGauges() Gauges {
	return Gauges{HeldBytes: new(atomic.Int64), LagBytes: new(atomic.Int64), Lag: new(atomic.Int64)}
}

// The slot is never confirmed past the WAL end the server reported on the
// stream (its start, its keepalives, the ends of the transactions taken),
// whatever position asks for it.
func TestWALStoreConfirmsNoFurtherThanTheServersWALEnd(t *testing.T) {
	ws := New(Config{Table: tablestore.New(tablestore.Config{Now: time.Now}), Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
	ws.serverEnd = 1000
	ws.confirmLocked(5000)
	require.Equal(t, walstream.LSN(1000), ws.confirmed)
	_, err := ws.take(1500, time.Now(), nil) // a transaction the stream sent ends there
	require.NoError(t, err)
	ws.confirmLocked(5000)
	require.Equal(t, walstream.LSN(1500), ws.confirmed)
	ws.confirmLocked(10)
	require.Equal(t, walstream.LSN(1500), ws.confirmed, "never back")
}

// historyStore is a WAL store of a fresh WAL outbox on the logical test
// cluster, and the server's identity as a stream start reads it.
func historyStore(t *testing.T) (*Store, walstream.System) {
	t.Helper()
	ws := newHistoryStore(t)
	return ws, identify(t)
}

// identify is the server's identity, as a stream start reads it after walEnd.
func identify(t *testing.T) walstream.System {
	t.Helper()
	ctx := context.Background()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	conn, err := walstream.Connect(ctx, url, walstream.Options{})
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	sys, err := conn.Identify(ctx)
	require.NoError(t, err)
	return sys
}

func newHistoryStore(t *testing.T) *Store {
	t.Helper()
	pool, schema := walOutbox(t, "wh", nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ps := tablestore.New(tablestore.Config{Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now})
	return New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
}

// A stream start on another WAL history than the store's previous streams
// (another system identifier or timeline, or a WAL end below what the
// store streamed) forgets every held message and the positions, and the
// next fetch tells the engine to read every lane again (handing out
// nothing); the fetch after it hands out what the new stream brings.
func TestWALStoreForgetsWhatItHeldWhenTheHistoryChanged(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		before func(ws *Store, sys walstream.System)
	}{
		{"WAL end below what was streamed", func(ws *Store, sys walstream.System) {
			ws.sys = sys
			takeAll(t, ws, sys.WALEnd+1<<20, []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("old")}}})
		}},
		{"another timeline", func(ws *Store, sys walstream.System) {
			ws.sys = walstream.System{ID: sys.ID, Timeline: sys.Timeline + 1}
			takeAll(t, ws, 10, []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("old")}}})
		}},
		{"another cluster", func(ws *Store, sys walstream.System) {
			ws.sys = walstream.System{ID: sys.ID + 1, Timeline: sys.Timeline}
			takeAll(t, ws, 10, []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("old")}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, sys := historyStore(t)
			tc.before(ws, sys)
			ws.confirmed = ws.lastEnd
			w, err := ws.walEnd(ctx)
			require.NoError(t, err)
			settled, err := ws.checkHistory(ctx, sys, w)
			require.NoError(t, err)
			require.Zero(t, settled)
			require.Zero(t, ws.held)
			require.Zero(t, ws.lastEnd)
			require.Zero(t, ws.confirmed)
			require.Equal(t, sys, ws.sys)

			fetch := func() store.FetchResult {
				res := ws.Fetch(ctx, store.FetchRequest{Lanes: []int16{3}, Cursors: []int64{1 << 40}, Limits: []int32{100},
					Bytes: []int64{1 << 30}, Fences: []int64{1}})
				require.NoError(t, res.Err)
				return res
			}
			held, err := ws.take(w.end+1, time.Now(), []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("new")}}})
			require.NoError(t, err)
			require.Empty(t, held)
			res := fetch()
			require.True(t, res.Rewound)
			require.Empty(t, res.Rows)
			res = fetch()
			require.False(t, res.Rewound)
			require.Len(t, res.Rows, 1)
			require.Equal(t, "new", string(res.Rows[0].Payload))
		})
	}
}

// A stream start on the same history keeps what the store holds and uses
// the recorded position; wal_progress then carries the server's identity,
// and a later write of a position past the WAL end is refused.
func TestWALStoreKeepsItsStateOnTheSameHistory(t *testing.T) {
	ctx := context.Background()
	ws, sys := historyStore(t)
	w, err := ws.walEnd(ctx)
	require.NoError(t, err)
	require.Nil(t, w.sysID, "a new outbox's row has no identity yet")
	_, err = ws.checkHistory(ctx, sys, w)
	require.NoError(t, err)
	w, err = ws.walEnd(ctx)
	require.NoError(t, err)
	require.NotNil(t, w.sysID)
	require.Equal(t, sys.ID, uint64(*w.sysID))
	require.Equal(t, sys.Timeline, *w.timeline)

	// A transaction the stream sent ends at or below the server's flushed
	// WAL end.
	end := identify(t).WALEnd
	stamped := ws.recorded // the slot's position, which can be as far
	takeAll(t, ws, end, []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("held")}}})
	ws.mu.Lock()
	ws.confirmLocked(end - 1)
	ws.mu.Unlock()
	require.NoError(t, ws.recordProgress(ctx, time.Time{}))
	require.Equal(t, max(stamped, end-1), ws.recorded)
	w, err = ws.walEnd(ctx)
	require.NoError(t, err)
	require.Equal(t, ws.recorded, w.settled)
	settled, err := ws.checkHistory(ctx, identify(t), w)
	require.NoError(t, err)
	require.Equal(t, w.settled, settled)
	require.False(t, ws.rewound)
	require.NotZero(t, ws.held, "the held message was forgotten")

	// A position past the server's WAL end is not written.
	ws.mu.Lock()
	ws.confirmed = w.end + 1<<30
	ws.mu.Unlock()
	require.NoError(t, ws.recordProgress(ctx, time.Time{}))
	w2, err := ws.walEnd(ctx)
	require.NoError(t, err)
	require.Equal(t, w.settled, w2.settled)
}

// A lease round records the settled position while the stream starts
// again: the record commits after the start read wal_progress, so the row
// the start read is below what this relay then knows it wrote. That is the
// relay's own newer write, not a restore: the store keeps what it holds and
// reads no lane again (a false restore delivered every held message twice).
func TestWALStoreRecordingWhileAStreamStartsIsNoRestore(t *testing.T) {
	ctx := context.Background()
	ws, sys := historyStore(t)
	w, err := ws.walEnd(ctx)
	require.NoError(t, err)
	_, err = ws.checkHistory(ctx, sys, w)
	require.NoError(t, err)

	end := identify(t).WALEnd
	takeAll(t, ws, end, []*walRow{{Row: store.Row{Lane: 3, Seq: 7, Key: "k", Payload: []byte("held")}}})
	w, err = ws.walEnd(ctx) // the stream start reads the row ...
	require.NoError(t, err)
	ws.mu.Lock()
	ws.confirmLocked(end)
	ws.mu.Unlock()
	require.NoError(t, ws.recordProgress(ctx, time.Time{})) // ... then the lease round's write commits
	require.Greater(t, ws.recorded, w.settled, "the write did not advance the recorded position: the test proves nothing")
	_, err = ws.checkHistory(ctx, identify(t), w)
	require.NoError(t, err)
	require.False(t, ws.rewound, "the relay's own newer write was taken for a restore")
	require.NotZero(t, ws.held, "the held message was forgotten")
}

// An outbox switched to WAL mode by an earlier build lacks the columns of
// wal_progress that name a position's WAL history: the stream does not
// start, with an error that says how to add them.
func TestWALStoreRefusesAProgressTableWithoutTheHistoryColumns(t *testing.T) {
	ctx := context.Background()
	ws := newHistoryStore(t)
	_, err := ws.pool.Exec(ctx, "ALTER TABLE "+ws.schema+".wal_progress DROP COLUMN system_identifier")
	require.NoError(t, err)
	_, err = ws.walEnd(ctx)
	require.ErrorContains(t, err, "run `wharf migrate up --mode wal` again to add them")
}

// A message settled by a table write (moved to the outbox table, or to the
// dead letters) lets the slot be confirmed past it once the write
// commits: the write commits with synchronous_commit on even where the
// session's setting is off, so a crash cannot lose it after the slot moved.
func TestWALStoreTableWritesCommitSynchronously(t *testing.T) {
	ctx := context.Background()
	pool, schema := walOutbox(t, "wy", map[string]string{"synchronous_commit": "off"})
	// What synchronous_commit was where the rows were written.
	_, err := pool.Exec(ctx, strings.ReplaceAll(`CREATE TABLE S.sync_seen (tbl text, setting text);
CREATE FUNCTION S.note_sync() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO S.sync_seen VALUES (TG_TABLE_NAME, current_setting('synchronous_commit'));
    RETURN NULL;
END $fn$;
CREATE TRIGGER note_sync AFTER INSERT ON S.outbox FOR EACH STATEMENT EXECUTE FUNCTION S.note_sync();
CREATE TRIGGER note_sync AFTER INSERT ON S.dead_letters FOR EACH STATEMENT EXECUTE FUNCTION S.note_sync();`, "S.", schema+"."))
	require.NoError(t, err)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ps := tablestore.New(tablestore.Config{Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now})
	require.NoError(t, ps.Register(ctx, 10*time.Second))
	leases, err := ps.ClaimAlone(ctx)
	require.NoError(t, err)
	fences := map[int16]int64{}
	for _, l := range leases {
		fences[l.Lane] = l.Fence
	}
	ws := New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
	ws.spillAfter = time.Nanosecond
	ws.serverEnd = 1 << 40
	spilled, dead := walmsg.Lane("k"), walmsg.Lane("j")
	require.NotEqual(t, spilled, dead)
	rows := []*walRow{
		{Row: store.Row{Lane: spilled, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("spilled"), CreatedAt: time.Now()}},
		{Row: store.Row{Lane: dead, Seq: 44, Nonce: 8, Topic: "t", Key: "j", Payload: []byte("dead"), CreatedAt: time.Now()}},
	}
	takeAll(t, ws, 100, rows)
	res := ws.Fetch(ctx, store.FetchRequest{Lanes: []int16{spilled, dead}, Cursors: []int64{0, 0}, Limits: []int32{10, 10},
		Bytes: []int64{1 << 20, 1 << 20}, Fences: []int64{fences[spilled], fences[dead]}})
	require.NoError(t, res.Err)
	require.Len(t, res.Rows, 2)

	w := ws.WriteResults(ctx, []store.Op{{Kind: store.OpDead, Lane: dead, Fence: fences[dead], Seq: 44, Nonce: 8, Attempts: 3, Err: "refused"}})
	require.NoError(t, w.Err)
	require.NoError(t, ws.spill(ctx, map[int16]int64{spilled: fences[spilled]}))
	require.Zero(t, ws.held, "not settled")
	require.Equal(t, walstream.LSN(100), ws.progress.Confirmable())

	got, err := pgx.CollectRows(must(pool.Query(ctx, "SELECT tbl || ':' || setting FROM "+schema+".sync_seen ORDER BY tbl")), pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"dead_letters:on", "outbox:on"}, got)
	var session string
	require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&session))
	require.Equal(t, "off", session, "the test shows nothing")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// walEnd's WAL end is flushed when it returns, even after a commit made
// with synchronous_commit off: the stream (which sends only flushed WAL)
// reaches it, and the flushed WAL end a stream start identifies next is at
// or past it.
func TestWALEndIsFlushed(t *testing.T) {
	ctx := context.Background()
	ws := newHistoryStore(t)
	for i := 0; i < 20; i++ {
		_, err := ws.pool.Exec(ctx, "SET synchronous_commit = off; SELECT pg_logical_emit_message(true, 'someone_else', repeat('x', 1000)); RESET synchronous_commit")
		require.NoError(t, err)
		w, err := ws.walEnd(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, identify(t).WALEnd, w.end, "round %d", i)
	}
}

// A spill that moves a message to the table while its result is being
// written from memory: the result follows the row. An acknowledgement
// deletes it, a dead-letter move moves it to the dead letters; neither stays
// in the table, handed out and never fetched again.
func TestWALResultRacingASpillFollowsTheRow(t *testing.T) {
	for _, kind := range []store.OpKind{store.OpAck, store.OpDead} {
		ctx := context.Background()
		pool, schema := walOutbox(t, "wr", nil)
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		ps := tablestore.New(tablestore.Config{Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now})
		require.NoError(t, ps.Register(ctx, 10*time.Second))
		leases, err := ps.ClaimAlone(ctx)
		require.NoError(t, err)
		fences := map[int16]int64{}
		for _, l := range leases {
			fences[l.Lane] = l.Fence
		}
		ws := New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20,
			SpillAfter: time.Nanosecond, Gauges: testGauges()})
		lane := walmsg.Lane("k") // the lane the table computes for the key
		row := &walRow{Row: store.Row{Lane: lane, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("p"), CreatedAt: time.Now()}}
		takeAll(t, ws, 100, []*walRow{row})
		res := ws.Fetch(ctx, store.FetchRequest{Lanes: []int16{lane}, Cursors: []int64{0}, Limits: []int32{10}, Bytes: []int64{1 << 20}, Fences: []int64{fences[lane]}})
		require.NoError(t, res.Err)
		require.Len(t, res.Rows, 1)
		ws.stopRun = func() {} // the lanes are the stream's
		ws.afterWrite = func() {
			ws.afterWrite = nil
			time.Sleep(time.Millisecond) // handed at least SpillAfter ago
			require.NoError(t, ws.spill(ctx, fences))
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
			require.Equal(t, 1, n, "the spill did not move the message")
		}
		w := ws.WriteResults(ctx, []store.Op{{Kind: kind, Lane: lane, Fence: fences[lane], Seq: 43, Nonce: 7, Attempts: 1, Err: "failed"}})
		require.NoError(t, w.Err)
		require.True(t, w.Valid[lane])
		var n, dead int
		require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+schema+".outbox), (SELECT count(*) FROM "+schema+".dead_letters)").Scan(&n, &dead))
		require.Zero(t, n, "kind %d: the moved row stayed in the table", kind)
		if kind == store.OpDead {
			require.Equal(t, 1, dead, "the message was not dead-lettered")
		}
		require.Zero(t, ws.progress.Pending())
		require.Zero(t, ws.held)
	}
}

// walOutbox migrates a fresh outbox in WAL mode, its schema named prefix_
// and random hex, on the logical test server, and returns a pool on it
// (with params set on every connection) and the schema; both go at cleanup.
func walOutbox(t *testing.T, prefix string, params map[string]string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	schema := prefix + "_" + hex.EncodeToString(rb[:])
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	t.Cleanup(func() {
		_, _ = m.Down(context.Background(), pool, 0)
		pool.Close()
	})
	return pool, schema
}

// storeOnAllLanes is a WAL store of relay r1 over the outbox in schema,
// with a table store that registered r1 and claimed every lane (the
// leases, in lane order, are returned).
func storeOnAllLanes(t *testing.T, pool *pgxpool.Pool, schema string) (*Store, []store.LaneLease) {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ps := tablestore.New(tablestore.Config{Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now})
	require.NoError(t, ps.Register(ctx, 10*time.Second))
	leases, err := ps.ClaimAlone(ctx)
	require.NoError(t, err)
	require.Len(t, leases, wharfmigrate.Lanes)
	return New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20, Gauges: testGauges()}), leases
}
