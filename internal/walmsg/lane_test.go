package walmsg

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Lane agrees with the server's hashtext(key) & 63 (the table outbox's lane
// column) for keys of every length a 12-byte block and its tail can take,
// multi-byte UTF-8 included, and hashBytes with hashtext itself.
func TestLaneMatchesHashtext(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019-_:/ éüß日本語🙂")
	keys := []string{"", "a", "order-1", strings.Repeat("x", 12), strings.Repeat("y", 24), strings.Repeat("日本", 40)}
	for n := 0; n < 2000; n++ {
		var sb strings.Builder
		for range rng.IntN(40) {
			sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		keys = append(keys, sb.String())
	}
	rows, err := conn.Query(ctx, `SELECT k, hashtext(k), (hashtext(k) & 63)::smallint FROM unnest($1::text[]) AS k`, keys)
	require.NoError(t, err)
	defer rows.Close()
	checked := 0
	for rows.Next() {
		var k string
		var h int32
		var lane int16
		require.NoError(t, rows.Scan(&k, &h, &lane))
		require.Equal(t, uint32(h), hashBytes([]byte(k)), "hash_bytes of %q (%d bytes)", k, len(k))
		require.Equal(t, lane, Lane(k), "lane of %q", k)
		checked++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(keys), checked, "keys the server hashed")
}
