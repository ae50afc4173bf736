package wharf

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

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
	ps := &pgStore{pool: pool, q: newQueries(schema), schema: schema, owner: "r1", incarnation: "i1",
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now}
	require.NoError(t, ps.register(ctx, time.Minute))
	leases, err := ps.claimAlone(ctx)
	require.NoError(t, err)
	require.Len(t, leases, wharfmigrate.Lanes)
	fences := map[int16]int64{}
	req := fetchRequest{}
	for _, l := range leases {
		fences[l.lane] = l.fence
		req.lanes = append(req.lanes, l.lane)
		req.cursors = append(req.cursors, 0)
		req.limits = append(req.limits, 100)
		req.bytes = append(req.bytes, 1<<20)
		req.fences = append(req.fences, l.fence)
	}
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
	res := ps.fetch(ctx, req)
	require.NoError(t, res.err)
	require.Len(t, res.rows, 10)
	at := map[int64]fetchedRow{}
	for _, r := range res.rows {
		require.True(t, r.at.Valid, "the fetch returns where it read each row")
		at[r.Seq] = r
	}

	// The last five of them are delivered. They move (an UPDATE writes a new version elsewhere, as
	// VACUUM FULL or pg_repack would move them), and new rows arrive. Their
	// acknowledgements carry where the fetch read them: for three, that old
	// place now holds a dead version; for two, a new row sits there (after a
	// vacuum the table would reuse it; here the ctids are swapped in, as
	// vacuum depends on what other sessions still see).
	_, err = pool.Exec(ctx, "UPDATE "+schema+".outbox SET topic = topic WHERE id = ANY($1)", a[5:])
	require.NoError(t, err)
	b := insert(5)
	rows, err := pool.Query(ctx, "SELECT ctid FROM "+schema+".outbox WHERE id = ANY($1) ORDER BY id", b)
	require.NoError(t, err)
	newAt, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.TID])
	require.NoError(t, err)
	for i, id := range a[8:] {
		r := at[id]
		r.at = newAt[i]
		at[id] = r
	}

	var ops []op
	for _, id := range a[5:] {
		r := at[id]
		ops = append(ops, op{kind: opAck, m: &msg{Message: r.Message, at: r.at}, lane: r.lane, fence: fences[r.lane], seq: id})
	}
	wr := ps.writeResults(ctx, ops)
	require.NoError(t, wr.err)
	rows, err = pool.Query(ctx, "SELECT id FROM "+schema+".outbox ORDER BY id")
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, append(a[:5:5], b...), left, "the acknowledged rows are gone and the rows now at their old ctids stay")
}
