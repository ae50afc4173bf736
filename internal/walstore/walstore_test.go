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
	require.NoError(t, ws.take(100, row.CreatedAt, []*walRow{row}))
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
	require.NoError(t, ws.take(1000, time.Now(), rows(1, 100)))
	require.False(t, ws.full())
	require.NoError(t, ws.take(2000, time.Now(), rows(101, 100)))
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

func testGauges() Gauges {
	return Gauges{HeldBytes: new(atomic.Int64), LagBytes: new(atomic.Int64), Lag: new(atomic.Int64)}
}

// A spill that moves a message to the table while its result is being
// written from memory: the result follows the row. An acknowledgement
// deletes it, a dead-letter move moves it to the dead letters; neither stays
// in the table, handed out and never fetched again.
func TestWALResultRacingASpillFollowsTheRow(t *testing.T) {
	for _, kind := range []store.OpKind{store.OpAck, store.OpDead} {
		ctx := context.Background()
		url, err := testdb.LogicalURL()
		require.NoError(t, err)
		var rb [5]byte
		_, _ = rand.Read(rb[:])
		schema := "wr_" + hex.EncodeToString(rb[:])
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
		fences := map[int16]int64{}
		for _, l := range leases {
			fences[l.Lane] = l.Fence
		}
		ws := New(Config{Table: ps, Pool: pool, Schema: schema, RelayID: "r1", Logger: log, Now: time.Now, Budget: 1 << 20,
			SpillAfter: time.Nanosecond, Gauges: testGauges()})
		lane := walmsg.Lane("k") // the lane the table computes for the key
		row := &walRow{Row: store.Row{Lane: lane, Seq: 43, Nonce: 7, Topic: "t", Key: "k", Payload: []byte("p"), CreatedAt: time.Now()}}
		require.NoError(t, ws.take(100, row.CreatedAt, []*walRow{row}))
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
		w := ws.WriteResults(ctx, []store.Op{{Kind: kind, Lane: lane, Fence: fences[lane], Seq: 43, Attempts: 1, Err: "failed"}})
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
