package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testdb"
)

// The bench's flag mistakes are usage errors of one line that name the
// fix, reported before any database is started.
func TestBenchOutboxModeErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "drain", "--poison-percent", "1"}, "--poison-percent fails messages in the in-process relay's sink"},
		{[]string{"--mode", "soak", "--rate", "100", "--duration", "1m", "--poison-percent", "51"}, "--poison-percent must be between 0 and 50, got 51"},
		{[]string{"--mode", "steady", "--rate", "100", "--relays", "2"}, "use --relays 1 (got --relays 2)"},
		{[]string{"--mode", "drain", "--limits"}, "--limits measures the table outbox's removal limit"},
		{[]string{"--mode", "drain", "--cpuprofile", "x.prof"}, "--cpuprofile profiles this process, and this run's relays run as processes"},
	} {
		args := append([]string{"bench", "--outbox-mode", "wal"}, c.args...)
		code, _, errOut := run(args...)
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, c.want)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %q", errOut)
	}
}

func TestBenchHelpDescribesWALMode(t *testing.T) {
	t.Parallel()
	code, out, errOut := run("bench", "--help")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "--outbox-mode wal")
	require.Contains(t, out, "emit limit")
}

// --cpuprofile writes a profile go tool pprof reads (gzip-compressed
// protobuf) of a run with the relay in this process.
func TestBenchCPUProfile(t *testing.T) {
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "cpu.prof")
	code, _, errOut := run("bench", "--database-url", url, "--mode", "drain", "--messages", "2000", "--cpuprofile", path)
	require.Equal(t, 0, code, errOut)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(b), 2)
	require.Equal(t, []byte{0x1f, 0x8b}, b[:2], "a gzip-compressed profile")
}

// --messages-per-tx is --producer-batch: a table outbox's drain is then
// pre-filled through Enqueue, that many messages per transaction.
func TestBenchMessagesPerTx(t *testing.T) {
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	code, out, errOut := run("bench", "--database-url", url, "--mode", "drain", "--messages", "500", "--messages-per-tx", "1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "pre-fill (Enqueue, 1 per tx)")
	require.Regexp(t, `delivered +500 \(0 redelivered\)`, out)
}

// The flow bench's flag mistakes are one-line usage errors naming the
// flag, reported before any database is started.
func TestBenchFlowFlagErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency-keys", "0"}, "--concurrency-keys must be at least 1, got 0"},
		{[]string{"--concurrency-limit", "-1"}, "--concurrency-limit must be at least 1, got -1"},
		{[]string{"--step-time", "10ms-2ms"}, `invalid value "10ms-2ms" for --step-time: the minimum 10ms is above the maximum 2ms`},
		{[]string{"--step-time", "fast"}, `invalid value "fast" for --step-time: use MIN-MAX, e.g. 2ms-10ms, or one duration`},
		{[]string{"--rate-limit", "0"}, "--rate-limit must be above 0, got 0"},
		{[]string{"--rate-burst", "0.5"}, "--rate-burst must be at least 1, got 0.5"},
		{[]string{"--rate-for", "0s"}, "--rate-for must be above 0, got 0s"},
		{[]string{"--drain-timeout", "-1s"}, "--drain-timeout must not be negative, got -1s"},
		{[]string{"--workload", "keyed,bursty"}, `--workload "bursty": use steps, signal, children, keyed, keyed-unkeyed or ratelimited`},
	} {
		args := append([]string{"bench", "--mode", "flow", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, c.args...)
		code, _, errOut := run(args...)
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, c.want)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %q", errOut)
	}
}

func TestBenchHelpDescribesFlowWorkloads(t *testing.T) {
	t.Parallel()
	code, out, errOut := run("bench", "--help")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"--concurrency-keys", "--concurrency-limit", "--step-time range", "--rate-limit", "--rate-burst",
		"--rate-for", "--drain-timeout", "--skip-unkeyed", "keyed (a parent spawning 3 children", "ratelimited (3 empty steps"} {
		require.Contains(t, out, want)
	}
}
