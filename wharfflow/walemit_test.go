package wharfflow_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

type walEmitState struct {
	Dedup string `json:"dedup"`
}

// One bad item poisons a batch, here the whole runner (found by the review
// of the flows rework, A1).
//
// In WAL mode the outbox refuses a message with a DedupKey ("DedupKey works
// only in an outbox in table mode"), and refuses a Topic, Key or header set
// longer than 65535 bytes (walmsg), in Go, before any statement: the error is
// not a *pgconn.PgError. wharfflow's encode/validateEmit does not know these
// rules, and Runner.writeRetrying treats any error that is not `refused`
// (SQLSTATE class 22/23/54, a JSON error) as the database being unreachable:
// it retries the same batch until it commits, for ever. So one step that
// emits such a message stops the runner's completer: no outcome of the runner
// is written again (the batch-mates' and every later step's), their leases
// are renewed all the while (they stay in inflight), so no other runner takes
// them either, and the step goroutines pile up on the results channel.
//
// The outbox is put in WAL mode the way the wharf client detects it (an
// <schema>.enqueue_wal(bytea) function exists; the real one needs a logical
// replication slot, which this test database's wal_level does not allow):
// the stand-in raises if it is ever called, and it is not — the refusal
// happens in EnqueueTx before it.
//
// Fixed: the poisoned instance fails alone with the outbox's reason
// (EnqueueTx's refusals wrap wharf.ErrInvalidMessage, and a write failing
// with one is split like one the database refuses), and an innocent
// instance started afterwards completes.
func TestOutboxRefusalOfAnEmittedMessageFailsItsInstanceAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE FUNCTION "+b.schema+`.enqueue_wal(content bytea) RETURNS pg_lsn LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'stand-in enqueue_wal called' USING ERRCODE = '0A000'; END $$`)
	require.NoError(t, err)

	ran := make(chan int64, 100)
	f := wharfflow.New[walEmitState]("walemit", nil).
		Step("go", func(_ context.Context, s *walEmitState, in wharfflow.Input) wharfflow.Outcome {
			ran <- in.Instance
			if s.Dedup != "" {
				return wharfflow.Done(nil).Emit(wharf.Message{Topic: "t", Payload: []byte("x"), DedupKey: s.Dedup})
			}
			return wharfflow.Done(nil)
		})
	logger, logs := newLogRecords()
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, RunnerID: "walemit", LeaseTTL: 3 * time.Second, Logger: logger})

	bad, err := b.client.Start(ctx, f.Start(walEmitState{Dedup: "order-1"}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Equal(t, bad[0], <-ran)

	good, err := b.client.Start(ctx, f.Start(walEmitState{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	require.Equal(t, good[0], <-ran, "the innocent step runs")

	// The outbox's refusal fails the instance alone, at once: the write is
	// not retried for it.
	require.Eventually(t, func() bool { return b.status(t, bad[0]) == "failed" }, time.Minute, 20*time.Millisecond,
		"the instance whose message the outbox refuses fails with the reason")
	d, err := b.client.Get(ctx, bad[0])
	require.NoError(t, err)
	require.Contains(t, d.Error, "DedupKey works only in an outbox in table mode")
	for _, l := range logs() {
		require.NotContains(t, l, "stand-in enqueue_wal called")
		require.False(t, strings.Contains(l, "will retry") && strings.Contains(l, "DedupKey"), "retried: %s", l)
	}
	// Its outcome is written once the completer is free: well within 20 s
	// (the write of a step that just ran takes milliseconds).
	require.Eventually(t, func() bool { return b.status(t, good[0]) == "done" }, 20*time.Second, 20*time.Millisecond,
		"an innocent instance's outcome was never written: the runner's completer keeps retrying the batch whose "+
			"message the WAL outbox refuses (bad instance %d is %s)", bad[0], b.status(t, bad[0]))
}
