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
