package bench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
)

// baseline measures, in one run, Wharf's two halves beside the server's
// physical limits: the producers enqueueing flat out against the insert
// limit, then the relays draining what they enqueued against the removal
// limit over as many rows. Each phase starts after a CHECKPOINT; like
// phases run back to back so that they see the same machine.
func (e *env) baseline(ctx context.Context, schema string) (*Result, error) {
	o := e.o
	res := &Result{Relays: o.Relays}
	if _, err := e.quiesce(ctx); err != nil {
		return nil, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return nil, err
	}

	wal := e.wal()
	if wal {
		if e.walStart, err = e.insertLSN(ctx); err != nil {
			return nil, err
		}
	}

	// 1. Wharf's enqueue, flat out, no relay running.
	pool, err := e.producerPool(ctx)
	if err != nil {
		return nil, err
	}
	client, err := wharf.NewClient(nil, &wharf.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	origin := time.Now()
	p := &producers{o: o, newWriter: wharfWriter(o, pool, client, nil), measureFrom: origin}
	sm := newSampler(e, schema, origin, nil, false, "baseline: enqueue")
	sm.produced, sm.noRelay = &p.produced, true
	err = e.runFlatOut(ctx, p, sm, origin)
	sm.stop()
	pool.Close()
	if err != nil {
		return nil, fmt.Errorf("producer failed: %w", err)
	}
	for i := range sm.samples {
		sm.samples[i].Phase = "enqueue"
	}
	samples := sm.samples
	res.ProducerRate = float64(p.inWindow.Load()) / o.Duration.Seconds()
	res.Messages = p.produced.Load()
	// The enqueue's WAL and commits, before the other phases add theirs.
	enqueueOnly := &Result{}
	if err := e.finish(ctx, enqueueOnly, schema, before, res.Messages); err != nil {
		return nil, err
	}
	res.WALBytesPerMsg, res.CommitsPerMsg = enqueueOnly.WALBytesPerMsg, enqueueOnly.CommitsPerMsg
	if wal {
		// The drain is done once the slot is confirmed past a marker
		// written right after the enqueue phase: see walMarker.
		marker, err := e.walMarker(ctx, schema)
		if err != nil {
			return nil, err
		}
		e.walTarget = marker + 1
	}

	// 2. The insert limit (and, for a WAL outbox, the emit limit).
	lim := &Limits{}
	if lim.InsertRate, err = e.insertLimit(ctx, schema); err != nil {
		return nil, err
	}
	if wal {
		if lim.EmitRate, lim.EmitWALBytesPerMsg, err = e.emitLimit(ctx, schema); err != nil {
			return nil, err
		}
		lim.EmitPrefix = emitPrefix(schema)
		if lim.EmitWALBytesPerMsg > 0 {
			lim.WALBytesFraction = res.WALBytesPerMsg / lim.EmitWALBytesPerMsg
		}
	}

	// 3. Wharf's relays drain the enqueued backlog.
	if _, err := e.ctl.Exec(ctx, "VACUUM (ANALYZE) "+schema+".outbox"); err != nil {
		return nil, err
	}
	if _, err := e.quiesce(ctx); err != nil {
		return nil, err
	}
	drained, err := e.drainOutbox(ctx, schema, res.Messages, origin, "baseline: drain", res)
	if err != nil {
		return nil, err
	}
	res.Samples = append(samples, drained...)
	if wal {
		n, err := e.deadLetters(ctx, schema)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			return nil, fmt.Errorf("the relay dead-lettered %d messages while draining the WAL outbox: the bench's measurement is not valid", n)
		}
	}

	// 4. The removal limit over as many rows (a table outbox's only).
	if wal {
		lim.fractions(res.ProducerRate, 0)
		res.Limits = lim
	} else {
		rl, err := e.removalLimit(ctx, schema, res.Messages)
		if err != nil {
			return nil, err
		}
		rl.InsertRate = lim.InsertRate
		rl.fractions(res.ProducerRate, res.ProcessingRate)
		res.Limits = rl
	}

	rate, err := publishRate(ctx, o)
	if err != nil {
		return nil, err
	}
	res.SinkPublishRate = rate
	res.VerdictReason = "n/a: baseline has no target rate"
	res.LatencyNote = "n/a (baseline: the relays drain a backlog, so commit → ack measures queueing)"
	if wal {
		res.note("outbox in WAL mode: baseline runs three phases, each after a CHECKPOINT: Wharf's producers enqueue flat out for %s with no relay running (producer_rate, through EnqueueTx: one transactional logical decoding message per call, through %s.enqueue_wal); then an empty logical message of the emit limit's prefix marks the end of that WAL; the insert limit and the emit limit; one relay process drains the slot (processing_rate, drain_seconds: from its start until the slot is confirmed past the marker, so it decodes none of the limits' WAL; the relay confirms every 100 ms, so up to that much is added). The removal limit is a table outbox's: not measured", o.Duration, schema)
		res.note("after the drain the outbox's dead letters are counted and must be none: the emit limit's messages, of another prefix, are dropped by the relay's stream")
	} else {
		res.note("baseline runs four phases, each after a CHECKPOINT: Wharf's producers enqueue flat out for %s with no relay running (producer_rate, through EnqueueTx: unnest arrays, RETURNING id, nonce); the insert limit; the relays drain that backlog after VACUUM (ANALYZE) (processing_rate, drain_seconds); the removal limit over as many rows", o.Duration)
	}
	res.note("wal_bytes_per_msg and commits_per_msg cover Wharf's enqueue alone")
	res.note("sink_publish_rate: batches of 1000 messages published straight to --sink for one second, without an outbox")
	limitNotes(res, o)
	if _, err := e.ctl.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return nil, err
	}
	if err := e.ctl.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'), 0)`, schema).Scan(&res.DeadTuples); err != nil {
		return nil, err
	}
	if res.OutboxRemaining, err = e.outboxCount(ctx, schema); err != nil {
		return nil, err
	}
	if wal && o.Keep {
		// A kept slot would hold the limits' WAL, which no relay needs.
		if _, err := e.advanceSlot(ctx, schema); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// publishRate publishes batches straight to the sink for a second.
func publishRate(ctx context.Context, o Options) (float64, error) {
	sink, err := sinkurl.Open(ctx, o.Sink)
	if err != nil {
		return 0, fmt.Errorf("--sink: %w", err)
	}
	defer sink.Close()
	kr := &keyer{o: o}
	payload := makePayload(o.PayloadBytes)
	batch := make([]*wharf.Message, 1000)
	var sent int64
	start := time.Now()
	for time.Since(start) < time.Second {
		for i := range batch {
			id := sent + int64(i) + 1
			batch[i] = &wharf.Message{ID: wharf.FormatID(id, mrand.Int64()), Seq: id, Topic: topic, Key: kr.key(id), Payload: payload}
		}
		for i, err := range sink.Publish(ctx, batch) {
			if err != nil {
				return 0, fmt.Errorf("--sink: publishing message %s directly: %w", batch[i].ID, err)
			}
		}
		sent += int64(len(batch))
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return float64(sent) / time.Since(start).Seconds(), nil
}
