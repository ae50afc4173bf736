package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// dead list shows the cause of each failure (without the sink name, message
// id and request every error starts with) and filters by key; dead show
// prints one in full; --json of both uses the names and payload rules of
// outbox list --json.
func TestDeadListShowsTheCauseAndDeadShowTheWhole(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	id1, id2 := wharf.FormatID(1, 7), wharf.FormatID(2, 7)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.dead_letters (id, nonce, topic, key, payload, headers, created_at, attempts, last_error) VALUES
    (1, 7, 'hooks.poison', 'k1', '{"order":44}', '{"trace":"t-1"}', now(), 3,
     'wharfwebhook: message `+id1+`: POST http://127.0.0.1:18500/in/hooks.poison/with/a/long/path/that/fills/the/column: 500 Internal Server Error: database on fire'),
    (2, 7, 'hooks.poison', 'k2', '\xff00', NULL, now(), 1,
     'permanent: wharfwebhook: message `+id2+`: POST http://127.0.0.1:18500/in/hooks.poison: 400 Bad Request: missing field "customer"')`)
	require.NoError(t, err)

	code, out, errOut := session{}.run(b.cmd("dead", "list")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^1\s+`+id1+`\s+hooks.poison\s+k1\s+3\s+\S+\s+500 Internal Server Error: database on fire$`, out)
	require.Regexp(t, `(?m)^2\s+`+id2+`\s+hooks.poison\s+k2\s+1\s+\S+\s+permanent: 400 Bad Request: missing field "customer"$`, out)
	require.Contains(t, errOut, "wharf dead show ID")

	code, out, errOut = session{}.run(b.cmd("dead", "list", "--key", "k2")...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, id1)
	require.Contains(t, out, id2)

	code, out, errOut = session{}.run(b.cmd("dead", "show", "1")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^last error\s+wharfwebhook: message `+id1+`: POST http://127.0.0.1:18500/in/hooks.poison/with/a/long/path/that/fills/the/column: 500 Internal Server Error: database on fire$`, out)
	require.Regexp(t, `(?m)^cause\s+500 Internal Server Error: database on fire$`, out)
	require.Regexp(t, `(?m)^headers\s+trace: t-1$`, out)
	require.Contains(t, out, "\n{\"order\":44}\n")
	code, out, errOut = session{}.run(b.cmd("dead", "show", "--id", id2)...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^payload\s+2 bytes, not UTF-8, in base64:\n/wA=$`, out)
	code, _, errOut = session{}.run(b.cmd("dead", "show", "99")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "no dead letter has id 99")
	code, _, errOut = session{}.run(b.cmd("dead", "show")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "say which dead letters: wharf dead show ID")

	for _, args := range [][]string{{"dead", "list", "--json"}, {"dead", "show", "--json", "1", "2"}} {
		code, out, errOut = session{}.run(b.cmd(args...)...)
		require.Equal(t, 0, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, args)
		var first, second map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
		require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
		require.Equal(t, id1, first["id"])
		require.Equal(t, map[string]any{"order": float64(44)}, first["payload"], "a JSON payload is inline")
		require.Equal(t, "/wA=", second["payload"])
		require.Equal(t, "base64", second["payload_encoding"])
		require.Equal(t, "500 Internal Server Error: database on fire", first["cause"])
		require.Equal(t, float64(3), first["attempts"])
		require.Nil(t, first["deliver_at"], "no zero-value time")
		require.NotContains(t, lines[0], "0001-01-01")
		for k := range first {
			require.Regexp(t, `^[a-z_]+$`, k, "snake_case names")
		}
	}
}
