package wharf_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// Enqueue refuses what PostgreSQL text cannot hold, naming the message and
// the field, before anything reaches the database.
func TestEnqueueRefusesBadInput(t *testing.T) {
	t.Parallel()
	tx, schema := testTx(t)
	client, err := wharf.NewClient(nil, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	for _, c := range []struct {
		msg  wharf.Message
		want string
	}{
		{wharf.Message{Payload: []byte("1")}, "message 0: Topic is required"},
		{wharf.Message{Topic: "t", Key: "bad\xff"}, "message 0: Key must be valid UTF-8 without NUL bytes"},
		{wharf.Message{Topic: "t\x00"}, "message 0: Topic must be valid UTF-8 without NUL bytes"},
		{wharf.Message{Topic: "t", DedupKey: "\xc3"}, "message 0: DedupKey must be valid UTF-8"},
		{wharf.Message{Topic: "t", Headers: map[string]string{"h": "v\x00"}}, `message 0: header "h" must be valid UTF-8 without NUL bytes`},
	} {
		_, err := client.EnqueueTx(ctx, tx, c.msg)
		require.ErrorContains(t, err, c.want)
		require.ErrorIs(t, err, wharf.ErrInvalidMessage, "a refusal before writing anything says so")
	}
	ids, err := client.EnqueueTx(ctx, tx, wharf.Message{Topic: "t", Key: "ok", Payload: []byte("1")})
	require.NoError(t, err, "the transaction is still usable")
	require.Len(t, ids, 1)
	_, err = client.Enqueue(ctx, wharf.Message{Topic: "t"})
	require.ErrorIs(t, err, wharf.ErrNoPool)
}
