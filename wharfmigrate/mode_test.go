package wharfmigrate_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// logical returns a pool on a cluster with wal_level=logical and a fresh
// schema name; the schema is dropped at cleanup.
func logical(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wm_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", schema)
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+schema)
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	return pool, schema
}

func walObjects(t *testing.T, pool *pgxpool.Pool, schema string) (slot, pub bool) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND plugin = 'pgoutput'),
    EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, schema).Scan(&slot, &pub))
	return slot, pub
}

// SetWALMode switches an empty outbox: the slot and the publication exist,
// rows in the outbox table are refused with an error that says why, the SQL
// enqueue writes to the WAL and returns an id, a second call changes
// nothing, and reverting the migrations removes the slot and the
// publication with the schema.
func TestSetWALMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := logical(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	mode, err := m.Mode(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.ModeTable, mode)

	require.NoError(t, m.SetWALMode(ctx, pool))
	mode, err = m.Mode(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.ModeWAL, mode)
	slot, pub := walObjects(t, pool, schema)
	require.True(t, slot && pub, "slot %v publication %v", slot, pub)
	require.NoError(t, m.SetWALMode(ctx, pool))

	_, err = pool.Exec(ctx, "INSERT INTO "+schema+".outbox (topic, payload) VALUES ('t', 'x')")
	require.ErrorContains(t, err, "is in WAL mode")

	var id, lsn string
	require.NoError(t, pool.QueryRow(ctx, "SELECT "+schema+".enqueue('orders', 'k1', '{\"a\":1}', '{\"h\":\"v\"}')::text, pg_current_wal_lsn()::text").Scan(&id, &lsn))
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
	require.Zero(t, n)
	_, err = pool.Exec(ctx, "SELECT "+schema+".enqueue('orders', 'k1', '{}', '{}', NULL, 'dedup')")
	require.ErrorContains(t, err, "dedup_key works only in an outbox in table mode")

	_, err = m.Down(ctx, pool, 0)
	require.NoError(t, err)
	slot, pub = walObjects(t, pool, schema)
	require.False(t, slot || pub, "slot %v publication %v left after migrate down", slot, pub)
	require.False(t, schemaExists(t, pool, schema))
}

// The SQL enqueue writes the content the relay decodes (the Go encoder's
// format), and returns the id the relay gives the message: the seq is the
// last byte of the WAL record (walmsg.FirstSeq).
func TestSQLEnqueueWritesTheRelaysFormat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := logical(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	// Decoding reads flushed WAL only: commit with synchronous_commit on
	// (the test clusters run with it off).
	var id string
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = on`)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SELECT `+schema+`.enqueue_bytes('orders', 'k1', '\x0102', '{"h":"v"}', '2030-01-02 03:04:05+00')::text`).Scan(&id))
	require.NoError(t, tx.Commit(ctx))
	// pgoutput's message: 'M', flags, the record's end (8 bytes), the
	// prefix (NUL-terminated), the content's length (4), the content. The
	// slot decodes every logical message of the database, other tests'
	// too: this outbox's is the one with its prefix.
	var data, rest []byte
	var nul int
	rows, err := pool.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL,
    'proto_version', '1', 'publication_names', $1::text, 'messages', 'true') WHERE get_byte(data, 0) = 77`, schema)
	require.NoError(t, err)
	var found int
	var d []byte
	_, err = pgx.ForEachRow(rows, []any{&d}, func() error {
		if r := d[10:]; bytes.HasPrefix(r, append([]byte(schema), 0)) {
			data, rest, nul = bytes.Clone(d), bytes.Clone(r), len(schema)
			found++
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, found, "logical messages of prefix %s", schema)
	require.Equal(t, byte(1), data[1], "not transactional")
	end := binary.BigEndian.Uint64(data[2:10])
	content := rest[nul+5:]
	recs, err := walmsg.Decode(content)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	r := recs[0]
	require.Equal(t, "orders", r.Topic)
	require.Equal(t, "k1", r.Key)
	require.Equal(t, []byte{1, 2}, r.Payload)
	require.Equal(t, map[string]string{"h": "v"}, r.Headers)
	require.True(t, r.DeliverAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)), "deliver_at %v", r.DeliverAt)
	require.Equal(t, wharf.FormatID(walmsg.FirstSeq(end, 1), r.Nonce), id)
}

// A server without wal_level=logical, a non-empty outbox: refused with an
// error that says what to do, and nothing left behind.
func TestSetWALModeRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	pool, schema := logical(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT "+schema+".enqueue('t', 'k', '{}')")
	require.NoError(t, err)
	err = m.SetWALMode(ctx, pool)
	require.ErrorContains(t, err, "holds messages: deliver them first (`wharf relay --drain`)")
	slot, pub := walObjects(t, pool, schema)
	require.False(t, slot || pub, "slot %v publication %v left after a refused switch", slot, pub)
	mode, err := m.Mode(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.ModeTable, mode)

	c, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	rp, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer rp.Close()
	_, err = m.Up(ctx, rp)
	require.NoError(t, err)
	err = m.SetWALMode(ctx, rp)
	require.ErrorIs(t, err, wharfmigrate.ErrWALLevel)
	require.ErrorContains(t, err, "wal_level=replica: set wal_level = logical")
}

// walmsg computes lanes without importing this package.
func TestLaneCountsAgree(t *testing.T) {
	require.Equal(t, wharfmigrate.Lanes, walmsg.Lanes)
}

// A role that may create the slot but not revoke pg_logical_emit_message
// from PUBLIC is refused before anything changes, with one line naming the
// SQL a superuser must run; once a superuser ran it, the same role
// switches the outbox, and PUBLIC still may not emit.
func TestSetWALModeRefusesWhileAnyRoleCanEmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, u, db := testdb.LogicalDatabase(t, "wmdb")
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	owner, schema := "wo_"+hex.EncodeToString(rb[:]), "wm_"+hex.EncodeToString(rb[:])
	_, err := admin.Exec(ctx, "CREATE ROLE "+owner+" LOGIN REPLICATION PASSWORD 'pw'; GRANT CREATE ON DATABASE "+db+" TO "+owner)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE; SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+schema+"'; DROP PUBLICATION IF EXISTS "+schema+"; DROP OWNED BY "+owner)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+owner)
	})
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = owner, "pw"
	op, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer op.Close()
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, op)
	require.NoError(t, err)

	require.ErrorContains(t, m.CheckWALMode(ctx, op), "cannot revoke it")
	refusal := m.SetWALMode(ctx, op)
	require.ErrorContains(t, refusal, "any role can call pg_logical_emit_message, and role "+owner+" cannot revoke it: have a superuser run REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,bytea), pg_catalog.pg_logical_emit_message(boolean,text,text) FROM PUBLIC; GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) TO "+owner+"; then run this again")
	require.NotContains(t, refusal.Error(), "\n")
	mode, err := m.Mode(ctx, op)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.ModeTable, mode)
	slot, pub := walObjects(t, admin, schema)
	require.False(t, slot || pub, "slot %v publication %v after a refusal", slot, pub)

	_, fix, ok := strings.Cut(refusal.Error(), "have a superuser run ")
	require.True(t, ok)
	fix, _, _ = strings.Cut(fix, "; then run this again")
	_, err = admin.Exec(ctx, fix)
	require.NoError(t, err, "the SQL the error names")
	rep, err := m.SetWALModeReport(ctx, op)
	require.NoError(t, err)
	require.True(t, rep.Switched)
	require.Empty(t, rep.Revoked)
	var public bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT bool_or(has_function_privilege('public', p.oid, 'EXECUTE')) FROM pg_proc p WHERE proname = 'pg_logical_emit_message'`).Scan(&public))
	require.False(t, public)
	var id string
	require.NoError(t, op.QueryRow(ctx, "SELECT "+schema+".enqueue('t', 'k', '{}')::text").Scan(&id), "the owner enqueues through enqueue_wal")
	require.NoError(t, m.CheckWALMode(ctx, op))
}

// A slot invalidated by max_slot_wal_keep_size ('lost') cannot be streamed
// again: enqueueing is refused while it is, and SetWALModeReport drops it
// and creates it again.
func TestSetWALModeRecreatesALostSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"wal_level": "logical", "max_slot_wal_keep_size": "1MB", "min_wal_size": "32MB"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer pool.Close()
	m, err := wharfmigrate.New("lost")
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	_, err = pool.Exec(ctx, "SELECT lost.enqueue('t', 'k', '{}')")
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS filler (b text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); SELECT pg_switch_wal(); CHECKPOINT")
		require.NoError(t, err)
		state, err := m.SlotState(ctx, pool)
		require.NoError(t, err)
		return state == wharfmigrate.SlotLost
	}, 60*time.Second, 10*time.Millisecond, "the slot was not invalidated")

	_, err = pool.Exec(ctx, "SELECT lost.enqueue('t', 'k', '{}')")
	require.ErrorContains(t, err, "replication slot lost is missing or lost")
	rep, err := m.SetWALModeReport(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.SlotLost, rep.Slot)
	state, err := m.SlotState(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, wharfmigrate.SlotOK, state)
	_, err = pool.Exec(ctx, "SELECT lost.enqueue('t', 'k', '{}')")
	require.NoError(t, err)
}

// An outbox switched to WAL mode by an earlier build has a wal_progress
// without the columns that name the WAL history a position belongs to:
// SetWALMode on it adds them (empty: the relay does not use a position
// without them) and keeps the position; running it again changes nothing.
func TestSetWALModeAddsTheHistoryColumnsToAnEarlierOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := logical(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, pool))
	_, err = pool.Exec(ctx, "ALTER TABLE "+schema+".wal_progress DROP COLUMN system_identifier, DROP COLUMN timeline_id; UPDATE "+schema+".wal_progress SET settled = '0/1234'")
	require.NoError(t, err)

	for i := 0; i < 2; i++ {
		require.NoError(t, m.SetWALMode(ctx, pool))
		var settled string
		var sysid *int64
		var timeline *int32
		require.NoError(t, pool.QueryRow(ctx, "SELECT settled::text, system_identifier, timeline_id FROM "+schema+".wal_progress").Scan(&settled, &sysid, &timeline))
		require.Equal(t, "0/1234", settled)
		require.Nil(t, sysid)
		require.Nil(t, timeline)
	}
}
