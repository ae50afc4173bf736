package wharf

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
)

// Client.mode values: the outbox's mode, read from the database on first use
// and kept; a producer that finds the mode changed under it reads it again.
const (
	modeUnknown int32 = iota
	modeTable
	modeWAL
)

// isWAL reports whether the outbox is in WAL mode (wharfmigrate.SetWALMode),
// asking the database only the first time.
func (c *Client) isWAL(ctx context.Context, queryRow func(ctx context.Context, sql string, args ...any) rowScan) (bool, error) {
	switch c.mode.Load() {
	case modeTable:
		return false, nil
	case modeWAL:
		return true, nil
	}
	var wal bool
	if err := queryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, c.cfg.Schema+".enqueue_wal(bytea)").Scan(&wal); err != nil {
		return false, fmt.Errorf("wharf: read the outbox's mode: %w", err)
	}
	if wal {
		c.mode.Store(modeWAL)
	} else {
		c.mode.Store(modeTable)
	}
	return wal, nil
}

type rowScan interface{ Scan(dest ...any) error }

// modeChanged forgets the outbox's mode when err says that it is not what the
// client thought (switched to WAL mode, or a WAL function missing), so the
// next call reads it again.
func (c *Client) modeChanged(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "55000" || pgErr.Code == "42883") {
		c.mode.Store(modeUnknown)
	}
}

// walContent encodes msgs as one content (internal/walmsg), each with a
// random nonce; the seq fields are 0: a message's seq is where the WAL record
// that carries it ends (walmsg.FirstSeq), known once it is written.
func walContent(msgs []Message) ([]byte, []int64, error) {
	recs := make([]walmsg.Record, len(msgs))
	nonces := make([]int64, len(msgs))
	raw := make([]byte, 8*len(msgs))
	_, _ = rand.Read(raw)
	for i := range msgs {
		m := &msgs[i]
		if m.DedupKey != "" {
			return nil, nil, errInvalidMessage("wharf: message %d: DedupKey works only in an outbox in table mode (a WAL outbox has no table to look the key up in); drop it, or use a table outbox", i)
		}
		nonces[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]) >> 2) // nonceBits
		recs[i] = walmsg.Record{Nonce: nonces[i], Topic: m.Topic, Key: m.Key, Headers: m.Headers, DeliverAt: m.DeliverAt, Payload: m.Payload}
	}
	content, err := walmsg.Append(nil, recs)
	if err != nil {
		return nil, nil, errInvalidMessage("wharf: %v", err)
	}
	return content, nonces, nil
}

// walIDs turns the end position of the emitted content into the ids.
func walIDs(end string, nonces []int64) ([]string, error) {
	lsn, err := walstream.ParseLSN(end)
	if err != nil {
		return nil, fmt.Errorf("wharf: the WAL enqueue returned %q: %w", end, err)
	}
	first := walmsg.FirstSeq(uint64(lsn), len(nonces))
	ids := make([]string, len(nonces))
	for i, n := range nonces {
		ids[i] = FormatID(first+int64(i), n)
	}
	return ids, nil
}

func (c *Client) walEnqueueSQL() string {
	return `SELECT ` + c.cfg.Schema + `.enqueue_wal($1)::text`
}

// enqueueWAL is EnqueueTx for an outbox in WAL mode: the messages become one
// transactional logical decoding message of the outbox's prefix, written to
// the WAL only, in one round trip.
//
// Messages of more than walContentBytes go as several logical messages, each
// of at most walContentBytes (or one message), in the same transaction: the
// relay decodes a logical message whole, and bounds its memory by moving a
// large transaction to the outbox table between logical messages.
func (c *Client) enqueueWAL(ctx context.Context, queryRow func(ctx context.Context, sql string, args ...any) rowScan, msgs []Message) ([]string, error) {
	var ids []string
	for len(msgs) > 0 {
		n, size := 0, 0
		for n < len(msgs) && (n == 0 || size+walSize(&msgs[n]) <= walContentBytes) {
			size += walSize(&msgs[n])
			n++
		}
		content, nonces, err := walContent(msgs[:n])
		if err != nil {
			return nil, err
		}
		var end string
		if err := queryRow(ctx, c.walEnqueueSQL(), content).Scan(&end); err != nil {
			c.modeChanged(err)
			return nil, wrapEnqueueErr(err)
		}
		got, err := walIDs(end, nonces)
		if err != nil {
			return nil, err
		}
		if ids == nil {
			ids = make([]string, 0, len(msgs))
		}
		ids = append(ids, got...)
		msgs = msgs[n:]
	}
	return ids, nil
}

// walContentBytes bounds the size of one logical message EnqueueTx writes
// (walSize of its messages).
const walContentBytes = 1 << 20

// walSize approximates what m takes in a content.
func walSize(m *Message) int {
	n := 64 + len(m.Topic) + len(m.Key) + len(m.Payload)
	for k, v := range m.Headers {
		n += 8 + len(k) + len(v)
	}
	return n
}

func pgxQueryRow(q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) func(ctx context.Context, sql string, args ...any) rowScan {
	return func(ctx context.Context, sql string, args ...any) rowScan { return q.QueryRow(ctx, sql, args...) }
}

func sqlQueryRow(tx *sql.Tx) func(ctx context.Context, sql string, args ...any) rowScan {
	return func(ctx context.Context, sql string, args ...any) rowScan {
		return tx.QueryRowContext(ctx, sql, args...)
	}
}
