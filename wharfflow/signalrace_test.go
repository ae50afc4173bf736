package wharfflow_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// A signal that commits while a runner's write of the await is in flight
// (after the write looked for pending signals, before it committed) finds
// the instance still running, so it cannot wake it; the runner it notifies
// calls wake_flows, which must wait for that write and then wake the
// instance. Before, wake_flows read the row as of its start, skipped it
// without waiting, and the instance awaited for ever a signal it had
// (found by `wharf bench --mode flow`, whose sender signals instances as
// soon as their first step ran). The order of the transactions is forced
// here, step by step, with the functions the runner calls.
func TestSignalCommittedDuringTheAwaitWriteWakesTheInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	S := b.schema
	var id, token int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+S+".start_flow('pay', '{}', 'o-1', 'prepare')").Scan(&id))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT id, lease_token FROM "+S+".claim_flow_steps('r1', ARRAY['pay'], 1, '1 minute') WHERE id > 0").
		Scan(&id, &token))

	// The runner's write of the await, left open before its commit.
	write, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = write.Rollback(ctx) }()
	var applied int
	require.NoError(t, write.QueryRow(ctx, "SELECT count(*) FROM "+S+".complete_flow_steps('r1', $1::jsonb, '1 minute') WHERE id = $2",
		`[{"id":`+strconv.FormatInt(id, 10)+`,"token":`+strconv.FormatInt(token, 10)+`,"kind":"await","await_names":["paid"],"attempt":0,"ran_step":"prepare","started_at":"2026-01-01T00:00:00Z"}]`, id).Scan(&applied))
	require.Equal(t, 1, applied)

	// The signal commits meanwhile: the instance is not awaiting yet.
	_, err = b.pool.Exec(ctx, "SELECT "+S+".signal('pay', 'o-1', 'paid')")
	require.NoError(t, err)

	// The notified runner wakes the instance; the call must wait for the write.
	woken := make(chan int, 1)
	wakeErr := make(chan error, 1)
	go func() {
		var n int
		err := b.pool.QueryRow(ctx, "SELECT "+S+".wake_flows(ARRAY[$1::bigint])", id).Scan(&n)
		wakeErr <- err
		woken <- n
	}()
	// Wait until wake_flows either returned (it did not wait: the bug) or
	// waits for the write's row lock.
	waiting := func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '.wake_flows%'", S).Scan(&n))
		return n > 0
	}
	for !waiting() {
		select {
		case err := <-wakeErr:
			require.NoError(t, err)
			require.Equal(t, 1, <-woken, "wake_flows returned before the await's write committed, without waking the instance")
			t.Fatal("unreachable: wake_flows woke an instance whose await was not committed")
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.NoError(t, write.Commit(ctx))
	require.NoError(t, <-wakeErr)
	require.Equal(t, 1, <-woken, "the instance that awaits a signal it has is due")
	var due bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status = 'awaiting' AND run_at <= clock_timestamp() FROM "+S+".flow_instances WHERE id = $1", id).Scan(&due))
	require.True(t, due)
}

// Signals sent while the steps that await them run, hundreds at a time,
// every one racing the write of its await: each instance gets its signal,
// whichever path it takes (kept and seen by the await's write, leasing or
// waking an awaiting instance, or notified by id and woken by the runner
// that wrote the await), with one runner and with three, where every
// runner hears every notification and the instances' steps are spread
// over them. The narrow race of the test above is rarely hit here: this
// one checks the paths together, that one the race.
func TestSignalsRacingTheirAwaitsAreAllDelivered(t *testing.T) {
	t.Parallel()
	for _, runners := range []int{1, 3} {
		t.Run(fmt.Sprintf("runners=%d", runners), func(t *testing.T) {
			t.Parallel()
			raceSignals(t, runners)
		})
	}
}

func raceSignals(t *testing.T, runners int) {
	b := setup(t)
	ctx := context.Background()
	const n = 600
	ran := make(chan int64, n)
	f := wharfflow.New[counter]("race", nil).
		Step("a", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			ran <- in.Instance
			return wharfflow.Await("b", "go")
		}).
		Step("b", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			if len(in.Signals) != 1 {
				return wharfflow.Fail(fmt.Errorf("got %d signals", len(in.Signals)))
			}
			return wharfflow.Done(nil)
		})
	for range runners {
		b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	}
	starts := make([]wharfflow.Start, n)
	for i := range starts {
		starts[i] = f.Start(counter{}, wharfflow.StartOptions{})
	}
	_, err := b.client.Start(ctx, starts...)
	require.NoError(t, err)
	for sent := 0; sent < n; {
		batch := []wharfflow.Signal{{Instance: <-ran, Name: "go", DedupKey: "go"}}
		for more := true; more && sent+len(batch) < n; {
			select {
			case id := <-ran:
				batch = append(batch, wharfflow.Signal{Instance: id, Name: "go", DedupKey: "go"})
			default:
				more = false
			}
		}
		_, err := b.client.Send(ctx, batch...)
		require.NoError(t, err)
		sent += len(batch)
	}
	count := func(status string) int {
		var c int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_instances WHERE status = $1", status).Scan(&c))
		return c
	}
	require.Eventually(t, func() bool { return count("done") == n }, time.Minute, 20*time.Millisecond,
		"every instance got its signal: %d done, %d awaiting, %d failed", count("done"), count("awaiting"), count("failed"))
}
