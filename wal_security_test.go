package wharf_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// intruder creates a role with no grant and returns a function that runs
// sql as that role, in a transaction of its own that commits.
func intruder(t *testing.T, b *testBundle) func(sql string, args ...any) error {
	t.Helper()
	ctx := context.Background()
	role := b.schema + "_intruder"
	_, err := b.pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	return func(sql string, args ...any) error {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

func requireSQLState(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, msgAndArgs...)
}

// deadLetters returns the dead letters of b's outbox.
func deadLetters(t *testing.T, b *testBundle) []wharf.DeadLetter {
	t.Helper()
	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	dead, err := c.DeadLetters(context.Background(), wharf.DeadLetterFilter{})
	require.NoError(t, err)
	return dead
}

// In WAL mode only producers write messages: no overload of
// pg_logical_emit_message is executable by PUBLIC any more, so a role with
// no grant can neither emit a message of the outbox's prefix nor call
// enqueue_wal, which runs with its owner's rights and a fixed search_path.
func TestWALOnlyProducersCanWriteMessages(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	as := intruder(t, b)

	rows, err := b.pool.Query(ctx, `SELECT p.oid::regprocedure::text, has_function_privilege('public', p.oid, 'EXECUTE')
FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace`)
	require.NoError(t, err)
	type overload struct {
		Name   string
		Public bool
	}
	overloads, err := pgx.CollectRows(rows, pgx.RowToStructByPos[overload])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(overloads), 2)
	for _, o := range overloads {
		require.False(t, o.Public, "PUBLIC may execute %s", o.Name)
	}

	content, err := walmsg.Append(nil, []walmsg.Record{{Nonce: 1, Topic: "t", Payload: []byte("from a role with no grant")}})
	require.NoError(t, err)
	requireSQLState(t, as("SELECT pg_logical_emit_message(true, $1, $2::bytea)", b.schema, content), "42501")
	requireSQLState(t, as("SELECT pg_logical_emit_message(true, $1, $2::text)", b.schema, "x"), "42501")
	requireSQLState(t, as("SELECT "+b.schema+".enqueue_wal($1::bytea)", content), "42501")

	var definer bool
	var config []string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT prosecdef, proconfig FROM pg_proc WHERE oid = $1::regprocedure`,
		b.schema+".enqueue_wal(bytea)").Scan(&definer, &config))
	require.True(t, definer, "enqueue_wal runs with its owner's rights")
	require.Equal(t, []string{"search_path=pg_catalog, pg_temp"}, config)
}

// A content that names a seq (the one of a message the relay holds) was not
// written by Wharf's enqueue: the relay dead-letters it whole and delivers
// nothing of it. The held message is delivered once, at its deliver_at, with
// its own payload, and the slot moves past it.
func TestWALContentNamingASeqIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	rec, _ := runRelay(t, b, nil, nil)
	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	victim := commitMessages(t, b, wharf.Message{Topic: "t", Key: "victim", Payload: []byte("legit"), DeliverAt: dbNow.Add(3 * time.Second)})
	victimEnd := b.committedTo()
	seq, _, err := wharf.ParseID(victim[0])
	require.NoError(t, err)

	// Emitted as a superuser, who still may.
	content, err := walmsg.Append(nil, []walmsg.Record{
		{Nonce: 1, Topic: "t", Key: "injected", Payload: []byte("beside the forged one")},
		{Seq: seq, Nonce: 2, Topic: "t", Key: "victim", Payload: []byte("evil")},
	})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", b.schema, content)
	require.NoError(t, err)
	after := commitMessages(t, b, wharf.Message{Topic: "t", Key: "victim", Payload: []byte("after")})

	requireAllDeliveredWithin(t, rec, append(victim, after...), 60*time.Second, "the held message and the one after it")
	for _, m := range rec.snapshot() {
		require.NotContains(t, []string{"evil", "beside the forged one"}, string(m.Payload), "delivered a message of the forged content")
	}
	require.Equal(t, 1, deliveredIDs(rec.snapshot())[victim[0]])
	for _, m := range rec.snapshot() {
		if m.ID == victim[0] {
			require.Equal(t, "legit", string(m.Payload))
		}
	}
	dead := deadLetters(t, b)
	require.Len(t, dead, 1)
	require.Equal(t, "wharf.malformed", dead[0].Topic)
	require.Equal(t, content, dead[0].Payload, "the raw content is kept")
	require.Contains(t, dead[0].LastError, "carries seq")
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= victimEnd }, 60*time.Second, 20*time.Millisecond,
		"the slot stays behind the held message")
}

// Records Wharf's enqueue never writes (a negative seq, which once gave an
// unkeyed message a negative lane and panicked the stream with its lock
// held; no topic; a topic with a NUL byte) are dead-lettered: the messages
// committed after them are delivered, and the relay stops cleanly.
func TestWALMalformedRecordsDoNotWedgeTheRelay(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	for _, r := range []walmsg.Record{
		{Seq: -5, Nonce: 1, Topic: "t", Payload: []byte("negative seq")},
		{Nonce: 1, Topic: "", Payload: []byte("no topic")},
		{Nonce: 1, Topic: "a\x00b", Key: "k", Payload: []byte("NUL")},
	} {
		content, err := walmsg.Append(nil, []walmsg.Record{r})
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", b.schema, content)
		require.NoError(t, err)
	}
	after := commitMessages(t, b, keyed("after", 3, 3)...)
	after = append(after, commitMessages(t, b, wharf.Message{Topic: "t", Payload: []byte("unkeyed")})...)
	rec, stop := runRelay(t, b, nil, nil)
	requireAllDeliveredWithin(t, rec, after, 60*time.Second, "the messages after the malformed ones")
	require.Len(t, rec.snapshot(), len(after), "a malformed record was delivered")
	dead := deadLetters(t, b)
	require.Len(t, dead, 3)
	for _, d := range dead {
		require.Equal(t, "wharf.malformed", d.Topic)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not stop")
	}
}

// While the slot is missing nothing reads the WAL: every enqueue route fails
// with an error naming the fix, so nothing is committed where no relay
// reads. `wharf migrate up --mode wal` (SetWALModeReport) creates the slot
// again and says so; enqueueing works again and is delivered.
func TestWALEnqueueRefusedWhileTheSlotIsMissing(t *testing.T) {
	t.Parallel()
	b := walDB(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", b.schema)
	require.NoError(t, err)
	m, err := wharfmigrate.New(b.schema)
	require.NoError(t, err)
	state, err := m.SlotState(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.SlotMissing, state)

	c, err := wharf.NewClient(b.pool, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = c.EnqueueTx(ctx, tx, wharf.Message{Topic: "t", Payload: []byte("x")})
	require.NoError(t, tx.Rollback(ctx))
	requireSQLState(t, err, "55000")
	require.ErrorContains(t, err, "replication slot "+b.schema+" is missing or lost")
	require.ErrorContains(t, err, "wharf migrate up --mode wal --schema "+b.schema)
	_, err = b.pool.Exec(ctx, "SELECT "+b.schema+".enqueue('t', 'k', '{}'::jsonb)")
	requireSQLState(t, err, "55000", "the SQL enqueue")

	// A relay shows it: not ready, and the slot gauge set.
	rc, rec, _ := runRelayClient(t, b, nil, nil)
	require.Eventually(t, func() bool { return rc.Metrics().WALSlotGone.Load() == 1 }, 60*time.Second, 10*time.Millisecond)
	h := rc.Health(ctx)
	require.False(t, h.Ready)
	require.Contains(t, h.Problems, "the replication slot "+b.schema+" is missing: enqueues are refused until `wharf migrate up --mode wal --schema "+b.schema+"` creates it again")

	rep, err := m.SetWALModeReport(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.SlotMissing, rep.Slot)
	require.False(t, rep.Switched)
	rep, err = m.SetWALModeReport(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.WALReport{}, rep, "a second run changes nothing")

	ids := commitMessages(t, b, keyed("back", 10, 3)...)
	requireAllDeliveredWithin(t, rec, ids, 60*time.Second, "after the slot was created again")
	require.Zero(t, rc.Metrics().WALSlotGone.Load())
	require.Eventually(t, func() bool { return rc.Health(ctx).Ready }, 60*time.Second, 20*time.Millisecond)
}

// A relay of a WAL outbox refuses to start while PUBLIC may execute
// pg_logical_emit_message, with one line naming what to run; and `wharf
// migrate up --mode wal` run again on an outbox an earlier build switched
// (enqueue_wal with the caller's rights, emitting open to PUBLIC) brings it
// up to date, after which the relay starts.
func TestWALRelayRefusesToStartWhileAnyRoleCanEmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, _ := testdb.LogicalDatabase(t, "wsec")
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	schema := "wsec_" + hex.EncodeToString(rb[:])
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	// What an earlier build left: emitting open to PUBLIC, and an
	// enqueue_wal that checks nothing and runs with the caller's rights.
	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), pg_logical_emit_message(boolean, text, bytea) TO PUBLIC;
CREATE OR REPLACE FUNCTION `+schema+`.enqueue_wal(content bytea) RETURNS pg_lsn
LANGUAGE sql AS $fn$ SELECT pg_logical_emit_message(true, '`+schema+`', content) $fn$`)
	require.NoError(t, err)

	cfg := testConfig(schema)
	cfg.Handler = func(context.Context, *wharf.Message) error { return nil }
	c, err := wharf.NewClient(pool, cfg)
	require.NoError(t, err)
	err = c.Start(ctx)
	require.ErrorIs(t, err, wharfmigrate.ErrEmitPublic)
	require.ErrorContains(t, err, "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,bytea), pg_catalog.pg_logical_emit_message(boolean,text,text) FROM PUBLIC")
	require.NotContains(t, err.Error(), "\n")

	rep, err := m.SetWALModeReport(ctx, pool)
	require.NoError(t, err)
	require.Len(t, rep.Revoked, 2)
	require.False(t, rep.Switched)
	var definer bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT prosecdef FROM pg_proc WHERE oid = $1::regprocedure`, schema+".enqueue_wal(bytea)").Scan(&definer))
	require.True(t, definer, "enqueue_wal was not brought up to date")

	c, err = wharf.NewClient(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Stop(ctx))
	for i := 0; i < 50; i++ {
		if _, err = m.Down(ctx, pool, 0); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the walsender ends a moment after the relay
	}
	require.NoError(t, err)
}
