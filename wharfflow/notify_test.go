package wharfflow_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfflow"
)

// nobody creates a login role with no right on anything of wharf's (not a
// producer, not a reader) and returns a connection as it.
func nobody(t *testing.T, b *testBundle) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	role := "flowaudit_nobody_" + hex.EncodeToString(r[:])
	_, err := b.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close(context.Background())
		_, _ = b.pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	var canUse bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT has_schema_privilege($1, 'USAGE')", b.schema).Scan(&canUse))
	require.False(t, canUse, "the role has no right on the flows' schema")
	return conn
}

// forgedLease is a lease notification ('L<key> [step]') as
// flow_notify_leased writes it, with whatever step the sender likes.
func forgedLease(key int64, id int64, flow, step string, state, signals string) string {
	return fmt.Sprintf(`L%d [{"id": %d, "token": 1, "flow": %q, "step": %q, "attempt": 0, "until": "2999-01-01T00:00:00Z", "state": %s, "signals": %s}]`,
		key, id, flow, step, state, signals)
}

func runnerKey(t *testing.T, b *testBundle, runner string) int64 {
	t.Helper()
	var key int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT key FROM "+b.schema+".flow_runners WHERE id = $1", runner).Scan(&key))
	return key
}

// H4a. A runner takes the steps it runs from NOTIFY payloads on the
// '<schema>_flows' channel ('L<key> [...]': id, token, flow, step, state,
// signals) without checking them against the database, and NOTIFY needs no
// privilege: any role that can connect (here one with no right on the
// schema at all) makes a runner execute a step of its choice with a state
// and signals of its choice (a "charge" of any amount, an "approved"
// signal nobody sent). The outcome write is fenced afterwards, but the
// step's side effects have happened. Fixed: a notification names ids only,
// and the runner runs only what the database confirms is leased to it
// (flow_leased_steps): neither the old payload, nor one naming an id that
// does not exist, nor one naming an awaiting instance before its signal
// runs anything.
func TestForgedNotificationRunsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type charge struct {
		Amount int `json:"amount"`
	}
	var mu sync.Mutex
	var charged []string
	pay := wharfflow.New[charge]("pay", nil).
		Step("wait", func(ctx context.Context, s *charge, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("charge", "approved")
		}).
		Step("charge", func(ctx context.Context, s *charge, in wharfflow.Input) wharfflow.Outcome {
			mu.Lock()
			charged = append(charged, fmt.Sprintf("instance %d: %d (signals %d)", in.Instance, s.Amount, len(in.Signals)))
			mu.Unlock()
			return wharfflow.Done(nil)
		})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{pay}, RunnerID: "victim"})
	b.waitRegistered(t, "victim")
	key := runnerKey(t, b, "victim")
	conn := nobody(t, b)

	_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows",
		forgedLease(key, 424242, "pay", "charge", `{"amount": 1000000}`,
			`[{"id": 1, "name": "approved", "payload": {"by": "nobody"}, "at": "2024-01-01T00:00:00Z"}]`))
	require.NoError(t, err)

	_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d 424242", key))
	require.NoError(t, err)

	// A real instance, signalled after the forgeries: once its step ran, the
	// runner has read the forged notifications (one listener, in order).
	ids, err := b.client.Start(ctx, pay.Start(charge{Amount: 5}, wharfflow.StartOptions{}))
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "awaiting")
	_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d %d", key, ids[0]))
	require.NoError(t, err)
	_, err = b.client.Send(ctx, wharfflow.Signal{Instance: ids[0], Name: "approved", Payload: json.RawMessage(`1`)})
	require.NoError(t, err)
	b.waitStatus(t, ids[0], "done")
	time.Sleep(200 * time.Millisecond) // the forged step's goroutine, if it was started
	mu.Lock()
	defer mu.Unlock()
	t.Logf("charges: %v", charged)
	require.Equal(t, []string{fmt.Sprintf("instance %d: 5 (signals 1)", ids[0])}, charged,
		"only the real instance's step ran")
}

const forgeHelperEnv = "WHARFFLOW_FORGE_HELPER"

// TestForgeHelperProcess is the runner process that
// TestLeasedStepOfAnUnknownFlowIsHandedBack notifies; it does nothing
// unless started by it.
func TestForgeHelperProcess(t *testing.T) {
	if os.Getenv(forgeHelperEnv) == "" {
		return
	}
	runDoomed(t, 0, wharfflow.New[counter]("known", nil).
		Step("s", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(nil)
		}))
}

// H4b. A step of a flow the runner does not run, leased to its id (two
// processes given one RunnerID with different Flows, or a forged
// notification naming such a row), used to make Runner.run call a method
// on a nil Definition: the runner's process died (one NOTIFY from any role
// stopped every runner on the schema). Fixed: the runner reads the step
// (flow_leased_steps), hands it back (due for a runner that runs its flow)
// and lives; a forged notification naming a flow and an id that do not
// exist does nothing.
func TestLeasedStepOfAnUnknownFlowIsHandedBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestForgeHelperProcess$", "-test.count=1")
	cmd.Env = append(testdb.CleanEnv(), forgeHelperEnv+"=1", "WHARFFLOW_SCHEMA="+b.schema, "TEST_DATABASE_URL="+databaseURL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	b.waitRegistered(t, "doomed")
	key := runnerKey(t, b, "doomed")
	conn := nobody(t, b)
	_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d 424242", key))
	require.NoError(t, err)

	// A row of another flow leased to the runner's id, as a signal leaves it.
	var id int64
	require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+b.schema+`.flow_instances
(flow, step, status, lease_owner, lease_token, lease_key, await_signals, run_at)
VALUES ('no-such-flow', 's', 'running', 'doomed', 7, $1, '{go}', clock_timestamp() + interval '1 hour') RETURNING id`, key).Scan(&id))
	_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", b.schema+"_flows", fmt.Sprintf("L%d %d", key, id))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var status string
		var owner *string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT status, lease_owner FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&status, &owner))
		return status == "ready" && owner == nil
	}, time.Minute, 5*time.Millisecond, "the runner never handed the step back")
	select {
	case <-exited:
		tail := out.String()
		if len(tail) > 600 {
			tail = tail[:600]
		}
		require.Fail(t, "the runner process died on a step of a flow it does not run", "%s", tail)
	default:
	}
}
