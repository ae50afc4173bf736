package wharf_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// FormatID and the schema's message_id function agree bit for bit, ParseID
// inverts them, and ids of one outbox sort as text in Seq order.
func TestMessageIDFormat(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	seqs := []int64{1, 2, 4095, 4096, 4097, 1 << 40, 1<<60 - 1}
	nonces := []int64{0, 1, 1<<62 - 1, math.MaxInt64, math.MinInt64, -1}
	for range 50 {
		seqs = append(seqs, rand.Int64N(1<<60))
		nonces = append(nonces, rand.Int64())
	}
	for _, seq := range seqs {
		for _, nonce := range nonces[:3] {
			id := wharf.FormatID(seq, nonce)
			var fromSQL string
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+".message_id($1, $2)::text", seq, nonce).Scan(&fromSQL))
			require.Equalf(t, fromSQL, id, "seq %d nonce %d", seq, nonce)
			gotSeq, gotNonce, err := wharf.ParseID(id)
			require.NoError(t, err)
			require.Equal(t, seq, gotSeq)
			require.Equal(t, nonce&(1<<62-1), gotNonce)
			require.Equal(t, byte('8'), id[14], "version 8")
			require.Contains(t, "89ab", string(id[19]), "RFC 9562 variant")
		}
	}
	for _, nonce := range nonces {
		var fromSQL string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+".message_id(42, $1)::text", nonce).Scan(&fromSQL))
		require.Equal(t, wharf.FormatID(42, nonce), fromSQL)
	}
	sorted := make([]string, 0, len(seqs))
	for _, seq := range seqs {
		sorted = append(sorted, wharf.FormatID(seq, rand.Int64()))
	}
	sort.Strings(sorted)
	for i := 1; i < len(sorted); i++ {
		a, _, _ := wharf.ParseID(sorted[i-1])
		c, _, _ := wharf.ParseID(sorted[i])
		require.LessOrEqual(t, a, c, "ids sort in seq order")
	}
	for _, bad := range []string{"", "42", "00000000-0000-4001-8000-000000000001", "00000000-0000-8001-c000-000000000001", "zzzzzzzz-0000-8001-8000-000000000001", "00000000000080018000000000000001xxxx"} {
		_, _, err := wharf.ParseID(bad)
		require.ErrorIsf(t, err, wharf.ErrBadID, "%q", bad)
	}
}

// Two outboxes (schemas) give their first messages the same seq but different
// ids; the same message keeps its id through the SQL and Go enqueue paths.
func TestMessageIDsDifferAcrossOutboxes(t *testing.T) {
	t.Parallel()
	a, c := setupDB(t), setupDB(t)
	ctx := context.Background()
	ca, err := wharf.NewClient(a.pool, &wharf.Config{Schema: a.schema})
	require.NoError(t, err)
	cc, err := wharf.NewClient(c.pool, &wharf.Config{Schema: c.schema})
	require.NoError(t, err)
	ia, err := ca.Enqueue(ctx, wharf.Message{Topic: "t", Payload: []byte("1")})
	require.NoError(t, err)
	ic, err := cc.Enqueue(ctx, wharf.Message{Topic: "t", Payload: []byte("1")})
	require.NoError(t, err)
	sa, _, _ := wharf.ParseID(ia[0])
	sc, _, _ := wharf.ParseID(ic[0])
	require.Equal(t, sa, sc, "both outboxes start at seq 1")
	require.NotEqual(t, ia[0], ic[0])
}
