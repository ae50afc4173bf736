package wharfmigrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf/internal/walmsg"
)

// Mode is where an outbox keeps its messages.
type Mode string

const (
	// ModeTable keeps messages as rows of <schema>.outbox (the default).
	ModeTable Mode = "table"
	// ModeWAL keeps messages in the WAL only, as transactional logical
	// decoding messages with the schema's name as prefix; the relay streams
	// them from the logical replication slot named after the schema.
	ModeWAL Mode = "wal"
)

// ErrWALLevel is returned by [Migrator.SetWALMode] when the server does not
// run with wal_level=logical.
var ErrWALLevel = errors.New("WAL mode needs wal_level=logical")

// Mode reports the outbox's mode. An outbox is in WAL mode when its WAL
// enqueue function exists, which SetWALMode creates.
func (m *Migrator) Mode(ctx context.Context, q Querier) (Mode, error) {
	var wal bool
	if err := q.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, m.schema+".enqueue_wal(bytea)").Scan(&wal); err != nil {
		return "", fmt.Errorf("wharfmigrate: read the outbox's mode: %w", err)
	}
	if wal {
		return ModeWAL, nil
	}
	return ModeTable, nil
}

// SetWALMode switches a migrated, empty outbox to WAL mode: it creates the
// publication and the logical replication slot (pgoutput) named after the
// schema, the function producers emit through, a trigger that refuses rows
// in the outbox table (a producer still writing rows would write where no
// relay reads), and replaces <schema>.enqueue_bytes (and so
// <schema>.enqueue) with versions that write to the WAL. The role needs the
// REPLICATION attribute (or superuser) and CREATE on the database.
//
// Only producers may write to a WAL outbox: any role that can call
// pg_logical_emit_message could write a message the relay delivers with its
// own credentials, and PostgreSQL lets PUBLIC call it. SetWALMode revokes
// EXECUTE on every overload from PUBLIC when the role can (a superuser);
// when it cannot and PUBLIC still can call one, it changes nothing and
// returns an error naming the SQL a superuser must run. Producers emit
// through <schema>.enqueue_wal, which runs with its owner's rights and is
// granted only to the producer role ([Migrator.CreateRoles]).
//
// Called on an outbox already in WAL mode, it brings what an earlier build
// created up to date (the revoke, enqueue_wal, the progress table) and
// creates the replication slot again when it is missing or lost (a lost
// slot is dropped first); [Migrator.SetWALModeReport] says what it did.
//
// The slot keeps the WAL it has not confirmed: a WAL outbox whose relays are
// stopped for long fills the disk unless max_slot_wal_keep_size bounds it
// (which invalidates the slot instead; see docs/wal.md).
func (m *Migrator) SetWALMode(ctx context.Context, conn Conn) error {
	_, err := m.SetWALModeReport(ctx, conn)
	return err
}

// WALReport is what [Migrator.SetWALModeReport] changed.
type WALReport struct {
	// Switched is set when the outbox was switched to WAL mode (it was in
	// table mode); otherwise it was in WAL mode already and was brought up
	// to date.
	Switched bool
	// Revoked lists the overloads of pg_logical_emit_message whose EXECUTE
	// was revoked from PUBLIC.
	Revoked []string
	// Slot is what was wrong with the replication slot before it was
	// created: SlotMissing or SlotLost, or "" when it was in place (or
	// created with the switch).
	Slot string
}

// States of a replication slot that [Migrator.SetWALModeReport] repairs
// and [Migrator.SlotState] reports.
const (
	SlotOK      = "ok"
	SlotMissing = "missing"
	SlotLost    = "lost" // invalidated: PostgreSQL removed WAL it had not confirmed
)

// SetWALModeReport is SetWALMode, returning what it changed.
func (m *Migrator) SetWALModeReport(ctx context.Context, conn Conn) (WALReport, error) {
	// Three transactions: pgoutput looks the publication up with the
	// snapshot of the WAL it decodes, so the publication must be committed
	// before the slot's starting point; a logical slot must be created by
	// a transaction that has written nothing; and the rest.
	var rep WALReport
	var pubCreated, slotCreated bool
	err := m.inTx(ctx, conn, func(tx pgx.Tx) error {
		if err := m.Check(ctx, tx); err != nil {
			return err
		}
		mode, err := m.Mode(ctx, tx)
		if err != nil {
			return err
		}
		if err := m.checkWALMode(ctx, tx); err != nil {
			return err
		}
		if rep.Revoked, err = revokeEmit(ctx, tx); err != nil {
			return err
		}
		if mode == ModeWAL {
			// An outbox switched by an earlier build lacks the progress
			// table, lets no spilled message into the table, and has an
			// enqueue_wal that checks nothing and runs with the caller's
			// rights.
			_, err := tx.Exec(ctx, strings.ReplaceAll(progressTableSQL+refuseRowsSQL, "{{schema}}", m.schema)+m.enqueueWAL())
			if err != nil {
				return explainWALErr("bring WAL mode up to date", err)
			}
			return nil
		}
		rep.Switched = true
		if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, m.schema).Scan(&pubCreated); err != nil {
			return fmt.Errorf("wharfmigrate: %w", err)
		}
		if pubCreated {
			// No tables: pgoutput needs a publication to look table
			// changes up in, and this one publishes none.
			if _, err := tx.Exec(ctx, `CREATE PUBLICATION `+m.schema); err != nil {
				return explainWALErr("create the publication "+m.schema, err)
			}
		}
		return nil
	})
	if err == nil {
		var state string
		err = m.inTx(ctx, conn, func(tx pgx.Tx) error {
			var err error
			state, err = m.SlotState(ctx, tx)
			return err
		})
		if err == nil && state == SlotLost {
			// A lost slot cannot be streamed again: drop it first.
			err = m.inTx(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, m.schema); err != nil {
					return explainWALErr("drop the lost replication slot "+m.schema+" (stop the relays first)", err)
				}
				return nil
			})
		}
		if err == nil && state != SlotOK {
			slotCreated = true
			if !rep.Switched {
				rep.Slot = state
			}
			err = m.inTx(ctx, conn, func(tx pgx.Tx) error { return m.createSlot(ctx, tx) })
		}
	}
	if err == nil && rep.Switched {
		err = m.inTx(ctx, conn, func(tx pgx.Tx) error { return m.switchToWAL(ctx, tx) })
	}
	if err != nil && rep.Switched {
		// Leave nothing behind: a slot nobody streams keeps WAL forever.
		_ = m.inTx(ctx, conn, func(tx pgx.Tx) error {
			if slotCreated {
				_, _ = tx.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, m.schema)
			}
			if pubCreated {
				_, _ = tx.Exec(ctx, `DROP PUBLICATION IF EXISTS `+m.schema)
			}
			return nil
		})
	}
	if err != nil {
		return WALReport{}, err
	}
	return rep, nil
}

// createSlot creates the outbox's logical replication slot, with failover
// on PostgreSQL 17 and later (so that a standby that synchronizes slots
// keeps it across a failover).
func (m *Migrator) createSlot(ctx context.Context, tx pgx.Tx) error {
	var version int
	if err := tx.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	sql := `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`
	if version >= 170000 {
		sql = `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	if _, err := tx.Exec(ctx, sql, m.schema); err != nil {
		return explainWALErr("create the replication slot "+m.schema, err)
	}
	return nil
}

// SlotState reports the state of the outbox's replication slot: SlotOK,
// SlotMissing, or SlotLost (invalidated, its wal_status 'lost'). While it is
// missing or lost, enqueue_wal refuses messages.
func (m *Migrator) SlotState(ctx context.Context, q Querier) (string, error) {
	var state string
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT CASE WHEN wal_status = 'lost' THEN 'lost' ELSE 'ok' END
FROM pg_replication_slots WHERE slot_name = $1), 'missing')`, m.schema).Scan(&state)
	if err != nil {
		return "", fmt.Errorf("wharfmigrate: read the replication slot %s: %w", m.schema, err)
	}
	return state, nil
}

// CheckWALMode checks, changing nothing, that this connection's role can
// switch the outbox to WAL mode on this server (or bring it up to date):
// wal_level=logical, the REPLICATION attribute (or superuser), CREATE on
// the database when the publication is still to be created, and that
// pg_logical_emit_message is, or can be, revoked from PUBLIC. Run it before
// migrating, so that a refusal leaves the schema as it was. Each error is
// one line saying what to do.
func (m *Migrator) CheckWALMode(ctx context.Context, q Querier) error {
	return m.checkWALMode(ctx, q)
}

func (m *Migrator) checkWALMode(ctx context.Context, q Querier) error {
	var level, role string
	var super, replication, needPub, canCreate bool
	err := q.QueryRow(ctx, `SELECT current_setting('wal_level'), current_user::text, r.rolsuper, r.rolreplication,
       NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
       has_database_privilege(current_database(), 'CREATE')
FROM pg_roles r WHERE r.rolname = current_user`, m.schema).Scan(&level, &role, &super, &replication, &needPub, &canCreate)
	if err != nil {
		return fmt.Errorf("wharfmigrate: check WAL mode's needs: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("wharfmigrate: %w, and the server runs with wal_level=%s: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", ErrWALLevel, level)
	}
	if !super && !replication {
		return fmt.Errorf("wharfmigrate: WAL mode needs a role with REPLICATION to create the replication slot, and role %s has not: run as a superuser, or have one run ALTER ROLE %s REPLICATION", role, role)
	}
	if !super && needPub && !canCreate {
		return fmt.Errorf("wharfmigrate: WAL mode creates the publication %s, which needs CREATE on the database, and role %s has not: have the database owner run GRANT CREATE ON DATABASE %s TO %s", m.schema, role, pgx.Identifier{m.database(ctx, q)}.Sanitize(), role)
	}
	if super {
		return nil
	}
	public, err := emitOverloads(ctx, q)
	if err != nil {
		return err
	}
	var own bool
	if err := q.QueryRow(ctx, `SELECT has_function_privilege('pg_catalog.pg_logical_emit_message(boolean, text, bytea)', 'EXECUTE')`).Scan(&own); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	var fix []string
	if len(public) > 0 {
		fix = append(fix, revokeEmitSQL(public))
	}
	if !own || len(public) > 0 {
		// enqueue_wal runs with its owner's rights: the owner must be
		// able to emit, also once PUBLIC may not.
		fix = append(fix, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) TO "+role)
	}
	switch {
	case len(public) > 0:
		return fmt.Errorf("wharfmigrate: in WAL mode only producers may write messages, but any role can call pg_logical_emit_message, and role %s cannot revoke it: have a superuser run %s; then run this again", role, strings.Join(fix, "; "))
	case len(fix) > 0:
		return fmt.Errorf("wharfmigrate: producers emit through %s.enqueue_wal, which runs with the rights of role %s, and it may not call pg_logical_emit_message: have a superuser run %s; then run this again", m.schema, role, fix[0])
	}
	return nil
}

// database is the current database's name ("" if it cannot be read).
func (m *Migrator) database(ctx context.Context, q Querier) string {
	var name string
	_ = q.QueryRow(ctx, `SELECT current_database()`).Scan(&name)
	return name
}

// emitOverloads returns the overloads of pg_logical_emit_message that PUBLIC
// may execute (PostgreSQL 17 added one), as regprocedure text.
func emitOverloads(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
  AND has_function_privilege('public', p.oid, 'EXECUTE')
ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("wharfmigrate: read who may call pg_logical_emit_message: %w", err)
	}
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("wharfmigrate: read who may call pg_logical_emit_message: %w", err)
	}
	return public, nil
}

func revokeEmitSQL(overloads []string) string {
	quoted := make([]string, len(overloads))
	for i, o := range overloads {
		quoted[i] = "pg_catalog." + o
	}
	return "REVOKE EXECUTE ON FUNCTION " + strings.Join(quoted, ", ") + " FROM PUBLIC"
}

// revokeEmit revokes EXECUTE on pg_logical_emit_message from PUBLIC where
// PUBLIC has it, and returns the overloads it revoked. checkWALMode has
// made sure the role may (a superuser) or need not.
func revokeEmit(ctx context.Context, tx pgx.Tx) ([]string, error) {
	// Two migrators revoking at once would update the same pg_proc rows
	// ("tuple concurrently updated"): one at a time in the database, and
	// the second sees the first's revoke once it commits.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('wharfmigrate:pg_logical_emit_message'))`); err != nil {
		return nil, fmt.Errorf("wharfmigrate: lock: %w", err)
	}
	public, err := emitOverloads(ctx, tx)
	if err != nil || len(public) == 0 {
		return nil, err
	}
	if _, err := tx.Exec(ctx, revokeEmitSQL(public)); err != nil {
		return nil, explainWALErr("revoke pg_logical_emit_message from PUBLIC", err)
	}
	return public, nil
}

// ErrEmitPublic is returned by [CheckEmitRestricted] while any role may call
// pg_logical_emit_message.
var ErrEmitPublic = errors.New("any role can write messages to the outbox: PUBLIC may execute pg_logical_emit_message")

// CheckEmitRestricted returns an error wrapping ErrEmitPublic, naming the
// SQL a superuser must run, while PUBLIC may execute an overload of
// pg_logical_emit_message in the connection's database: any role could then
// write messages that a relay of a WAL outbox delivers with its own
// credentials. The relay checks it before it streams.
func CheckEmitRestricted(ctx context.Context, q Querier) error {
	public, err := emitOverloads(ctx, q)
	if err != nil {
		return err
	}
	if len(public) > 0 {
		return fmt.Errorf("wharf: %w: run `wharf migrate up --mode wal` as a superuser, or have one run %s", ErrEmitPublic, revokeEmitSQL(public))
	}
	return nil
}

// progressTableSQL creates the table where the relay records the end of the
// longest run of streamed transactions whose messages are all settled.
// PostgreSQL saves a logical slot's confirmed position only at checkpoints,
// so after a crash the slot starts from an older one; the relay skips what
// ends at or before the recorded position. A position names a place in
// one WAL history only: the row also holds the system identifier and the
// timeline it was recorded on, and the relay uses it only on the same ones
// (NULL: recorded by an earlier build, not used). The streaming relay also
// records the commit time of the oldest message it holds unsettled, for
// status. Every statement can run again on an outbox that has the table.
const progressTableSQL = `
CREATE TABLE IF NOT EXISTS {{schema}}.wal_progress (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    settled pg_lsn NOT NULL
);
ALTER TABLE {{schema}}.wal_progress
    ADD COLUMN IF NOT EXISTS oldest_unsettled timestamptz,
    ADD COLUMN IF NOT EXISTS recorded_at timestamptz,
    ADD COLUMN IF NOT EXISTS system_identifier bigint,
    ADD COLUMN IF NOT EXISTS timeline_id integer;
INSERT INTO {{schema}}.wal_progress (settled) VALUES ('0/0') ON CONFLICT DO NOTHING;
`

// refuseRowsSQL is the trigger function that refuses rows in the outbox
// table of a WAL outbox: a producer still in table mode must fail, not write
// where no relay reads. The relay's own rows pass: messages held long in its
// memory (scheduled, or behind a failing one) that it moves to the table,
// in a transaction with wharf.spill set.
const refuseRowsSQL = `
CREATE OR REPLACE FUNCTION {{schema}}.refuse_rows() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('wharf.spill', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'outbox {{schema}} is in WAL mode: enqueue with Wharf (EnqueueTx, Enqueue or {{schema}}.enqueue), which writes to the WAL; a row in this table would never be delivered'
        USING ERRCODE = '55000';
END
$fn$;
`

func (m *Migrator) inTx(ctx context.Context, conn Conn, f func(pgx.Tx) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	return nil
}

func (m *Migrator) switchToWAL(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "wharfmigrate:"+m.schema); err != nil {
		return fmt.Errorf("wharfmigrate: lock: %w", err)
	}
	// Rows already in the table would never be delivered by a relay that
	// streams the WAL.
	if _, err := tx.Exec(ctx, `LOCK TABLE `+m.schema+`.outbox IN EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	var rows bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+m.schema+`.outbox)`).Scan(&rows); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	if rows {
		return fmt.Errorf("wharfmigrate: outbox %s holds messages: deliver them first (`wharf relay --drain`), then switch it to WAL mode", m.schema)
	}
	if _, err := tx.Exec(ctx, m.walModeSQL()); err != nil {
		return explainWALErr("switch to WAL mode", err)
	}
	return nil
}

// walModeSQL creates the WAL mode's objects (see SetWALMode).
func (m *Migrator) walModeSQL() string {
	const body = `
-- One message's content in the format of internal/walmsg (the relay
-- decodes it); the seq field is 0: a message's seq is its position in
-- the WAL, known once it is written.
CREATE FUNCTION {{schema}}.wal_content(bigint, bigint, text, text, timestamptz, jsonb, bytea)
RETURNS bytea LANGUAGE sql IMMUTABLE AS $fn$ SELECT {{content}} $fn$;

{{enqueue_wal}}
-- Only roles granted it may enqueue, as only roles granted INSERT on the
-- outbox table may in table mode (the producer role of wharf migrate roles).
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_wal(bytea) FROM PUBLIC;

{{progress}}
{{refuse}}
CREATE TRIGGER outbox_wal_mode BEFORE INSERT ON {{schema}}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.refuse_rows();

CREATE OR REPLACE FUNCTION {{schema}}.enqueue_bytes(
    topic text, key text, payload bytea, headers jsonb DEFAULT '{}',
    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql AS $fn$
DECLARE
    nonce bigint := (floor(random() * 2147483648)::bigint << 31) | floor(random() * 2147483648)::bigint;
    lsn pg_lsn;
BEGIN
    IF enqueue_bytes.topic IS NULL OR enqueue_bytes.topic = '' THEN
        RAISE EXCEPTION 'wharf.enqueue: topic is required' USING ERRCODE = '22023';
    END IF;
    IF enqueue_bytes.payload IS NULL THEN
        RAISE EXCEPTION 'wharf.enqueue: payload is required (use ''null''::jsonb or ''''::bytea)' USING ERRCODE = '22023';
    END IF;
    IF enqueue_bytes.headers IS NOT NULL AND jsonb_typeof(enqueue_bytes.headers) <> 'object' THEN
        RAISE EXCEPTION 'wharf.enqueue: headers must be a JSON object of strings, got %', jsonb_typeof(enqueue_bytes.headers) USING ERRCODE = '22023';
    END IF;
    IF enqueue_bytes.headers IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(enqueue_bytes.headers) h WHERE jsonb_typeof(h.value) <> 'string') THEN
        RAISE EXCEPTION 'wharf.enqueue: header values must be strings' USING ERRCODE = '22023';
    END IF;
    IF coalesce(enqueue_bytes.dedup_key, '') <> '' THEN
        RAISE EXCEPTION 'wharf.enqueue: dedup_key works only in an outbox in table mode (outbox {{schema}} is in WAL mode, with no table to look the key up in)' USING ERRCODE = '22023';
    END IF;
    lsn := {{schema}}.enqueue_wal({{schema}}.wal_content(0, nonce, enqueue_bytes.topic, NULLIF(enqueue_bytes.key, ''),
        enqueue_bytes.deliver_at, enqueue_bytes.headers, enqueue_bytes.payload));
    -- One message: its seq is the last byte of its record (walmsg.FirstSeq).
    RETURN {{schema}}.message_id((lsn - '0/0'::pg_lsn)::bigint - 1, nonce);
END
$fn$;
`
	return strings.NewReplacer("{{schema}}", m.schema, "{{content}}", walmsg.ContentSQL).Replace(
		strings.NewReplacer("{{progress}}", progressTableSQL, "{{refuse}}", refuseRowsSQL, "{{enqueue_wal}}", enqueueWALSQL).Replace(body))
}

// enqueueWALSQL is what producers emit through: one call per enqueue call,
// whose messages the content carries. It exists only in WAL mode, so a
// producer that writes to the WAL fails on an outbox in table mode. It runs
// with its owner's rights, as PUBLIC may not call pg_logical_emit_message
// (SetWALMode), and refuses while the replication slot is missing or lost:
// nothing would read the message, and the producer's transaction would
// commit a message that is never delivered. CREATE OR REPLACE keeps the
// grants of an existing function.
const enqueueWALSQL = `
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_wal(content bytea) RETURNS pg_lsn
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
                   WHERE slot_name = '{{schema}}' AND wal_status IS DISTINCT FROM 'lost') THEN
        RAISE EXCEPTION 'outbox {{schema}} is in WAL mode, and its replication slot {{schema}} is missing or lost, so no relay would read this message: run ` + "`wharf migrate up --mode wal --schema {{schema}}`" + ` to create the slot again'
            USING ERRCODE = '55000';
    END IF;
    RETURN pg_catalog.pg_logical_emit_message(true, '{{schema}}', content);
END
$fn$;
`

// enqueueWAL is enqueueWALSQL for this migrator's schema.
func (m *Migrator) enqueueWAL() string {
	return strings.ReplaceAll(enqueueWALSQL, "{{schema}}", m.schema)
}

// dropWALMode removes what SetWALMode created outside the schema (the slot
// and the publication), when the outbox is removed. The slot would keep WAL
// forever otherwise.
func (m *Migrator) dropWALMode(ctx context.Context, tx pgx.Tx) error {
	if mode, err := m.Mode(ctx, tx); err != nil || mode != ModeWAL {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, m.schema); err != nil {
		return explainWALErr("drop the replication slot "+m.schema+" (stop the relays first)", err)
	}
	_, err := tx.Exec(ctx, `DROP PUBLICATION IF EXISTS `+m.schema+`;
DROP FUNCTION IF EXISTS `+m.schema+`.enqueue_wal(bytea);
DROP FUNCTION IF EXISTS `+m.schema+`.wal_content(bigint, bigint, text, text, timestamptz, jsonb, bytea);
DROP TRIGGER IF EXISTS outbox_wal_mode ON `+m.schema+`.outbox;
DROP FUNCTION IF EXISTS `+m.schema+`.refuse_rows();
DROP TABLE IF EXISTS `+m.schema+`.wal_progress`)
	if err != nil {
		return fmt.Errorf("wharfmigrate: remove WAL mode: %w", err)
	}
	return nil
}

func explainWALErr(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("wharfmigrate: %s: the role lacks a privilege WAL mode needs (REPLICATION, or CREATE on the database for the publication): %w", what, err)
	}
	return fmt.Errorf("wharfmigrate: %s: %w", what, err)
}
