package bench

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
)

// batchWriter commits messages first .. first+ProducerBatch-1 in one
// transaction and returns how many it wrote.
type batchWriter func(ctx context.Context, first int64) (int, error)

// producers run Producers workers, each with a batchWriter of its own, on a
// token schedule: batch b is due at start + b*batch/rate, so a late batch is
// sent at once and the schedule, not a sleep per message, sets the rate.
// With rate 0 they run flat out.
type producers struct {
	o         Options
	newWriter func() batchWriter
	next      atomic.Int64
	produced  atomic.Int64
	// inWindow counts the messages of the batches due at or after
	// measureFrom (flat out: whose commit returned then), timed by the
	// producers themselves, so a late sampler cannot shift the window's
	// start.
	inWindow    atomic.Int64
	measureFrom time.Time
}

func (p *producers) run(ctx context.Context, start time.Time, rate float64, stopAt time.Time) error {
	g, ctx := errgroup.WithContext(ctx)
	batch := p.o.ProducerBatch
	for range p.o.Producers {
		write := p.newWriter()
		g.Go(func() error {
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for {
				b := p.next.Add(1) - 1
				var due time.Time
				if rate > 0 {
					due = start.Add(time.Duration(float64(b) * float64(batch) / rate * float64(time.Second)))
					// Behind schedule, the producers still stop on time.
					if !due.Before(stopAt) || !time.Now().Before(stopAt) {
						return nil
					}
					if d := time.Until(due); d > 0 {
						timer.Reset(d)
						select {
						case <-timer.C:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
				} else if !time.Now().Before(stopAt) {
					return nil
				}
				n, err := write(ctx, b*int64(batch))
				if err != nil {
					return err
				}
				p.produced.Add(int64(n))
				// On a schedule, a batch belongs to the window it was due
				// in: a warm-up batch that a loaded machine commits late is
				// not the window's. Flat out, the commit time decides.
				if rate > 0 && !due.Before(p.measureFrom) || rate == 0 && !time.Now().Before(p.measureFrom) {
					p.inWindow.Add(int64(n))
				}
			}
		})
	}
	return g.Wait()
}

// wharfWriter enqueues through the library (EnqueueTx in a transaction of
// its own); tr, when set, gets the messages' positions and the time their
// Commit returned (and, in its sparse layout, the positions before the
// Commit: see tracker).
func wharfWriter(o Options, pool *pgxpool.Pool, client *wharf.Client, tr *tracker) func() batchWriter {
	payload := makePayload(o.PayloadBytes)
	return func() batchWriter {
		msgs := make([]wharf.Message, o.ProducerBatch)
		kr := &keyer{o: o}
		return func(ctx context.Context, first int64) (int, error) {
			for i := range msgs {
				msgs[i] = wharf.Message{Topic: topic, Key: kr.key(first + int64(i)), Payload: payload}
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			ids, err := client.EnqueueTx(ctx, tx, msgs...)
			if err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
			var seqs []int64
			if tr != nil && tr.sparse {
				if seqs, err = parseSeqs(ids); err != nil {
					_ = tx.Rollback(ctx)
					return 0, err
				}
				tr.enqueued(seqs)
			}
			if err := tx.Commit(ctx); err != nil {
				if seqs != nil {
					tr.forget(seqs)
				}
				return 0, err
			}
			if tr != nil {
				now := time.Now()
				if seqs == nil {
					if seqs, err = parseSeqs(ids); err != nil {
						return 0, err
					}
				}
				tr.committed(seqs, now)
			}
			return len(ids), nil
		}
	}
}

// parseSeqs returns the seqs of ids.
func parseSeqs(ids []string) ([]int64, error) {
	seqs := make([]int64, len(ids))
	for i, id := range ids {
		var err error
		if seqs[i], _, err = wharf.ParseID(id); err != nil {
			return nil, err
		}
	}
	return seqs, nil
}

// bareTableDDL is the table of the physical limits: the outbox's payload
// columns and a primary key, nothing else.
const bareTableDDL = `CREATE TABLE %s (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic   text NOT NULL,
    key     text,
    payload bytea NOT NULL)`

// valuesInsert is a multi-row INSERT of rows (topic, key, payload) rows.
func valuesInsert(table string, rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (topic, key, payload) VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		n := 3 * i
		b.WriteString("($" + strconv.Itoa(n+1) + ",$" + strconv.Itoa(n+2) + ",$" + strconv.Itoa(n+3) + ")")
	}
	return b.String()
}

// bareInsertWriter writes the same messages as wharfWriter with one
// multi-row INSERT into table, in a transaction of its own like the
// enqueue's (BEGIN, the statement, COMMIT: the same round trips).
func bareInsertWriter(o Options, pool *pgxpool.Pool, table string) func() batchWriter {
	payload := makePayload(o.PayloadBytes)
	sql := valuesInsert(table, o.ProducerBatch)
	return func() batchWriter {
		args := make([]any, 3*o.ProducerBatch)
		kr := &keyer{o: o}
		return func(ctx context.Context, first int64) (int, error) {
			for i := range o.ProducerBatch {
				args[3*i] = topic
				if k := kr.key(first + int64(i)); k != "" {
					args[3*i+1] = k
				} else {
					args[3*i+1] = nil
				}
				args[3*i+2] = payload
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
			if err := tx.Commit(ctx); err != nil {
				return 0, err
			}
			return o.ProducerBatch, nil
		}
	}
}
