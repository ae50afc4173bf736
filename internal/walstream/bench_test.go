package walstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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

// BenchmarkProduceAndStream runs WAL mode's two sides at once, as a relay
// would see them: 4 producer connections emit 100-message contents (one per
// transaction, ids from the emit's LSN, no sequence) flat out while one
// stream decodes and confirms them. Beside it, in the same run and on the
// same server, the same producers insert 100-row VALUES into a one-index
// table (the table's insert limit), with synchronous_commit on (fsync stays
// off on the throwaway cluster). WHARF_WAL_DURATION sets each window
// (default 10s).
//
//	go test -run XXX -bench ProduceAndStream -benchtime 1x ./internal/walstream
func BenchmarkProduceAndStream(b *testing.B) {
	window := 10 * time.Second
	if v := os.Getenv("WHARF_WAL_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err)
		window = d
	}
	ctx := context.Background()
	const producers = 4
	payload := make([]byte, benchPayload)
	conns := make([]*pgx.Conn, producers)
	for i := range conns {
		c, err := pgx.Connect(ctx, cluster.URL())
		require.NoError(b, err)
		defer c.Close(ctx)
		// PostgreSQL's default, which the throwaway cluster turns off: the
		// walsender sends only flushed WAL, so with it off a message waits
		// for the WAL writer (wal_writer_delay) before it can be streamed.
		_, err = c.Exec(ctx, "SET synchronous_commit = on")
		require.NoError(b, err)
		conns[i] = c
	}
	_, err := conns[0].Exec(ctx, `DROP TABLE IF EXISTS bare; CREATE TABLE bare (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, key text, payload bytea NOT NULL)`)
	require.NoError(b, err)
	var values strings.Builder
	values.WriteString("INSERT INTO bare (topic, key, payload) VALUES ")
	for i := range benchPerTx {
		if i > 0 {
			values.WriteByte(',')
		}
		fmt.Fprintf(&values, "($%d, $%d, $%d)", 3*i+1, 3*i+2, 3*i+3)
	}
	insertSQL := values.String()

	// flatOut runs write on every producer connection until the window ends
	// and returns the messages written per second.
	flatOut := func(write func(i int, c *pgx.Conn, n int64) error) float64 {
		var total atomic.Int64
		end := time.Now().Add(window)
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Go(func() {
				for n := int64(0); time.Now().Before(end); n++ {
					if err := write(i, c, n); err != nil {
						b.Error(err)
						return
					}
					total.Add(benchPerTx)
				}
			})
		}
		wg.Wait()
		return float64(total.Load()) / window.Seconds()
	}
	args := make([]any, 3*benchPerTx)
	for i := range benchPerTx {
		args[3*i], args[3*i+1], args[3*i+2] = benchTopicName, fmt.Sprint("k", i/10), payload
	}
	_, err = conns[0].Exec(ctx, "CHECKPOINT")
	require.NoError(b, err)
	insertRate := flatOut(func(_ int, c *pgx.Conn, _ int64) error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertSQL, args...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	})

	slot := fmt.Sprintf("produce_%d", time.Now().UnixNano()%1e6)
	s, err := Connect(ctx, cluster.URL(), Options{Prefix: prefix, StatusInterval: time.Second})
	require.NoError(b, err)
	defer s.Close(ctx)
	_, err = s.CreateSlot(ctx, slot, true)
	require.NoError(b, err)
	require.NoError(b, s.Start(ctx, slot, publication, 0))
	var streamed atomic.Int64
	sctx, stop := context.WithCancel(ctx)
	streamDone := make(chan error, 1)
	go func() {
		for {
			ev, err := s.Receive(sctx)
			if err != nil {
				streamDone <- err
				return
			}
			switch ev := ev.(type) {
			case Message:
				recs, err := walmsg.Decode(ev.Content)
				if err != nil {
					streamDone <- err
					return
				}
				streamed.Add(int64(len(recs)))
			case Commit:
				s.Confirm(ev.EndLSN)
			}
		}
	}()
	_, err = conns[0].Exec(ctx, "CHECKPOINT")
	require.NoError(b, err)
	records := make([][]walmsg.Record, producers)
	start := time.Now()
	streamedBefore := streamed.Load()
	for i := range records {
		records[i] = make([]walmsg.Record, benchPerTx)
	}
	emitRate := flatOut(func(i int, c *pgx.Conn, n int64) error {
		for j := range records[i] {
			records[i][j] = walmsg.Record{Nonce: rand.Int64(), Topic: benchTopicName, Key: fmt.Sprint("k", (n*benchPerTx+int64(j))/10), Payload: payload}
		}
		content, err := walmsg.Append(nil, records[i])
		if err != nil {
			return err
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		var lsn string
		if err := tx.QueryRow(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)::text", prefix, content).Scan(&lsn); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	})
	inWindow := streamed.Load() - streamedBefore
	streamRate := float64(inWindow) / time.Since(start).Seconds()
	lagAtStop := int64(emitRate*window.Seconds()) - inWindow
	catchUp := time.Now()
	for streamed.Load()-streamedBefore < int64(emitRate*window.Seconds()) && time.Since(catchUp) < time.Minute {
		time.Sleep(10 * time.Millisecond)
	}
	catchUpSeconds := time.Since(catchUp).Seconds()
	stop()
	require.ErrorIs(b, <-streamDone, context.Canceled)

	b.ReportMetric(insertRate, "bare-insert-msg/s")
	b.ReportMetric(emitRate, "wal-produced-msg/s")
	b.ReportMetric(streamRate, "wal-streamed-msg/s")
	b.ReportMetric(emitRate/insertRate, "wal/insert")
	b.ReportMetric(float64(lagAtStop), "lag-at-stop-msgs")
	b.ReportMetric(catchUpSeconds, "catch-up-s")
	b.ReportMetric(0, "ns/op")
}
