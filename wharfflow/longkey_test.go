package wharfflow_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// One bad item poisons a batch — here every claim of every
// runner (found by the review of the flows rework, A5).
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
// Fixed: keys are at most 1000 bytes: Start refuses a longer one with the
// reason, the table refuses it from SQL (a CHECK constraint), and a spawn
// with one fails its parent alone; other instances run.
func TestLongKeysAreRefused(t *testing.T) {
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

	_, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Options: wharfflow.Options{ConcurrencyKey: longKey}}))
	require.EqualError(t, err, "wharfflow: start 0: StartOptions.ConcurrencyKey is 3200 bytes long: keys hold at most 1000")
	var id int64
	err = b.pool.QueryRow(ctx, "SELECT "+b.schema+".start_flow('tenantjob', '{}', NULL, 'go', 0, NULL, $1)", longKey).Scan(&id)
	require.ErrorContains(t, err, "concurrency_key_at_most_1000_bytes", "a producer's start from SQL is refused too")
	// A child spawned with one fails its parent alone, with the reason.
	parent := wharfflow.New[counter]("spawner", nil).
		Step("fan", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Spawn("join", f.Child(counter{}, wharfflow.Options{RateKey: longKey}))
		}).
		Step("join", func(_ context.Context, _ *counter, in wharfflow.Input) wharfflow.Outcome { return wharfflow.Done(nil) })
	spawner, err := b.client.Start(ctx, parent.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	innocent, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f, parent}})
	b.waitStatus(t, innocent[0], "done")
	b.waitStatus(t, spawner[0], "failed")
	d, err := b.client.Get(ctx, spawner[0])
	require.NoError(t, err)
	require.Equal(t, "Spawn: child 0 RateKey \""+longKey+"\" is 3200 bytes long: keys hold at most 1000", d.Error)
}
