package wharf_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A retry record belongs to the message that failed, not to its seq. After a
// restore the outbox hands out the same seqs again, and a relay of the old
// history may write a failure late: its record, at the seq a new message now
// has, carries the old message's nonce. A relay that takes the lane applies
// it to no other message: the new message is not held for the old one's
// backoff and gets every attempt (MaxAttempts), and its own failure replaces
// the record (which its acknowledgement then removes). A record written
// before schema version 9 (no nonce) still belongs to the message at its seq.
func TestRetryRecordOfAnotherHistoryLeavesANewMessageAlone(t *testing.T) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := l.db(t)
			ids := commitMessages(t, b,
				wharf.Message{Topic: "t", Key: "new", Payload: []byte("new")},
				wharf.Message{Topic: "t", Key: "legacy", Payload: []byte("legacy")})
			record := func(id, key string, nonce *int64, attempts int, in string) {
				t.Helper()
				seq, _, err := wharf.ParseID(id)
				require.NoError(t, err)
				_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.retries (id, lane, nonce, attempts, next_attempt_at, last_error)
VALUES ($1, hashtext($2) & 63, $3, $4, now() + $5::interval, 'an earlier failure')`, seq, key, nonce, attempts, in)
				require.NoError(t, err)
			}
			_, nonce, err := wharf.ParseID(ids[0])
			require.NoError(t, err)
			other := nonce ^ 1
			// Another message's record: due in an hour, one attempt left.
			record(ids[0], "new", &other, 2, "1 hour")
			record(ids[1], "legacy", nil, 2, "0 seconds")

			var failed atomic.Bool
			rec, _ := runRelay(t, b, func(m *wharf.Message) error {
				if m.Key == "new" && failed.CompareAndSwap(false, true) {
					return errors.New("refused once")
				}
				return nil
			}, func(cfg *wharf.Config) { cfg.MaxAttempts = 3 })
			requireAllDelivered(t, rec, ids)
			for _, m := range rec.snapshot() {
				switch m.Key {
				case "new":
					require.Equal(t, 2, m.Attempt, "the new message did not start from its own first attempt")
				case "legacy":
					require.Equal(t, 3, m.Attempt, "a record without a nonce no longer counts for the message at its seq")
				}
			}
			l.requireSettled(t, b)
			var dead int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".dead_letters").Scan(&dead))
			require.Zero(t, dead)
		})
	}
}

// The operators' views count a retry record only for its own message: a
// message at whose seq another message's record lies (a late failure of the
// history before a restore) is neither shown as retrying, nor as holding its
// key's later messages, nor as blocking its key; its own record is.
func TestAdminViewsCountARetryRecordOnlyForItsMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDB(t)
	c := adminClient(t, b)
	ids, err := c.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte("first")},
		wharf.Message{Topic: "t", Key: "k", Payload: []byte("second")})
	require.NoError(t, err)
	seq, nonce, err := wharf.ParseID(ids[0])
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.retries (id, lane, nonce, attempts, next_attempt_at, last_error)
SELECT id, lane, nonce # 1, 4, now() + interval '1 hour', 'another history' FROM `+b.schema+`.outbox WHERE id = $1`, seq)
	require.NoError(t, err)

	pending, err := c.PendingMessages(ctx, wharf.PendingFilter{Limit: 10})
	require.NoError(t, err)
	require.Len(t, pending, 2)
	require.Zero(t, pending[0].Attempts, "another message's retry record counted")
	require.Empty(t, pending[0].LastError)
	require.True(t, pending[0].NextAttemptAt.IsZero())
	require.Nil(t, pending[1].HeldBehind, "held behind a message that is not retrying")
	blocked, err := c.BlockedKeys(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, blocked.Keys, "a key blocked by another message's retry record")

	_, err = b.pool.Exec(ctx, `UPDATE `+b.schema+`.retries SET nonce = $1`, nonce)
	require.NoError(t, err)
	pending, err = c.PendingMessages(ctx, wharf.PendingFilter{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 4, pending[0].Attempts)
	require.Equal(t, "another history", pending[0].LastError)
	require.NotNil(t, pending[1].HeldBehind)
	blocked, err = c.BlockedKeys(ctx, 0)
	require.NoError(t, err)
	require.Len(t, blocked.Keys, 1)
	require.Equal(t, 4, blocked.Keys[0].Attempts)
}
