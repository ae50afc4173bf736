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
func (m *Migrator) Mode(ctx context.Context, q querier) (Mode, error) {
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
// REPLICATION attribute (or superuser) and CREATE on the database. Calling
// it on an outbox already in WAL mode changes nothing.
//
// The slot keeps the WAL it has not confirmed: a WAL outbox whose relays are
// stopped for long fills the disk unless max_slot_wal_keep_size bounds it
// (which invalidates the slot instead; see the README).
func (m *Migrator) SetWALMode(ctx context.Context, conn Conn) error {
	// Three transactions: pgoutput looks the publication up with the
	// snapshot of the WAL it decodes, so the publication must be committed
	// before the slot's starting point; a logical slot must be created by
	// a transaction that has written nothing; and the rest.
	var pubCreated, slotCreated bool
	err := m.inTx(ctx, conn, func(tx pgx.Tx) error {
		if err := m.Check(ctx, tx); err != nil {
			return err
		}
		if mode, err := m.Mode(ctx, tx); err != nil || mode == ModeWAL {
			if err == nil {
				err = errAlready
			}
			return err
		}
		var level string
		if err := tx.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
			return fmt.Errorf("wharfmigrate: %w", err)
		}
		if level != "logical" {
			return fmt.Errorf("wharfmigrate: %w, and the server runs with wal_level=%s: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", ErrWALLevel, level)
		}
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
	if errors.Is(err, errAlready) {
		// An outbox switched by an earlier build lacks the progress table
		// and lets no spilled message into the table.
		return m.inTx(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, strings.ReplaceAll(progressTableSQL+refuseRowsSQL, "{{schema}}", m.schema))
			return err
		})
	}
	if err == nil {
		err = m.inTx(ctx, conn, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, m.schema).Scan(&slotCreated); err != nil {
				return fmt.Errorf("wharfmigrate: %w", err)
			}
			if slotCreated {
				if _, err := tx.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, m.schema); err != nil {
					return explainWALErr("create the replication slot "+m.schema, err)
				}
			}
			return nil
		})
	}
	if err == nil {
		err = m.inTx(ctx, conn, func(tx pgx.Tx) error { return m.switchToWAL(ctx, tx) })
	}
	if err != nil {
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
	return err
}

var errAlready = errors.New("already in WAL mode")

// progressTableSQL creates the table where the relay records the end of the
// longest run of streamed transactions whose messages are all settled.
// PostgreSQL saves a logical slot's confirmed position only at checkpoints,
// so after a crash the slot starts from an older one; the relay skips what
// ends at or before the recorded position. The streaming relay also records
// the commit time of the oldest message it holds unsettled, for status.
const progressTableSQL = `
CREATE TABLE IF NOT EXISTS {{schema}}.wal_progress (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    settled pg_lsn NOT NULL
);
ALTER TABLE {{schema}}.wal_progress
    ADD COLUMN IF NOT EXISTS oldest_unsettled timestamptz,
    ADD COLUMN IF NOT EXISTS recorded_at timestamptz;
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

-- What producers emit through: one call per enqueue call, whose messages
-- the content carries. It exists only in WAL mode, so a producer that
-- writes to the WAL fails on an outbox in table mode.
CREATE FUNCTION {{schema}}.enqueue_wal(content bytea) RETURNS pg_lsn
LANGUAGE sql AS $fn$ SELECT pg_logical_emit_message(true, '{{schema}}', content) $fn$;
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
		strings.NewReplacer("{{progress}}", progressTableSQL, "{{refuse}}", refuseRowsSQL).Replace(body))
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
