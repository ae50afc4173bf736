package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/walstream"
)

// What is particular to an outbox in WAL mode: its messages are logical
// decoding messages of the outbox's prefix (the schema), streamed by one
// relay from the replication slot named after the schema. "Drained" means
// the slot is confirmed past the WAL that holds them.

// wal reports whether the bench's outbox is in WAL mode.
func (e *env) wal() bool { return e.o.OutboxMode == "wal" }

// newTracker is the tracker for the outbox's seqs: dense for a table
// outbox, sparse for a WAL outbox (see tracker).
func (e *env) newTracker(start time.Time, warmup time.Duration) *tracker {
	if e.wal() {
		return newSparseTracker(start, warmup)
	}
	return newTracker(start, warmup)
}

// insertLSN is the WAL insert position now.
func (e *env) insertLSN(ctx context.Context) (walstream.LSN, error) {
	var s string
	if err := e.ctl.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, err
	}
	return walstream.ParseLSN(s)
}

// advanceSlot moves the outbox's slot, which no relay may be streaming, to
// the WAL position now: whatever it had not confirmed is skipped, as the
// table path deletes the outbox's rows. It returns how many bytes of WAL it
// skipped. A slot advances only over flushed WAL, and WAL written without a
// synchronous commit can wait unflushed, so a transaction committing with
// synchronous_commit on (an empty logical message of the emit limit's
// prefix, which no relay keeps) flushes everything before it first. A
// relay's walsender ends a moment after the relay stopped, so an active
// slot is retried for a few seconds.
func (e *env) advanceSlot(ctx context.Context, schema string) (int64, error) {
	confirmed := func() (walstream.LSN, error) {
		var s string
		if err := e.ctl.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", schema).Scan(&s); err != nil {
			return 0, err
		}
		return walstream.ParseLSN(s)
	}
	from, err := confirmed()
	if err != nil {
		return 0, err
	}
	err = pgx.BeginFunc(ctx, e.ctl, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, ''::bytea)`, emitPrefix(schema))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("flushing the WAL: %w", err)
	}
	for i := 0; ; i++ {
		_, err = e.ctl.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_flush_lsn())`, schema)
		var pgErr *pgconn.PgError
		if err == nil || i == 100 || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use
			break
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if err != nil {
		return 0, fmt.Errorf("advancing the replication slot %s: %w", schema, err)
	}
	to, err := confirmed()
	if err != nil {
		return 0, err
	}
	return int64(to) - int64(from), nil
}

// emitPrefix is the prefix of the emit limit's logical messages. It must not
// be the outbox's (its schema), or the relay would take them for outbox
// messages it cannot decode and dead-letter them: a schema name starts with
// a letter or an underscore, so a prefix starting with "~" is no outbox's.
// It is as long as the outbox's, so that the bare emit's WAL per message,
// which carries the prefix in every message, compares fairly with Wharf's,
// which carries it once per enqueue call. The relay's stream keeps only the
// messages of its own prefix (walstream.Options.Prefix).
func emitPrefix(schema string) string { return "~" + schema[1:] }

// emitLimit measures the emit limit in schema for Duration: the same
// producers and payloads as Wharf's enqueue, ProducerBatch messages per
// transaction, each one bare pg_logical_emit_message of the payload. It
// returns the rate and the WAL written per message.
func (e *env) emitLimit(ctx context.Context, schema string) (rate, walPerMsg float64, err error) {
	o := e.o
	if _, err := e.quiesce(ctx); err != nil {
		return 0, 0, err
	}
	pool, err := e.producerPool(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	from, err := e.insertLSN(ctx)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	p := &producers{o: o, newWriter: emitWriter(o, pool, emitPrefix(schema)), measureFrom: start}
	sm := newSampler(e, schema, start, nil, false, "emit limit")
	sm.produced, sm.noRelay = &p.produced, true
	defer sm.stop()
	if err := e.runFlatOut(ctx, p, sm, start); err != nil {
		return 0, 0, fmt.Errorf("emit limit: %w", err)
	}
	to, err := e.insertLSN(ctx)
	if err != nil {
		return 0, 0, err
	}
	rate = float64(p.inWindow.Load()) / o.Duration.Seconds()
	if n := p.produced.Load(); n > 0 {
		walPerMsg = float64(to-from) / float64(n)
	}
	return rate, walPerMsg, nil
}

// emitSQL emits one transactional logical message per payload.
const emitSQL = `SELECT count(pg_logical_emit_message(true, $1, p)) FROM unnest($2::bytea[]) p`

// emitWriter writes ProducerBatch payloads as as many logical messages of
// prefix in a transaction of its own (BEGIN, the statement, COMMIT: the
// enqueue's round trips).
func emitWriter(o Options, pool *pgxpool.Pool, prefix string) func() batchWriter {
	payload := makePayload(o.PayloadBytes)
	return func() batchWriter {
		payloads := make([][]byte, o.ProducerBatch)
		for i := range payloads {
			payloads[i] = payload
		}
		return func(ctx context.Context, _ int64) (int, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			var n int
			if err := tx.QueryRow(ctx, emitSQL, prefix, payloads).Scan(&n); err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
			if err := tx.Commit(ctx); err != nil {
				return 0, err
			}
			if n != len(payloads) {
				return 0, fmt.Errorf("emitted %d logical messages of %d", n, len(payloads))
			}
			return n, nil
		}
	}
}

// walMarker emits an empty transactional logical message of the emit
// limit's prefix and returns its position. It follows the WAL of Wharf's
// enqueue phase: the relay's stream brings its transaction (with the
// message filtered out by prefix), which settles at once, so the relay
// confirms past the marker as soon as every outbox message before it is
// settled, without decoding the WAL that later phases wrote after it.
func (e *env) walMarker(ctx context.Context, schema string) (walstream.LSN, error) {
	var s string
	if err := e.ctl.QueryRow(ctx, `SELECT pg_logical_emit_message(true, $1, ''::bytea)::text`, emitPrefix(schema)).Scan(&s); err != nil {
		return 0, err
	}
	return walstream.ParseLSN(s)
}

// deadLetters counts the outbox's dead letters.
func (e *env) deadLetters(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.ctl.QueryRow(ctx, "SELECT count(*) FROM "+schema+".dead_letters").Scan(&n)
	return n, err
}
