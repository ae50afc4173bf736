package walstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/walmsg"
)

// Shape of the streamed backlog: transactions of one enqueue call each.
const (
	benchTxs       = 10_000
	benchPerTx     = 100
	benchPayload   = 200
	benchSlot      = "bench_slot"
	benchTopicName = "orders"
)

var benchBacklog bool

// writeBacklog writes benchTxs transactions of benchPerTx messages once,
// after creating the slot that streams them (never confirmed, so every
// iteration streams all of them again).
func writeBacklog(b *testing.B) {
	if benchBacklog {
		return
	}
	ctx := context.Background()
	c, err := Connect(ctx, cluster.URL(), Options{})
	require.NoError(b, err)
	_, err = c.CreateSlot(ctx, benchSlot, false)
	require.NoError(b, err)
	require.NoError(b, c.Close(ctx))
	q, err := pgx.Connect(ctx, cluster.URL())
	require.NoError(b, err)
	defer q.Close(ctx)
	payload := make([]byte, benchPayload)
	records := make([]walmsg.Record, benchPerTx)
	seq := int64(0)
	for range benchTxs {
		for j := range records {
			seq++
			records[j] = walmsg.Record{Seq: seq, Nonce: seq * 7919, Topic: benchTopicName, Key: fmt.Sprint("k", seq%1000), Payload: payload}
		}
		content, err := walmsg.Append(nil, records)
		require.NoError(b, err)
		// One transaction per emit, as one EnqueueTx call would write (a
		// pgx batch would run as one implicit transaction).
		_, err = q.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", prefix, content)
		require.NoError(b, err)
	}
	benchBacklog = true
}

// BenchmarkStream measures how fast one connection streams and decodes a
// backlog of 1M outbox messages (10,000 transactions of 100): the WAL
// mode's read side without a sink, to set beside the table outbox's drain.
//
//	go test -run XXX -bench Stream -benchtime 3x ./internal/walstream
func BenchmarkStream(b *testing.B) {
	writeBacklog(b)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var messages, bytes int
	for range b.N {
		c, err := Connect(ctx, cluster.URL(), Options{Prefix: prefix})
		require.NoError(b, err)
		require.NoError(b, c.Start(ctx, benchSlot, publication, 0))
		for commits := 0; commits < benchTxs; {
			ev, err := c.Receive(ctx)
			require.NoError(b, err)
			switch ev := ev.(type) {
			case Message:
				recs, err := walmsg.Decode(ev.Content)
				require.NoError(b, err)
				messages += len(recs)
				bytes += len(ev.Content)
			case Commit:
				commits++
			}
		}
		require.NoError(b, c.Close(ctx))
	}
	elapsed := time.Since(start).Seconds()
	b.ReportMetric(float64(messages)/elapsed, "msg/s")
	b.ReportMetric(float64(bytes)/elapsed/1e6, "MB/s")
	b.ReportMetric(0, "ns/op")
}
