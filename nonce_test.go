package wharf_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// requireRandomNonces checks that nonces carry 62 random bits: each of the 62
// bit positions is set in at least one and clear in at least one of them. With
// 5000 uniformly random nonces a position stays constant with probability
// 2 x 2^-5000, so the verdict is deterministic in practice; a draw with fewer
// random bits (a scaled-up random(): the low 10 bits always 0) fails every
// time.
func requireRandomNonces(t *testing.T, nonces []int64) {
	t.Helper()
	require.Len(t, nonces, 5000)
	var anySet, anyClear int64
	lowBits := 0
	for _, n := range nonces {
		require.GreaterOrEqual(t, n, int64(0))
		require.Less(t, n, int64(1)<<62, "a nonce has 62 bits")
		anySet |= n
		anyClear |= ^n
		if n&1023 != 0 {
			lowBits++
		}
	}
	require.NotZero(t, lowBits, "the low 10 bits are not always 0")
	for bit := 0; bit < 62; bit++ {
		require.NotZero(t, anySet&(1<<bit), "bit %d is clear in every nonce", bit)
		require.NotZero(t, anyClear&(1<<bit), "bit %d is set in every nonce", bit)
	}
}

func noncesOf(t *testing.T, ids []string) []int64 {
	t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		_, nonce, err := wharf.ParseID(id)
		require.NoError(t, err)
		out[i] = nonce
	}
	return out
}

// Table mode: the outbox's default draws 62 random bits, for the SQL enqueue
// and for Client.Enqueue alike.
func TestTableNoncesHave62RandomBits(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	var ids []string
	rows, err := b.pool.Query(ctx, `SELECT `+b.schema+`.enqueue('nonce.test', NULL, '{}')::text FROM generate_series(1, 5000)`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	requireRandomNonces(t, noncesOf(t, ids))

	c := adminClient(t, b)
	msgs := make([]wharf.Message, 5000)
	for i := range msgs {
		msgs[i] = wharf.Message{Topic: "nonce.go", Payload: []byte(`{}`)}
	}
	ids, err = c.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	requireRandomNonces(t, noncesOf(t, ids))
}

// WAL mode: the SQL enqueue draws 62 random bits too.
func TestWALNoncesHave62RandomBits(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	var ids []string
	rows, err := b.pool.Query(context.Background(), `SELECT `+b.schema+`.enqueue('nonce.test', NULL, '{}')::text FROM generate_series(1, 5000)`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	requireRandomNonces(t, noncesOf(t, ids))
}
