package cli

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A Kafka sink that no broker answers is named in one WARN line at start;
// the relay starts anyway (here it drains an empty outbox and exits 0).
func TestRelayWarnsWhenTheSinkDoesNotAnswer(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	code, _, errOut := session{}.run(b.cmd("relay", "--sink", "kafka://"+freeAddr(t), "--drain")...)
	require.Equal(t, 0, code, errOut)
	var warns []string
	for _, l := range strings.Split(errOut, "\n") {
		if strings.Contains(l, "level=WARN") {
			warns = append(warns, l)
		}
	}
	require.Len(t, warns, 1, errOut)
	require.Contains(t, warns[0], "the sink does not answer; starting anyway")
}

// With routes and no --sink, the relay warns at start that unrouted topics
// are dead-lettered.
func TestRelayWarnsThatUnroutedTopicsAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	code, _, errOut := session{}.run(b.cmd("relay", "--route", "orders.*=null:", "--drain")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "no --sink: a message whose topic no --route matches is dead-lettered at its first attempt")
}

// --drain-timeout stops a drain that waits for a retry, exits 1 and says
// what is left: the retrying message and when it is tried next.
func TestDrainTimeoutNamesWhatIsLeft(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	ids, err := b.client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	require.NoError(t, err)
	seq, _, err := wharf.ParseID(ids[0])
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.retries (id, lane, attempts, next_attempt_at, last_error)
SELECT id, lane, 1, now() + interval '10 minutes', 'sink said no' FROM `+b.schema+`.outbox WHERE id = $1`, seq)
	require.NoError(t, err)

	code, _, errOut := session{}.run(b.cmd("relay", "--sink", "null:", "--drain", "--drain-timeout", "1s")...)
	require.Equal(t, 1, code, errOut)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	last := lines[len(lines)-1]
	requireOneLineError(t, last+"\n", "--drain-timeout 1s passed before the outbox was drained: 1 retrying message, next attempt in ")
	require.Regexp(t, `next attempt in (9m\d+s|10m0s) left`, last)
	require.Equal(t, 1, b.count(t, "outbox"), "the message stays for a later relay")

	code, _, errOut = session{}.run(b.cmd("relay", "--sink", "null:", "--drain", "--drain-timeout", "0s")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--drain-timeout must be at least 1ms (got 0s)")
}

// --sink-batch above --max-buffered is refused before anything starts.
func TestSinkBatchAtMostMaxBuffered(t *testing.T) {
	t.Parallel()
	code, _, errOut := run("--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--sink", "stdout:", "--sink-batch", "99999999")
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--sink-batch (99999999) must not be more than --max-buffered (20000)")
	code, _, errOut = run("--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--sink", "stdout:", "--sink-batch", "5000", "--max-buffered", "4000")
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--sink-batch (5000) must not be more than --max-buffered (4000)")
}

// YAML and value errors: a value with an unquoted colon gets its line and a
// quoting hint; a value of the wrong type names its line (or flag) and what
// the setting takes, without Go parser internals.
func TestConfigValueErrorsSayWhatIsWanted(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
		code int
	}{
		{[]string{"--config", writeConfig(t, "max_attempts: 3\nsink: stdout:\n"), "relay"},
			`mapping values are not allowed in this context (line 2: the value of sink holds a colon: quote it, e.g. sink: "stdout:")`, 1},
		{[]string{"--config", writeConfig(t, "sink: \"stdout:\"\nmax_attempts: three\n"), "relay"},
			`line 2: invalid value "three" for max-attempts: want a whole number`, 1},
		{[]string{"relay", "--fetch-batch", "lots"}, `invalid value "lots" for --fetch-batch: want a whole number`, 2},
		{[]string{"relay", "--lease-ttl", "soon"}, `invalid value "soon" for --lease-ttl: want a duration such as 500ms, 10s or 1m30s`, 2},
		{[]string{"relay", "--max-buffered-bytes", "lots"}, `invalid value "lots" for --max-buffered-bytes: want a number of bytes such as`, 2},
	}
	for _, c := range cases {
		code, _, errOut := run(c.args...)
		require.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		requireOneLineError(t, errOut, c.want)
		require.NotContains(t, errOut, "strconv", c.args)
	}
}

// The systemd environment example reads the same in a shell as in systemd:
// sourcing it keeps the whole sink URL (an unquoted & would end the line).
func TestEnvExampleSourcesInAShell(t *testing.T) {
	t.Parallel()
	path := filepath.Join(repoRoot(t), "deploy", "systemd", "wharf.env.example")
	out, err := exec.Command("sh", "-c", `set -a; . "$1"; set +a; printf '%s\n%s\n' "$WHARF_SINK" "$WHARF_DATABASE_URL"`, "sh", path).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, "nats://nats.internal:4222?stream=WHARF&subject_template=wharf.{{topic}}\n"+
		"postgres://wharf:CHANGE-ME@db.internal:5432/app?sslmode=verify-full\n", string(out))
}
