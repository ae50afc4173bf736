package tablestore

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// An acknowledgement finds its row by the ctid the fetch read it at, checked
// against its id. A row that moved since (VACUUM FULL, pg_repack) is still
// removed, through the (lane, id) index, and a row that now sits at the old
// ctid is left alone.
func TestAckFindsRowsThatMovedSinceTheFetch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "ackmv")
	ps, req, fences := claimAllLanes(t, pool, schema)
	insert := func(n int) []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, "INSERT INTO "+schema+".outbox (topic, payload) SELECT 't', 'p' FROM generate_series(1, $1::int) RETURNING id", n)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		slices.Sort(ids)
		return ids
	}
	a := insert(10)
	res := ps.Fetch(ctx, req)
	require.NoError(t, res.Err)
	require.Len(t, res.Rows, 10)
	at := map[int64]store.Row{}
	for _, r := range res.Rows {
		require.True(t, r.At.Valid, "the fetch returns where it read each row")
		at[r.Seq] = r
	}

	// The last five of them are delivered. They move (an UPDATE writes a new version elsewhere, as
	// VACUUM FULL or pg_repack would move them), and new rows arrive. Their
	// acknowledgements carry where the fetch read them: for three, that old
	// place now holds a dead version; for two, a new row sits there (after a
	// vacuum the table would reuse it; here the ctids are swapped in, as
	// vacuum depends on what other sessions still see).
	_, err := pool.Exec(ctx, "UPDATE "+schema+".outbox SET topic = topic WHERE id = ANY($1)", a[5:])
	require.NoError(t, err)
	b := insert(5)
	rows, err := pool.Query(ctx, "SELECT ctid FROM "+schema+".outbox WHERE id = ANY($1) ORDER BY id", b)
	require.NoError(t, err)
	newAt, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.TID])
	require.NoError(t, err)
	for i, id := range a[8:] {
		r := at[id]
		r.At = newAt[i]
		at[id] = r
	}

	var ops []store.Op
	for _, id := range a[5:] {
		r := at[id]
		ops = append(ops, store.Op{Kind: store.OpAck, At: r.At, Lane: r.Lane, Fence: fences[r.Lane], Seq: id, Nonce: r.Nonce})
	}
	wr := ps.WriteResults(ctx, ops)
	require.NoError(t, wr.Err)
	rows, err = pool.Query(ctx, "SELECT id FROM "+schema+".outbox ORDER BY id")
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, append(a[:5:5], b...), left, "the acknowledged rows are gone and the rows now at their old ctids stay")
}

// A database put back in time (a restore, a failover to a standby that lost
// commits) hands out the same ids again. A result of the old history that is
// written late — an acknowledgement or a dead-letter move retried after the
// restore — carries the old message's nonce and must leave the new message
// that took its id alone; the new message's own results settle it.
func TestResultsOfAnotherHistoryLeaveANewMessageAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "acknonce")
	ps, req, fences := claimAllLanes(t, pool, schema)
	_, err := pool.Exec(ctx, "INSERT INTO "+schema+".outbox (topic, key, payload) VALUES ('t', 'a', 'p'), ('t', 'b', 'p')")
	require.NoError(t, err)
	res := ps.Fetch(ctx, req)
	require.NoError(t, res.Err)
	require.Len(t, res.Rows, 2)
	left := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
		return n
	}
	acked, dead := res.Rows[0], res.Rows[1]
	stale := []store.Op{
		{Kind: store.OpAck, At: acked.At, Lane: acked.Lane, Fence: fences[acked.Lane], Seq: acked.Seq, Nonce: acked.Nonce + 1},
		{Kind: store.OpDead, Lane: dead.Lane, Fence: fences[dead.Lane], Seq: dead.Seq, Nonce: dead.Nonce + 1, Attempts: 1, Err: "old"},
	}
	w := ps.WriteResults(ctx, stale)
	require.NoError(t, w.Err)
	require.Equal(t, 2, left(), "a result of another message with the same id settled the new one")
	var deadN int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".dead_letters").Scan(&deadN))
	require.Zero(t, deadN)

	own := []store.Op{
		{Kind: store.OpAck, At: acked.At, Lane: acked.Lane, Fence: fences[acked.Lane], Seq: acked.Seq, Nonce: acked.Nonce},
		{Kind: store.OpDead, Lane: dead.Lane, Fence: fences[dead.Lane], Seq: dead.Seq, Nonce: dead.Nonce, Attempts: 1, Err: "refused"},
	}
	w = ps.WriteResults(ctx, own)
	require.NoError(t, w.Err)
	require.Zero(t, left())
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".dead_letters").Scan(&deadN))
	require.Equal(t, 1, deadN)
}

// A retry record belongs to the message that failed, not to its seq: it
// carries the message's nonce, and only that message's results change or
// remove it. After a restore the outbox hands out the same seqs again, and a
// relay of the old history may write a result late: a failure, an
// acknowledgement or a dead-letter move of the old message must leave the
// record of the new, failing message that took its seq (its attempts and
// backoff) as it is. A record written before schema version 9 (no nonce)
// belongs to whichever message has its seq, as before.
func TestRetryRecordsBelongToOneMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "retrynonce")
	ps, req, fences := claimAllLanes(t, pool, schema)
	_, err := pool.Exec(ctx, "INSERT INTO "+schema+".outbox (topic, key, payload) VALUES ('t', 'a', 'p'), ('t', 'b', 'p'), ('t', 'c', 'p')")
	require.NoError(t, err)
	res := ps.Fetch(ctx, req)
	require.NoError(t, res.Err)
	require.Len(t, res.Rows, 3)
	slices.SortFunc(res.Rows, func(x, y store.Row) int { return int(x.Seq - y.Seq) })
	acked, dead, legacy := res.Rows[0], res.Rows[1], res.Rows[2]
	type record struct {
		Nonce    *int64
		Attempts int
		Err      string
	}
	records := func() map[int64]record {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT id, nonce, attempts, last_error FROM "+schema+".retries")
		require.NoError(t, err)
		out := map[int64]record{}
		var id int64
		var r record
		_, err = pgx.ForEachRow(rows, []any{&id, &r.Nonce, &r.Attempts, &r.Err}, func() error {
			rec := r
			if r.Nonce != nil {
				nonce := *r.Nonce
				rec.Nonce = &nonce
			}
			out[id] = rec
			return nil
		})
		require.NoError(t, err)
		return out
	}
	write := func(ops ...store.Op) {
		t.Helper()
		w := ps.WriteResults(ctx, ops)
		require.NoError(t, w.Err)
		require.False(t, w.Isolated, "the write was refused and split")
		for _, o := range ops {
			require.True(t, w.Valid[o.Lane], "lane %d reported lost", o.Lane)
		}
	}
	retry := func(r store.Row, nonce int64, attempts int, text string) store.Op {
		return store.Op{Kind: store.OpRetry, Lane: r.Lane, Fence: fences[r.Lane], Seq: r.Seq, Nonce: nonce,
			Attempts: attempts, NextAt: time.Now().Add(time.Hour), Err: text}
	}

	write(retry(acked, acked.Nonce, 2, "refused"), retry(dead, dead.Nonce, 2, "refused"))
	want := map[int64]record{
		acked.Seq: {Nonce: &acked.Nonce, Attempts: 2, Err: "refused"},
		dead.Seq:  {Nonce: &dead.Nonce, Attempts: 2, Err: "refused"},
	}
	require.Equal(t, want, records(), "each record carries its message's nonce")

	// Late results of another history's messages with these seqs.
	write(store.Op{Kind: store.OpAck, At: acked.At, Lane: acked.Lane, Fence: fences[acked.Lane], Seq: acked.Seq, Nonce: acked.Nonce + 1, Attempts: 9},
		store.Op{Kind: store.OpDead, Lane: dead.Lane, Fence: fences[dead.Lane], Seq: dead.Seq, Nonce: dead.Nonce + 1, Attempts: 9, Err: "old history"})
	require.Equal(t, want, records(), "a result of another message with the same seq changed the new one's retry record")
	write(retry(dead, dead.Nonce+1, 9, "old history"))
	require.Equal(t, want, records(), "a failure of another message with the same seq changed the new one's retry record")
	// A failure written with such a late acknowledgement is recorded.
	write(retry(acked, acked.Nonce, 3, "refused again"),
		store.Op{Kind: store.OpAck, At: acked.At, Lane: acked.Lane, Fence: fences[acked.Lane], Seq: acked.Seq, Nonce: acked.Nonce + 1, Attempts: 9})
	want[acked.Seq] = record{Nonce: &acked.Nonce, Attempts: 3, Err: "refused again"}
	require.Equal(t, want, records(), "an acknowledgement of another message with the same seq dropped the failure written with it")

	// The messages' own results remove their records; a record without a
	// nonce (written before schema version 9) is the message's at its seq.
	_, err = pool.Exec(ctx, "INSERT INTO "+schema+".retries (id, lane, attempts, next_attempt_at, last_error) VALUES ($1, $2, 4, now(), 'before version 9')", legacy.Seq, legacy.Lane)
	require.NoError(t, err)
	write(store.Op{Kind: store.OpAck, At: acked.At, Lane: acked.Lane, Fence: fences[acked.Lane], Seq: acked.Seq, Nonce: acked.Nonce, Attempts: 2},
		store.Op{Kind: store.OpDead, Lane: dead.Lane, Fence: fences[dead.Lane], Seq: dead.Seq, Nonce: dead.Nonce, Attempts: 3, Err: "refused"},
		store.Op{Kind: store.OpAck, At: legacy.At, Lane: legacy.Lane, Fence: fences[legacy.Lane], Seq: legacy.Seq, Nonce: legacy.Nonce, Attempts: 5})
	require.Empty(t, records())
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
	require.Zero(t, n)
}

// claimAllLanes registers relay r1 on the outbox in schema, claims every
// lane and returns the store, a fetch request over all of them from
// cursor 0 (100 rows and 1 MiB a lane) and each lane's fence.
func claimAllLanes(t *testing.T, pool *pgxpool.Pool, schema string) (*Store, store.FetchRequest, map[int16]int64) {
	t.Helper()
	ctx := context.Background()
	ps := New(Config{Pool: pool, Schema: schema, RelayID: "r1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now})
	require.NoError(t, ps.Register(ctx, time.Minute))
	leases, err := ps.ClaimAlone(ctx)
	require.NoError(t, err)
	require.Len(t, leases, wharfmigrate.Lanes)
	req := store.FetchRequest{}
	fences := map[int16]int64{}
	for _, l := range leases {
		fences[l.Lane] = l.Fence
		req.Lanes = append(req.Lanes, l.Lane)
		req.Cursors = append(req.Cursors, 0)
		req.Limits = append(req.Limits, 100)
		req.Bytes = append(req.Bytes, 1<<20)
		req.Fences = append(req.Fences, l.Fence)
	}
	return ps, req, fences
}
