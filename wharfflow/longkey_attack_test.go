package wharfflow_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// ATTACK A5 (one bad item poisons a batch — here every claim of every
// runner).
//
// A concurrency key longer than a btree entry may be (about 2700 bytes,
// incompressible: a key built from user data, a JWT, a URL) is accepted by
// Client.Start, start_flow(s) (a producer) and Spawn (encode checks only
// UTF-8 and NUL), and stored: flow_instances indexes concurrency_key only
// while the row is running or waiting. The first claim that picks the row
// inserts the key into flow_keys (its primary key) and fails: "index row
// size … exceeds btree version 4 maximum 2704 for index flow_keys_pkey"
// (54000). The claim is one statement for all its rows, so it claims
// nothing, and the poisoned row, due and oldest, is at the head of every
// later claim of every runner of that flow: no step of any instance is
// claimed again (the runner logs the error and backs off, for ever).
//
// Fixed when: an innocent instance started after the poisoned one runs
// (the start or spawn refuses the key with the reason, or the claim fails
// the poisoned row alone).
func TestAttackLongConcurrencyKeyStopsEveryClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ran := make(chan int64, 10)
	f := wharfflow.New[counter]("tenantjob", nil).Step("go", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome {
		ran <- in.Instance
		return wharfflow.Done(nil)
	})
	raw := make([]byte, 1600)
	_, _ = rand.Read(raw)
	longKey := hex.EncodeToString(raw) // 3200 bytes

	poisoned, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: longKey}}))
	if err != nil {
		t.Logf("the start refused the key: %v", err) // a fix may refuse it here
	}
	innocent, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	logger, logs := newLogRecords()
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}, Logger: logger})

	deadline := time.Now().Add(20 * time.Second)
	for b.status(t, innocent[0]) != "done" {
		if time.Now().After(deadline) {
			t.Fatalf("an innocent instance never ran: every claim fails on the instance with a long concurrency key (%v): %v",
				poisoned, firstN(logs(), 2))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }
