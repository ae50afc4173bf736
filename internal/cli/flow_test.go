package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// wharf flow list, show, signal, retry and cancel against instances a runner
// executes.
func TestFlowCommands(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	type st struct{}
	var healthy atomic.Bool
	f := wharfflow.New[st]("order", &wharfflow.FlowConfig{MaxAttempts: 1}).
		Step("wait", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("charge", "paid")
		}).
		Step("charge", func(ctx context.Context, s *st, in wharfflow.Input) wharfflow.Outcome {
			if !healthy.Load() {
				return wharfflow.Retry(errors.New("card network down"))
			}
			return wharfflow.Done("charged")
		})
	r, err := wharfflow.NewRunner(b.pool, &wharfflow.Config{Schema: b.schema, Flows: []wharfflow.Definition{f},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	fc, err := wharfflow.NewClient(b.pool, b.schema)
	require.NoError(t, err)
	ids, err := fc.Start(ctx, f.Start(st{}, wharfflow.StartOptions{Key: "o-7"}), f.Start(st{}, wharfflow.StartOptions{Key: "o-8"}))
	require.NoError(t, err)
	status := func(id int64) string {
		var s string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT status FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&s))
		return s
	}
	waitStatus := func(id int64, want string) {
		require.Eventually(t, func() bool { return status(id) == want }, time.Minute, 10*time.Millisecond)
	}
	waitStatus(ids[0], "awaiting")
	s := session{}

	code, out, errOut := s.run(b.cmd("flow", "list", "--status", "awaiting")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "o-7")
	require.Contains(t, out, "awaiting")
	require.Contains(t, out, "awaits paid → charge", "an awaiting instance shows what it waits for before the step it runs then")
	code, out, errOut = s.run(b.cmd("flow", "show", fmt.Sprint(ids[0]))...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "charge, once paid comes (attempt 0)")

	code, out, errOut = s.run(b.cmd("flow", "list", "--key", "o-8")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "o-8")
	require.NotContains(t, out, "o-7")

	code, out, errOut = s.run(b.cmd("flow", "signal", "--flow", "order", "--key", "o-7", "--name", "paid", "--payload", `{"cents": 10}`, "--dedup-key", "e1")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "recorded")
	waitStatus(ids[0], "failed")

	code, out, errOut = s.run(b.cmd("flow", "show", fmt.Sprint(ids[0]))...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "card network down")
	require.Contains(t, out, "paid")
	require.Contains(t, out, "charge")
	require.Regexp(t, `(?m)^error\s+attempt 1 of 1: card network down`, out, "a failed instance's error is its status")

	healthy.Store(true)
	code, out, errOut = s.run(b.cmd("flow", "retry", fmt.Sprint(ids[0]))...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("instance %d will run its failed step again\n", ids[0]), out)
	waitStatus(ids[0], "done")
	code, out, errOut = s.run(b.cmd("flow", "show", fmt.Sprint(ids[0]))...)
	require.Equal(t, 0, code, errOut)
	require.NotRegexp(t, `(?m)^(last )?error\s`, out, "a done instance shows no error; its history keeps the failed attempt")
	require.Contains(t, out, "attempt 1 of 1: card network down")

	code, out, errOut = s.run(b.cmd("flow", "cancel", fmt.Sprint(ids[1]))...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "cancelled 1 instance")
	require.Equal(t, "cancelled", status(ids[1]))

	// Mistakes: one line naming what is wrong.
	code, _, errOut = s.run(b.cmd("flow", "cancel", fmt.Sprint(ids[1]))...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, fmt.Sprintf("wharf: instance %d is cancelled already: there is nothing to cancel", ids[1]))
	code, _, errOut = s.run(b.cmd("flow", "retry", fmt.Sprint(ids[1]))...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, fmt.Sprintf("wharf: instance %d is cancelled: only failed instances can be retried", ids[1]))
	code, _, errOut = s.run(b.cmd("flow", "signal", "--flow", "order", "--key", "nope", "--name", "paid")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, `wharf: signal paid: flow order has no active instance with key "nope"`)
	code, _, errOut = s.run(b.cmd("flow", "cancel", "999999")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "wharf: there is no instance 999999")
	code, _, errOut = s.run(b.cmd("flow", "show", "abc")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, `instance id "abc" must be a positive number`)
	code, _, errOut = s.run(b.cmd("flow", "signal", "--flow", "order", "--key", "o-8")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--name is required")
	code, _, errOut = s.run(b.cmd("flow", "signal", "1", "--name", "x", "--payload", "not json")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--payload must be JSON")
	code, _, errOut = s.run(b.cmd("flow", "list", "--status", "stuck")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, `--status "stuck": use one of`)
}

// wharf bench --mode flow runs its three workloads and prints a line each.
func TestFlowBench(t *testing.T) {
	t.Parallel()
	s := session{}
	code, out, errOut := s.run("bench", "--mode", "flow", "--flows", "30", "--paced", "300ms", "--database-url", databaseURL)
	require.Equal(t, 0, code, errOut)
	for _, w := range []string{"steps ", "signal ", "children "} {
		require.Contains(t, out, w)
	}
	code, _, errOut = s.run("bench", "--mode", "flow", "--flows", "0", "--database-url", databaseURL)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--flows must be at least 1")
	code, _, errOut = s.run("bench", "--mode", "flow", "--workload", "nap", "--flows", "1", "--paced", "-1s", "--database-url", databaseURL)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, `--workload "nap": use steps, signal, children, keyed, keyed-unkeyed or ratelimited`)
	code, _, errOut = s.run("bench", "--mode", "flow", "--signal-after", "-1ms", "--flows", "1", "--database-url", databaseURL)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--signal-after must not be negative, got -1ms")
}

// Every flow command on a schema without the flow tables (never migrated, or
// migrated before migration 7 brought flows) fails in one line that says to
// migrate it, not with PostgreSQL's "relation does not exist".
func TestFlowCommandsOnASchemaWithoutFlows(t *testing.T) {
	t.Parallel()
	var rnd [5]byte
	_, _ = rand.Read(rnd[:])
	never := "wc_none_" + hex.EncodeToString(rnd[:])
	old := newSchema(t)
	code, _, errOut := run(old.cmd("migrate", "down", "--target-version", "6")...)
	require.Equal(t, 0, code, errOut)

	for _, schema := range []string{never, old.schema} {
		for _, args := range [][]string{
			{"flow", "list"},
			{"flow", "list", "--status", "failed"},
			{"flow", "show", "1"},
			{"flow", "signal", "1", "--name", "paid"},
			{"flow", "signal", "--flow", "checkout", "--key", "o-1", "--name", "paid"},
			{"flow", "cancel", "1"},
			{"flow", "retry", "1"},
		} {
			code, out, errOut := run(append(args, "--schema", schema, "--database-url", databaseURL)...)
			require.Equal(t, 1, code, "%s on %s: %s", args, schema, errOut)
			require.Empty(t, out)
			requireOneLineError(t, errOut, fmt.Sprintf("schema %s has no flow tables (they come with migration 7): run `wharf migrate up --schema %[1]s`", schema))
			require.NotContains(t, errOut, "SQLSTATE")
		}
	}
}

// A flow command that names a column the schema lacks (flow tables older
// than this build's) says to migrate the schema.
func TestFlowCommandOnOlderFlowTables(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	_, err := b.pool.Exec(context.Background(), "ALTER TABLE "+b.schema+".flow_instances DROP COLUMN rate_key")
	require.NoError(t, err)
	code, _, errOut := run(b.cmd("flow", "list")...)
	require.Equal(t, 1, code, errOut)
	requireOneLineError(t, errOut, fmt.Sprintf("schema %s is older than this build's flows: run `wharf migrate up --schema %[1]s`", b.schema))
}
