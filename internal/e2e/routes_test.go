package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/wharfhq/wharf"
)

// One relay routes topics to different sinks from the YAML config: orders.*
// to one file, hooks.** to another, everything else to --sink. Each file gets
// exactly its topics, every message once, per-key order intact, though keys
// span the three sinks.
func TestRelayRoutesTopicsFromYAML(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	orders, hooks, rest := filepath.Join(dir, "orders.jsonl"), filepath.Join(dir, "hooks.jsonl"), filepath.Join(dir, "rest.jsonl")
	cfg := filepath.Join(dir, "wharf.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`routes:
  - topic: "orders.*"
    sink: "file://%s"
  - topic: "hooks.**"
    sink: "file://%s"
sink: "file://%s"
log_level: warn
`, orders, hooks, rest)), 0o644))

	topics := []string{"orders.created", "hooks.eu.paid", "audit", "orders.eu.created", "hooks.x"}
	wantTopic := map[string]string{"orders.created": orders, "hooks.eu.paid": hooks, "audit": rest, "orders.eu.created": rest, "hooks.x": hooks}
	want := map[string][]int64{} // file -> ids
	for i := range 500 {
		topic := topics[i%len(topics)]
		var id string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT "+b.schema+".enqueue($1, $2, $3::jsonb)", topic, fmt.Sprintf("k%d", i%7), fmt.Sprintf(`{"n":%d}`, i)).Scan(&id))
		seq, _, err := wharf.ParseID(id)
		require.NoError(t, err)
		want[wantTopic[topic]] = append(want[wantTopic[topic]], seq)
	}

	res := runCLI(t, nil, time.Minute, "--config", cfg, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL)
	require.Equalf(t, 0, res.code, "relay with routes: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	for file, ids := range want {
		ds := readJSONL(t, file, 0)
		got := map[int64]bool{}
		for _, d := range ds {
			require.Equalf(t, file, wantTopic[d.Topic], "topic %q went to %s", d.Topic, filepath.Base(file))
			got[d.Seq] = true
		}
		for _, id := range ids {
			require.Truef(t, got[id], "%s: message %d missing", filepath.Base(file), id)
		}
		require.Len(t, got, len(ids), filepath.Base(file))
		requireKeyOrder(t, filepath.Base(file), ds)
	}
}

// A topic no route matches (and no --sink) is dead-lettered with a message
// naming it, and the rest is delivered.
func TestRelayUnroutedTopicIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := filepath.Join(t.TempDir(), "orders.jsonl")
	ctx := context.Background()
	for _, topic := range []string{"orders.created", "stray", "orders.paid"} {
		_, err := b.pool.Exec(ctx, "SELECT "+b.schema+".enqueue($1, $2, '{}'::jsonb)", topic, "k-"+topic)
		require.NoError(t, err)
	}
	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--route", "orders.*=file://"+out)
	require.Equalf(t, 0, res.code, "relay: %s", res.stderr)
	require.Len(t, readJSONL(t, out, 0), 2)
	var topic, lastErr string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT topic, last_error FROM "+b.schema+".dead_letters").Scan(&topic, &lastErr))
	require.Equal(t, "stray", topic)
	require.Contains(t, lastErr, `no route matches topic "stray"`)
}
