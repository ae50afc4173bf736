package wharf_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// fillV1 brings b's schema back to migration 1 and fills it as a relay of that
// version would have left it: pending keyed messages, one of them retrying,
// and a dead letter.
func fillV1(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	m, err := wharfmigrate.New(b.schema)
	require.NoError(t, err)
	_, err = m.DownTo(ctx, b.pool, 1)
	require.NoError(t, err)
	for i := 0; i < 30; i++ {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+".enqueue('orders', $1, $2::jsonb)", fmt.Sprintf("k%d", i%3), fmt.Sprintf(`{"n":%d}`, i)).Scan(&id))
	}
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.retries (id, lane, attempts, next_attempt_at, last_error)
SELECT id, lane, 2, now(), 'earlier failure' FROM `+b.schema+`.outbox WHERE id = 4`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.dead_letters (id, topic, key, payload, created_at, attempts, last_error)
VALUES (1000, 'orders', 'k0', '"dead"', now(), 12, 'gave up')`)
	require.NoError(t, err)
}

// An outbox at migration 1 with pending messages, a retry and a dead letter
// upgrades to the global ids without losing or reordering anything; two such
// outboxes give their messages different ids; down and up again works.
func TestUpgradeKeepsPendingMessagesAndMakesIDsUnique(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, c := setupDB(t), setupDB(t)
	fillV1(t, a)
	fillV1(t, c)
	for _, b := range []*testBundle{a, c} {
		m, err := wharfmigrate.New(b.schema)
		require.NoError(t, err)
		_, err = m.Up(ctx, b.pool)
		require.NoError(t, err)
	}

	drain := func(b *testBundle) []wharf.Message {
		rec := &recorder{}
		cfg := testConfig(b.schema)
		cfg.Handler = rec.handle
		client, err := wharf.NewClient(b.pool, cfg)
		require.NoError(t, err)
		require.NoError(t, client.Drain(ctx))
		return rec.snapshot()
	}
	got := map[*testBundle][]wharf.Message{}
	for _, b := range []*testBundle{a, c} {
		msgs := drain(b)
		require.Len(t, deliveredIDs(msgs), 30)
		requireKeyOrder(t, msgs)
		for _, m := range msgs {
			seq, _, err := wharf.ParseID(m.ID)
			require.NoError(t, err)
			require.Equal(t, m.Seq, seq)
			if m.Seq == 4 {
				require.Equal(t, 3, m.Attempt, "the retry's attempt count survives the upgrade")
			}
		}
		require.Equal(t, 0, outboxCount(t, b))
		got[b] = msgs
	}
	ids := map[string]bool{}
	for _, msgs := range got {
		for _, m := range msgs {
			require.Falsef(t, ids[m.ID], "id %s delivered by both outboxes", m.ID)
			ids[m.ID] = true
		}
	}

	// The dead letter from before the upgrade has an id too, and is retried
	// with it.
	client, err := wharf.NewClient(a.pool, testConfig(a.schema))
	require.NoError(t, err)
	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.EqualValues(t, 1000, dead[0].Seq)
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{IDs: []string{dead[0].ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	retried := drain(a)
	require.Len(t, retried, 1)
	require.Equal(t, dead[0].ID, retried[0].ID, "a retried dead letter keeps its id")

	// Down to 1 with rows in place, and up again: new messages get new ids.
	m, err := wharfmigrate.New(a.schema)
	require.NoError(t, err)
	_, err = m.DownTo(ctx, a.pool, 1)
	require.NoError(t, err)
	_, err = m.Up(ctx, a.pool)
	require.NoError(t, err)
	after, err := client.Enqueue(ctx, wharf.Message{Topic: "orders", Key: "k0", Payload: []byte("1")})
	require.NoError(t, err)
	require.False(t, ids[after[0]])
}
