package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// With --log-format json every stderr line is JSON, the fatal error
// included; with text the error stays one plain line.
func TestFatalErrorIsJSONWithLogFormatJSON(t *testing.T) {
	t.Parallel()
	code, _, errOut := run("relay", "--log-format", "json", "--sink", "stdout:", "--database-url", "postgres://u:PGSECRET@127.0.0.1:1/x", "--schema", "wharf_json_err")
	require.Equal(t, 1, code, errOut)
	lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
	var last map[string]any
	for _, l := range lines {
		require.NoError(t, json.Unmarshal([]byte(l), &last), "not JSON: %q", l)
	}
	require.Equal(t, "ERROR", last["level"])
	require.Contains(t, last["msg"], "wharf: ")
	require.Contains(t, last["msg"], "cannot connect to the database at 127.0.0.1:1")
	require.EqualValues(t, 1, last["exit_code"])
	require.NotContains(t, errOut, "PGSECRET")

	// A usage error found after the log format is known: JSON, exit 2.
	code, _, errOut = run("relay", "--log-format", "json", "--sink", "stdout:", "--max-attempts", "0", "--database-url", "postgres://127.0.0.1:1/x")
	require.Equal(t, 2, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(errOut)), &last), errOut)
	require.EqualValues(t, 2, last["exit_code"])

	// Text stays text.
	code, _, errOut = run("relay", "--sink", "stdout:", "--database-url", "postgres://127.0.0.1:1/x", "--schema", "wharf_json_err")
	require.Equal(t, 1, code)
	require.True(t, strings.HasPrefix(errOut, "wharf: "), errOut)
}
