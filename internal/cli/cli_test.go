package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func run(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wharf.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

// Flags beat the environment, which beats the YAML file. Not parallel: it
// sets environment variables.
func TestConfigPrecedence(t *testing.T) {
	cfg := writeConfig(t, "schema: from_yaml\nlog_level: warn\n")
	t.Setenv("WHARF_SCHEMA", "")

	code, out, errOut := run("--config", cfg, "migrate", "print")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "CREATE TABLE from_yaml.outbox")

	t.Setenv("WHARF_SCHEMA", "from_env")
	code, out, errOut = run("--config", cfg, "migrate", "print")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "CREATE TABLE from_env.outbox")

	code, out, errOut = run("--config", cfg, "--schema", "from_flag", "migrate", "print")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "CREATE TABLE from_flag.outbox")
	require.NotContains(t, out, "from_env")
}

func TestConfigErrorsAreOneLineAndNameTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want string
		code int
	}{
		{"unknown yaml key", []string{"--config", writeConfig(t, "sinkk: \"stdout:\"\n"), "migrate", "print"}, `line 1: unknown field "sinkk"`, 1},
		{"yaml map value", []string{"--config", writeConfig(t, "sink:\n  a: b\n"), "migrate", "print"}, `field "sink" must be a single value`, 1},
		{"bad yaml value", []string{"--config", writeConfig(t, "lease_ttl: soon\n"), "relay"}, "invalid value \"soon\" for lease-ttl", 1},
		{"missing config file", []string{"--config", "/nonexistent/wharf.yaml", "version"}, "config file", 1},
		{"bad schema", []string{"--schema", "Bad-Name", "migrate", "print"}, `--schema: invalid schema name "Bad-Name"`, 2},
		{"bad log level", []string{"--log-level", "loud", "version"}, `--log-level "loud"`, 2},
		{"unknown flag", []string{"relay", "--sinkk", "x"}, "unknown flag: --sinkk", 2},
		{"bad duration flag", []string{"relay", "--lease-ttl", "banana"}, "lease-ttl", 2},
		{"relay without sink", []string{"--database-url", "postgres://x@127.0.0.1:1/x", "relay"}, "--sink is required", 2},
		{"relay without database", []string{"relay", "--sink", "stdout:"}, "no database URL", 2},
		{"unknown sink", []string{"relay", "--sink", "kafak://x"}, `unknown sink scheme "kafak"`, 2},
		{"dead retry without selector", []string{"dead", "retry"}, "--all", 2},
		{"demo bad count", []string{"demo", "--messages", "0"}, "--messages must be at least 1", 2},
		{"stray argument", []string{"version", "now"}, "takes no arguments", 2},
		{"route without url", []string{"--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--route", "orders.*"}, `--route "orders.*": write PATTERN=SINK_URL`, 2},
		{"route bad pattern", []string{"--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--route", "orders*=stdout:"}, `"*" must be a whole segment`, 2},
		{"route unknown sink", []string{"--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--route", "a.*=kafak://x"}, `route "a.*": unknown sink scheme "kafak"`, 2},
		{"yaml routes not a list", []string{"--config", writeConfig(t, "routes: \"stdout:\"\n"), "relay"}, "routes must be a list of {topic: PATTERN, sink: URL} items", 1},
		{"yaml route missing sink", []string{"--config", writeConfig(t, "routes:\n  - topic: orders.*\n"), "relay"}, "line 2: a route needs both topic and sink", 1},
		{"yaml route unknown field", []string{"--config", writeConfig(t, "routes:\n  - topic: orders.*\n    sinc: \"stdout:\"\n"), "relay"}, `line 3: unknown route field "sinc"`, 1},
		{"library validation names the flag", []string{"--database-url", "postgres://x@127.0.0.1:1/x", "relay", "--sink", "stdout:", "--fetch-batch", "10"}, "--fetch-batch must be at least 64", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := run(c.args...)
			require.Equal(t, c.code, code, errOut)
			line := strings.TrimRight(errOut, "\n")
			require.NotContains(t, line, "\n", "errors must be one line")
			require.True(t, strings.HasPrefix(line, "wharf: "), line)
			require.False(t, strings.HasPrefix(line, "wharf: wharf:"), line)
			require.Contains(t, line, c.want)
		})
	}
}

func TestVersionAndPrint(t *testing.T) {
	t.Parallel()
	code, out, _ := run("version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^wharf \S+ \(go[^,]*, schema version 1\)\n$`, out)

	code, out, _ = run("--schema", "shop", "migrate", "print", "--down")
	require.Equal(t, 0, code)
	require.Contains(t, out, "DROP TABLE IF EXISTS shop.outbox")
	require.Contains(t, out, "DELETE FROM shop.schema_migrations WHERE version = 1")
}

func TestOneLineErrorFoldsConnectionAttempts(t *testing.T) {
	t.Parallel()
	err := errors.New("cannot connect: failed to connect to `user=postgres`:\n\t127.0.0.1:1 (127.0.0.1): dial error: refused\n\t127.0.0.1:1 (127.0.0.1): dial error: refused")
	require.Equal(t, "cannot connect: failed to connect to `user=postgres`: 127.0.0.1:1 (127.0.0.1): dial error: refused", oneLineError(err))
	require.Equal(t, "--max-retry-backoff (1s) must be at least --retry-backoff (2s)",
		oneLineError(errors.New("wharf: Config.MaxRetryBackoff (1s) must be at least Config.RetryBackoff (2s)")))
}

func TestRouteSecretsAreRedacted(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders.*=https://u:xxxxx@h/x?wharf_header_Authorization=xxxxx&wharf_mode=batch",
		redactRoute("orders.*=https://u:pw@h/x?wharf_header_Authorization=Bearer+s3cret&wharf_mode=batch"))
	require.Equal(t, "https://h/?wharf_secret_env=HOOK_SECRET", redactURL("https://h/?wharf_secret_env=HOOK_SECRET"))
}
