package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
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
	require.Regexp(t, `^wharf \S+ \(development build, go[^,]*, schema version 9\)\n$`, out)

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
	for field, flag := range map[string]string{"LeaseTTL": "lease-ttl", "RelayID": "relay-id", "MaxBufferedBytes": "max-buffered-bytes", "FetchBatch": "fetch-batch", "HTTPTimeout": "http-timeout"} {
		require.Equal(t, flag, kebab(field))
	}
}

// No secret of a sink or database URL reaches a log line: passwords, query
// values that are not known options, webhook paths that carry tokens,
// key=value DSN passwords.
func TestURLSecretsAreRedacted(t *testing.T) {
	t.Parallel()
	for raw, secret := range map[string]string{
		"orders.*=https://u:pw1@h/x?wharf_header_Authorization=Bearer+s3cret&wharf_mode=batch": "s3cret",
		"https://hooks.slack.com/services/T1/B2/SLACKSECRET":                                   "SLACKSECRET",
		"https://discord.com/api/webhooks/123/DISCORDSECRET":                                   "DISCORDSECRET",
		"https://x.azurewebsites.net/api/f?code=AZURESECRET":                                   "AZURESECRET",
		"https://acct.blob.core.windows.net/c?sv=1&sig=SASSECRET":                              "SASSECRET",
		"amqp://guest:AMQPSECRET@127.0.0.1:5672/":                                              "AMQPSECRET",
		"redis://:REDISSECRET@127.0.0.1:6379/0":                                                "REDISSECRET",
		"kafka://127.0.0.1:9092?sasl_password=KAFKASECRET&topic_template=x.{{topic}}":          "KAFKASECRET",
		"nats://127.0.0.1:4222?token=NATSSECRET&stream=S":                                      "NATSSECRET",
		"host=db user=app password=DSNSECRET dbname=app":                                       "DSNSECRET",
		"postgres://app:PGSECRET@db:5432/app?sslmode=verify-full":                              "PGSECRET",
	} {
		got := redactURL(raw)
		if pattern, _, ok := strings.Cut(raw, "="); ok && strings.Contains(pattern, "*") {
			got = redactRoute(raw)
		}
		require.NotContains(t, got, secret, "%s -> %s", raw, got)
	}
	require.Equal(t, "host=db port=5432 dbname=app", redactURL("host=db user=app password=DSNSECRET dbname=app"))
	require.Equal(t, "kafka://127.0.0.1:9092?sasl_password=xxxxx&topic_template=x.%7B%7Btopic%7D%7D",
		redactURL("kafka://127.0.0.1:9092?sasl_password=KAFKASECRET&topic_template=x.{{topic}}"), "known options stay readable")
}

// Every relay setting comes from a flag, else a WHARF_* variable, else the
// YAML file, else its default; `config validate --offline` shows each value
// with its source. Not parallel: it sets environment variables.
func TestSettingsPrecedence(t *testing.T) {
	cfg := writeConfig(t, "sink: \"file:///tmp/from-yaml.jsonl\"\nmax_attempts: 3\nlease_ttl: 30s\nfetch_batch: 500\nmax_buffered_bytes: 8MiB\nroutes:\n  - {topic: \"orders.*\", sink: \"stdout:\"}\n")
	t.Setenv("WHARF_MAX_ATTEMPTS", "5")
	t.Setenv("WHARF_LEASE_TTL", "20s")
	t.Setenv("WHARF_SCHEMA", "env_schema")
	t.Setenv("WHARF_CONFIG", cfg)
	code, out, errOut := run("config", "validate", "--offline", "--lease-ttl", "15s")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		`lease-ttl\s+15s\s+flag`,
		`max-attempts\s+5\s+environment variable WHARF_MAX_ATTEMPTS`,
		`sink\s+file:///tmp/from-yaml.jsonl\s+config file ` + regexp.QuoteMeta(cfg),
		`fetch-batch\s+500\s+config file`,
		`max-buffered-bytes\s+8MiB\s+config file`,
		`route\s+orders\.\*=stdout:\s+config file`,
		`schema\s+env_schema\s+environment variable WHARF_SCHEMA`,
		`sink-batch\s+1000\s+default`,
		`stop-timeout\s+30s\s+default`,
		`(?m)^the settings are valid$`,
	} {
		require.Regexp(t, want, out)
	}

	// DATABASE_URL is the fallback of WHARF_DATABASE_URL; secrets are hidden.
	t.Setenv("DATABASE_URL", "postgres://app:FALLBACKSECRET@db1/app")
	code, out, _ = run("config", "validate", "--offline")
	require.Equal(t, 0, code)
	require.Regexp(t, `database-url\s+postgres://app:xxxxx@db1/app\s+environment variable DATABASE_URL`, out)
	t.Setenv("WHARF_DATABASE_URL", "host=db2 user=app password=DSNSECRET dbname=app")
	code, out, _ = run("config", "validate", "--offline")
	require.Equal(t, 0, code)
	require.Regexp(t, `database-url\s+host=db2 port=5432 dbname=app\s+environment variable WHARF_DATABASE_URL`, out)
	require.NotContains(t, out, "SECRET")
}

// A given zero, negative or out-of-range value is refused with the range,
// the value and where it came from, on one line (exit 2), before anything is
// opened. Not parallel: some cases set environment variables.
func TestSettingsRefusals(t *testing.T) {
	db := []string{"--database-url", "postgres://x@127.0.0.1:1/x"}
	cases := []struct {
		name string
		env  map[string]string
		yaml string
		args []string
		want string
	}{
		{"max-attempts 0", nil, "", []string{"--max-attempts", "0"}, "--max-attempts must be at least 1 (got 0)"},
		{"max-attempts negative", nil, "", []string{"--max-attempts", "-3"}, "--max-attempts must be at least 1 (got -3)"},
		{"max-attempts from env", map[string]string{"WHARF_MAX_ATTEMPTS": "0"}, "", nil, "--max-attempts must be at least 1 (got 0 from environment variable WHARF_MAX_ATTEMPTS)"},
		{"max-attempts from yaml", nil, "max_attempts: 0\n", nil, "--max-attempts must be at least 1 (got 0 from config file "},
		{"fetch-batch", nil, "", []string{"--fetch-batch", "10"}, "--fetch-batch must be at least 64 (got 10)"},
		{"sink-batch", nil, "", []string{"--sink-batch", "0"}, "--sink-batch must be at least 1 (got 0)"},
		{"sink-concurrency", nil, "", []string{"--sink-concurrency", "-1"}, "--sink-concurrency must be at least 1 (got -1)"},
		{"max-buffered", nil, "", []string{"--max-buffered", "0"}, "--max-buffered must be at least 64 (got 0)"},
		{"max-buffered below fetch-batch", nil, "", []string{"--max-buffered", "100"}, "--max-buffered (100) must be at least --fetch-batch (4000)"},
		{"max-buffered-bytes", nil, "", []string{"--max-buffered-bytes", "1000"}, "--max-buffered-bytes must be at least 1MiB (got 1000)"},
		{"max-buffered-bytes unit", nil, "", []string{"--max-buffered-bytes", "64 parsecs"}, `want a number of bytes such as 67108864, 64MiB or 1GiB`},
		{"poll-interval", nil, "", []string{"--poll-interval", "0s"}, "--poll-interval must be at least 1ms (got 0s)"},
		{"fetch-interval", nil, "", []string{"--fetch-interval", "0s"}, "--fetch-interval must be at least 1µs (got 0s)"},
		{"fetch-interval above poll", nil, "", []string{"--fetch-interval", "100ms"}, "--fetch-interval (100ms) must not be longer than --poll-interval (50ms), the idle poll it starts from"},
		{"lease-ttl", nil, "", []string{"--lease-ttl", "-1s"}, "--lease-ttl must be at least 1ms (got -1s)"},
		{"lease-ttl below rebalance", nil, "", []string{"--lease-ttl", "2s"}, "--lease-ttl (2s) must be at least 3 x --rebalance-interval (1s)"},
		{"rebalance-interval", nil, "", []string{"--rebalance-interval", "0"}, "--rebalance-interval must be at least 1ms (got 0s)"},
		{"retry-backoff", nil, "", []string{"--retry-backoff", "0s"}, "--retry-backoff must be at least 1ms (got 0s)"},
		{"max-retry-backoff", nil, "", []string{"--max-retry-backoff", "0s"}, "--max-retry-backoff must be at least 1ms (got 0s)"},
		{"max below retry backoff", nil, "", []string{"--retry-backoff", "2s", "--max-retry-backoff", "1s"}, "--max-retry-backoff (1s) must be at least --retry-backoff (2s)"},
		{"stop-timeout", nil, "", []string{"--stop-timeout", "0s"}, "--stop-timeout must be at least 1ms (got 0s)"},
		{"bad env value", map[string]string{"WHARF_LEASE_TTL": "soon"}, "", nil, `environment variable WHARF_LEASE_TTL: invalid value "soon" for lease-ttl`},
		{"action flags are not settings", nil, "all: true\n", nil, `unknown field "all"`},
	}
	for _, cmd := range []string{"relay", "config validate"} {
		for _, c := range cases {
			t.Run(cmd+"/"+c.name, func(t *testing.T) {
				for k, v := range c.env {
					t.Setenv(k, v)
				}
				args := append(strings.Fields(cmd), "--sink", "stdout:")
				if c.yaml != "" {
					args = append(args, "--config", writeConfig(t, c.yaml))
				}
				args = append(append(args, db...), c.args...)
				code, out, errOut := run(args...)
				// A value out of range is a usage error (2); a file or
				// variable that does not parse is a failure (1).
				want := 2
				if c.name == "bad env value" || c.name == "action flags are not settings" {
					want = 1
				}
				require.Equal(t, want, code, "%s%s", out, errOut)
				line := strings.TrimRight(errOut, "\n")
				require.NotContains(t, line, "\n", "errors must be one line")
				require.True(t, strings.HasPrefix(line, "wharf: "), line)
				require.Contains(t, line, c.want)
			})
		}
	}
}

// config validate connects to the database and opens every sink; anything
// unreachable is a FAILED line and a one-line error naming it (exit 1).
func TestConfigValidateChecksTheDatabaseAndSinks(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	b := newSchema(t)
	code, stdout, errOut := run(b.cmd("config", "validate", "--sink", "file://"+out, "--route", "orders.*=stdout:")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `database\s+ok: PostgreSQL .+, schema `+b.schema+` at version 9`, stdout)
	require.Regexp(t, `sink file://\S+\s+ok: opened`, stdout)
	require.Regexp(t, `sink stdout:\s+ok: opened`, stdout)
	require.Contains(t, stdout, "the configuration is valid\n")
	// The autovacuum line says what the server's settings mean for a busy
	// table outbox: a note (not a failure) when they let it bloat.
	var on bool
	var naptime int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT current_setting('autovacuum')::bool,
	    (SELECT setting::int FROM pg_settings WHERE name = 'autovacuum_naptime')`).Scan(&on, &naptime))
	switch {
	case !on:
		require.Regexp(t, `autovacuum\s+note: autovacuum is off: `, stdout)
	case naptime > 10:
		require.Regexp(t, `autovacuum\s+note: autovacuum_naptime is \S+: .+set autovacuum_naptime = 5s`, stdout)
	default:
		require.Regexp(t, `autovacuum\s+ok: naptime \S+`, stdout)
	}

	code, stdout, errOut = run(b.cmd("config", "validate", "--sink", "nats://127.0.0.1:1", "--route", "a.*=redis://:REDISSECRET@127.0.0.1:1/0")...)
	require.Equal(t, 1, code, stdout)
	require.Regexp(t, `sink nats://127.0.0.1:1\s+FAILED: `, stdout)
	line := strings.TrimRight(errOut, "\n")
	require.NotContains(t, line, "\n")
	require.Contains(t, line, "wharf: 2 problems: sink redis://:xxxxx@127.0.0.1:1/0: ")
	require.NotContains(t, stdout+errOut, "REDISSECRET")

	code, stdout, errOut = run("config", "validate", "--sink", "stdout:", "--database-url", "postgres://u:PGSECRET@127.0.0.1:1/x", "--schema", b.schema)
	require.Equal(t, 1, code)
	require.Regexp(t, `database\s+FAILED: cannot connect to the database at 127.0.0.1:1`, stdout)
	require.Contains(t, errOut, "wharf: database: cannot connect to the database at 127.0.0.1:1")
	require.NotContains(t, stdout+errOut, "PGSECRET")

	m := newSchema(t)
	_, err := m.pool.Exec(context.Background(), "DELETE FROM "+m.schema+".schema_migrations WHERE version = (SELECT max(version) FROM "+m.schema+".schema_migrations)")
	require.NoError(t, err)
	code, _, errOut = run(m.cmd("config", "validate", "--sink", "stdout:")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "run `wharf migrate up`")
}

func TestVersionLine(t *testing.T) {
	t.Parallel()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/wharfhq/wharf", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-22T20:03:44Z"}, {Key: "vcs.modified", Value: "true"}}}
	require.Equal(t, "wharf v1.2.3 (revision 0123456789ab 2026-11-22T20:03:44Z (modified), go1.99 "+platform+", schema version 9)", versionLine(bi, true))
	// go build in a checkout stamps a pseudo-version: a development build.
	bi.Main.Version = "v0.0.0-20261122200344-0123456789ab"
	require.Equal(t, "wharf v0.0.0-20261122200344-0123456789ab (development build, revision 0123456789ab 2026-11-22T20:03:44Z (modified), go1.99 "+platform+", schema version 9)", versionLine(bi, true))
	bi.Main.Version = "v0.1.1-0.20261122200344-0123456789ab+dirty"
	require.Contains(t, versionLine(bi, true), "(development build, revision 0123456789ab")
	require.Equal(t, "wharf (devel) (development build, "+runtime.Version()+" "+platform+", schema version 9)", versionLine(nil, false))
	bi.Main.Version = "(devel)"
	bi.Settings = nil
	require.Equal(t, "wharf (devel) (development build, go1.99 "+platform+", schema version 9)", versionLine(bi, true))
	for _, v := range []string{"0.1.0", "v0.1.0", "v1.2.3-rc.1"} {
		require.Truef(t, isRelease(v), "%s is a release version", v)
	}
	for _, v := range []string{"(devel)", "", "v0.0.0-20261122200344-0123456789ab", "v0.1.1-0.20261122200344-0123456789ab", "v0.1.0+dirty"} {
		require.Falsef(t, isRelease(v), "%s is no release version", v)
	}
}
