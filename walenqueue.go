package wharf

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/wharfhq/wharf/internal/walmsg"
	"github.com/wharfhq/wharf/internal/walstream"
)

// enqueueWAL is EnqueueTx for an outbox in WAL mode (being built: nothing in
// the public API calls it yet): the messages become one transactional
// logical decoding message of the outbox's prefix, written to the WAL only,
// and their ids come from where the server put it (walmsg.FirstSeq) and a
// random nonce each. One round trip, no row.
func (c *Client) enqueueWAL(ctx context.Context, tx pgx.Tx, msgs []Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := validateMessages(msgs); err != nil {
		return nil, err
	}
	if c.cfg.Tracer != nil {
		msgs = c.traceEnqueue(ctx, msgs)
	}
	recs := make([]walmsg.Record, len(msgs))
	nonces := make([]byte, 8*len(msgs))
	_, _ = rand.Read(nonces)
	for i := range msgs {
		m := &msgs[i]
		if m.DedupKey != "" {
			return nil, fmt.Errorf("wharf: message %d: DedupKey works only in an outbox in table mode (a WAL outbox has no table to look the key up in); drop it, or use a table outbox", i)
		}
		recs[i] = walmsg.Record{
			Nonce: int64(binary.LittleEndian.Uint64(nonces[8*i:]) >> 1), Topic: m.Topic, Key: m.Key,
			Headers: m.Headers, DeliverAt: m.DeliverAt, Payload: m.Payload,
		}
	}
	content, err := walmsg.Append(nil, recs)
	if err != nil {
		return nil, fmt.Errorf("wharf: %w", err)
	}
	var end string
	if err := tx.QueryRow(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)::text`, c.cfg.Schema, content).Scan(&end); err != nil {
		return nil, wrapEnqueueErr(err)
	}
	lsn, err := walstream.ParseLSN(end)
	if err != nil {
		return nil, fmt.Errorf("wharf: pg_logical_emit_message returned %q: %w", end, err)
	}
	first := walmsg.FirstSeq(uint64(lsn), len(recs))
	ids := make([]string, len(recs))
	for i := range recs {
		ids[i] = FormatID(first+int64(i), recs[i].Nonce)
	}
	return ids, nil
}
