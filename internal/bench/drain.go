package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/walstream"
)

// drain pre-fills the outbox (COPY, or Enqueue calls: enqueueFill) and
// times the relays emptying it.
func (e *env) drain(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	res := &Result{Relays: o.Relays, Messages: int64(o.Messages)}
	var rate float64
	var err error
	switch {
	case o.OutboxMode == "wal":
		rate, e.walTarget, err = e.enqueueFill(ctx, schema, int64(o.Messages), nil)
	case o.EnqueueFill:
		rate, _, err = e.enqueueFill(ctx, schema, int64(o.Messages), nil)
	default:
		rate, err = e.copyFill(ctx, pgx.Identifier{schema, "outbox"}, int64(o.Messages))
	}
	if err != nil {
		return nil, fmt.Errorf("pre-filling the outbox: %w", err)
	}
	res.ProducerRate = rate
	if _, err := e.ctl.Exec(ctx, "VACUUM (ANALYZE) "+schema+".outbox"); err != nil {
		return nil, err
	}
	if _, err := e.quiesce(ctx); err != nil {
		return nil, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return nil, err
	}
	samples, err := e.drainOutbox(ctx, schema, int64(o.Messages), time.Now(), "drain", res)
	if err != nil {
		return nil, err
	}
	res.Samples = samples
	res.VerdictReason = "n/a: drain mode has no target rate"
	res.LatencyNote = "n/a (drain: the messages were pre-filled, so commit → ack measures queueing, not the relay)"
	if o.OutboxMode == "wal" {
		res.note("outbox in WAL mode: producer_rate is the pre-fill's rate (%d connections with synchronous_commit off, Enqueue of %d messages per call, each call a transaction with one logical message); drain_seconds runs from the relays' start until the slot's confirmed position passes the WAL end after the pre-fill (the relay reports it every 100 ms, so up to that much is added); processed in the samples is estimated from the confirmed position's progress through the pre-fill's WAL", o.Producers, o.ProducerBatch)
	} else if o.EnqueueFill {
		res.note("producer_rate is the pre-fill's rate (%d connections with synchronous_commit off, Enqueue of %d messages per call, each call a transaction); the outbox is then VACUUM (ANALYZE)d and CHECKPOINTed, and drain_seconds runs from the relays' start to an empty outbox", o.Producers, o.ProducerBatch)
	} else {
		res.note("producer_rate is the COPY pre-fill's rate (one COPY); the outbox is then VACUUM (ANALYZE)d and CHECKPOINTed, and drain_seconds runs from the relays' start to an empty outbox")
	}
	res.note("wal_bytes_per_msg and commits_per_msg cover the drain only (the relays' reads, removals and leases), not the pre-fill")
	if !o.InProcess {
		res.note("drain_seconds includes starting the relay processes")
	}
	if err := e.finish(ctx, res, schema, before, res.Messages); err != nil {
		return nil, err
	}
	if o.Limits {
		l, err := e.removalLimit(ctx, schema, res.Messages)
		if err != nil {
			return nil, err
		}
		l.fractions(0, res.ProcessingRate)
		res.Limits = l
		limitNotes(res, o)
	}
	return res, nil
}

// drainOutbox starts the relays on an outbox holding total rows, times them
// emptying it and fills in res's drain figures (rate, time, delivery, relay
// usage). The samples' times count from origin.
func (e *env) drainOutbox(ctx context.Context, schema string, total int64, origin time.Time, label string, res *Result) ([]Sample, error) {
	o := e.o
	start := time.Now()
	tr := newTracker(start, 0)
	r, err := e.startRelays(ctx, schema, tr, false)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = e.stopRelays(r, res)
		}
	}()
	sm := newSampler(e, schema, origin, tr, o.InProcess, label)
	defer sm.stop()
	sm.fixedProduced = total
	if err := sm.sample(ctx, "drain"); err != nil {
		return nil, err
	}
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	var end time.Time
	for end.IsZero() {
		select {
		case <-sm.C():
			if err := sm.sample(ctx, "drain"); err != nil {
				return nil, err
			}
		case <-poll.C:
			if o.InProcess && tr.acked.Load() < total {
				continue
			}
			empty, err := e.drained(ctx, schema)
			if err != nil {
				return nil, err
			}
			if empty {
				end = time.Now()
			}
		case err := <-r.exited():
			return nil, err
		case <-deadline.C:
			return nil, fmt.Errorf("drain not done after %s (raise --timeout)", o.Timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res.DrainSeconds = end.Sub(start).Seconds()
	res.ProcessingRate = float64(total) / res.DrainSeconds
	if err := sm.sample(ctx, "drain"); err != nil {
		return nil, err
	}
	sm.progressDone()
	stopped = true
	if err := e.stopRelays(r, res); err != nil {
		return nil, err
	}
	if o.InProcess {
		res.Delivered = tr.acked.Load()
		_, res.Redelivered = tr.summary()
		if res.Delivered != total {
			return nil, fmt.Errorf("the outbox is empty but the sink acknowledged %d of %d messages", res.Delivered, total)
		}
	} else {
		res.Delivered = total
	}
	return sm.samples, nil
}

// walFillBatch is how many messages the WAL pre-fill enqueues per call
// unless --producer-batch says otherwise.
const walFillBatch = 1000

// enqueueFill pre-fills an outbox through the enqueue path (in WAL mode
// there is no table to COPY into) and returns its rate and the WAL end
// after it. Each Enqueue call of ProducerBatch messages is a transaction of
// its own (in WAL mode writing one logical message), so 1 gives one
// message per transaction, the shape of an application that sends one
// event per business transaction.
// Producers connections enqueue in parallel, without waiting for their
// commits' flush (synchronous_commit off: the pre-fill is not measured
// for durability, and the slot reads only flushed WAL, which the drain
// waits for anyway). onSeqs, when set, is given each call's seqs (from
// several goroutines at once).
func (e *env) enqueueFill(ctx context.Context, schema string, n int64, onSeqs func([]int64)) (float64, walstream.LSN, error) {
	o := e.o
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return 0, 0, fmt.Errorf("--database-url is malformed: %w", err)
	}
	cfg.MaxConns = int32(o.Producers)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("--database-url: %w", err)
	}
	defer pool.Close()
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var begin string
	if err := e.ctl.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&begin); err != nil {
		return 0, 0, err
	}
	if e.walStart, err = walstream.ParseLSN(begin); err != nil {
		return 0, 0, err
	}
	batch := int64(o.ProducerBatch)
	payload := makePayload(o.PayloadBytes)
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range o.Producers {
		g.Go(func() error {
			kr := &keyer{o: o}
			msgs := make([]wharf.Message, 0, batch)
			for {
				first := next.Add(batch) - batch
				if first >= n {
					return nil
				}
				msgs = msgs[:0]
				for i := first; i < n && i < first+batch; i++ {
					msgs = append(msgs, wharf.Message{Topic: topic, Key: kr.key(i), Payload: payload})
				}
				ids, err := c.Enqueue(gctx, msgs...)
				if err != nil {
					return err
				}
				if onSeqs != nil {
					seqs, err := parseSeqs(ids)
					if err != nil {
						return err
					}
					onSeqs(seqs)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	rate := float64(n) / time.Since(start).Seconds()
	var end string
	if err := e.ctl.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end); err != nil {
		return 0, 0, err
	}
	lsn, err := walstream.ParseLSN(end)
	return rate, lsn, err
}

// drained reports whether the relays delivered everything: the outbox
// table is empty, or, in WAL mode, the slot is confirmed past the WAL end
// after the pre-fill (the relay confirms only what is settled).
func (e *env) drained(ctx context.Context, schema string) (bool, error) {
	if e.o.OutboxMode != "wal" {
		return e.outboxEmpty(ctx, schema)
	}
	done, err := e.walDone(ctx, schema)
	return done >= 1, err
}

// walDone is the fraction of the pre-fill's WAL the slot is confirmed past.
func (e *env) walDone(ctx context.Context, schema string) (float64, error) {
	var s string
	if err := e.ctl.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", schema).Scan(&s); err != nil {
		return 0, err
	}
	lsn, err := walstream.ParseLSN(s)
	if err != nil {
		return 0, err
	}
	if lsn >= e.walTarget {
		return 1, nil
	}
	if lsn <= e.walStart {
		return 0, nil
	}
	return float64(lsn-e.walStart) / float64(e.walTarget-e.walStart), nil
}
