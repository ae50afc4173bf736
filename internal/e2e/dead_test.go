package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A sink that always fails (writes to /dev/full return ENOSPC) sends every
// message to the dead-letter table after --max-attempts; the CLI lists them,
// retries them (same ids, each key in order) and purges them.
func TestDeadLetterCLI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var msgs []wharf.Message
	for i := 0; i < 20; i++ {
		msgs = append(msgs, wharf.Message{Topic: "dl", Key: fmt.Sprintf("k%d", i%2), Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	ids, err := b.client.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, nil, time.Minute, append(args, "--schema", b.schema, "--database-url", databaseURL)...)
	}

	res := cli("relay", "--drain", "--sink", "file:///dev/full", "--max-attempts", "2", "--retry-backoff", "10ms", "--max-retry-backoff", "20ms", "--log-level", "error")
	require.Equalf(t, 0, res.code, "stderr: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t), "every message must have left the outbox for the dead-letter table")

	res = cli("dead", "list", "--json")
	require.Equalf(t, 0, res.code, "stderr: %s", res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, len(ids))
	for i, line := range lines {
		// The --json format of every list command: snake_case, the payload
		// inline when it is JSON.
		var d struct {
			ID        string          `json:"id"`
			Attempts  int             `json:"attempts"`
			LastError string          `json:"last_error"`
			Payload   json.RawMessage `json:"payload"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &d), line)
		require.Equal(t, ids[i], d.ID, "dead letters are listed in id order")
		require.Equal(t, 2, d.Attempts)
		require.Contains(t, d.LastError, "no space left on device")
		require.JSONEq(t, string(msgs[i].Payload), string(d.Payload))
	}
	res = cli("dead", "list")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "no space left on device")
	res = cli("status")
	require.Equal(t, 0, res.code)
	require.Regexp(t, `dead letters\s+20`, res.stdout)

	res = cli("dead", "retry", "--id", fmt.Sprint(ids[0]))
	require.Equalf(t, 0, res.code, "stderr: %s", res.stderr)
	require.Equal(t, "1 dead letter moved back to the outbox\n", res.stdout)
	res = cli("dead", "retry", "--topic", "dl")
	require.Equal(t, 0, res.code)
	require.Equal(t, "19 dead letters moved back to the outbox\n", res.stdout)

	out := filepath.Join(t.TempDir(), "out.jsonl")
	res = cli("relay", "--drain", "--sink", "file://"+out, "--log-level", "error")
	require.Equalf(t, 0, res.code, "stderr: %s", res.stderr)
	ds := readJSONL(t, out, 0)
	require.Len(t, ds, len(ids))
	got := map[string]bool{}
	for _, d := range ds {
		got[d.ID] = true
	}
	for _, id := range ids {
		require.True(t, got[id], "retried message %d must keep its id", id)
	}
	requireKeyOrder(t, "retried dead letters", ds)

	_, err = b.client.Enqueue(ctx, wharf.Message{Topic: "dl2", Payload: []byte(`1`)})
	require.NoError(t, err)
	res = cli("relay", "--drain", "--sink", "file:///dev/full", "--max-attempts", "1", "--log-level", "error")
	require.Equal(t, 0, res.code)
	res = cli("dead", "purge", "--all")
	require.NotEqual(t, 0, res.code, "purging every dead letter needs --yes when nobody can be asked")
	require.Contains(t, res.stderr, "--yes")
	res = cli("dead", "purge", "--all", "--yes")
	require.Equal(t, 0, res.code)
	require.Equal(t, "1 dead letter purged\n", res.stdout)
	res = cli("dead", "list", "--json")
	require.Equal(t, 0, res.code)
	require.Empty(t, strings.TrimSpace(res.stdout))
}
