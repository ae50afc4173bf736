package walstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

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
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	schema := "wi_" + hex.EncodeToString(rb[:])
	pool, err := pgxpool.New(ctx, url)
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

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ps := tablestore.New(tablestore.Config{Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now})
	require.NoError(t, ps.Register(ctx, 10*time.Second))
	leases, err := ps.ClaimAlone(ctx)
	require.NoError(t, err)
	require.Len(t, leases, wharfmigrate.Lanes)
	ws := New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20, Gauges: testGauges()})
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
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 43, Attempts: 3, Err: "dead once"},
		{Kind: store.OpDead, Lane: 5, Fence: fence, Seq: 43, Attempts: 4, Err: "dead twice"},
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
