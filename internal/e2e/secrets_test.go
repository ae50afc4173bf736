package e2e

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"

	"github.com/wharfhq/wharf/internal/testdb"
)

// secret makes a distinctive password: alphanumeric, so it reads the same
// escaped or not, and long enough that finding it can only mean a leak.
func secret(what string) string { return "Zq9" + what + "Pw" + randHex(4) }

// withPassword is the test database's URL with password pw (the server
// trusts local connections, so the password is accepted and ignored).
func withPassword(t *testing.T, pw string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	require.NotNil(t, u.User, "TEST_DATABASE_URL needs a user name")
	u.User = url.UserPassword(u.User.Username(), pw)
	return u.String()
}

// No line wharf writes, on stdout or stderr, in text or JSON logs at debug
// level, success or failure, holds a password from a database or sink URL:
// reachable and unreachable hosts, refused credentials, bad options,
// unknown schemes, passwords in the environment and in a config file, for
// relay --drain, status, config validate, dead list, outbox list, outbox
// show and migrate status.
func TestNoPasswordInOutput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := b.client.Enqueue(t.Context(), wharf.Message{Topic: "secrets.test", Key: "k", Payload: []byte(`{"n":1}`)})
	require.NoError(t, err)

	dbPw, unreachPw, dsnPw, envPw, filePw := secret("Db"), secret("DbDown"), secret("Dsn"), secret("Env"), secret("File")
	goodDB := withPassword(t, dbPw)
	downDB := "postgres://postgres:" + unreachPw + "@127.0.0.1:1/test?connect_timeout=2"
	noHostDB := "postgres://postgres:" + unreachPw + "@wharf-no-such-host.invalid:5432/test?connect_timeout=2"
	dsnDB := "host=127.0.0.1 port=1 user=postgres password=" + dsnPw + " dbname=test connect_timeout=2"
	badOptDB := withPassword(t, dbPw) + "&bogus_option=1"
	if !strings.Contains(goodDB, "?") {
		badOptDB = withPassword(t, dbPw) + "?bogus_option=1"
	}

	kafkaPw, natsPw, amqpPw, redisPw, hookPw, hookToken, hookCode, routePw, filesinkPw := secret("Kafka"), secret("Nats"), secret("Amqp"), secret("Redis"), secret("Hook"), secret("HookPath"), secret("HookCode"), secret("Route"), secret("FileSink")
	secrets := []string{dbPw, unreachPw, dsnPw, envPw, filePw, kafkaPw, natsPw, amqpPw, redisPw, hookPw, hookToken, hookCode, routePw, filesinkPw}

	sinks := []string{
		"kafka://u:" + kafkaPw + "@127.0.0.1:9092",                     // the kafka sink takes no password
		"nats://u:" + natsPw + "@127.0.0.1:1",                          // unreachable
		"nats://u:" + natsPw + "@127.0.0.1:4222?bogus=1",               // bad option
		"nats://u:" + natsPw + "@127.0.0.1:4222?ack_timeout=-1",        // bad value
		"amqp://guest:" + amqpPw + "@127.0.0.1:5672/",                  // reachable, wrong password
		"amqp://guest:" + amqpPw + "@127.0.0.1:1/?dial_timeout=2s",     // unreachable
		"amqps://guest:" + amqpPw + "@127.0.0.1:5672/?dial_timeout=2s", // TLS to a plain port
		"redis://:" + redisPw + "@127.0.0.1:6379",                      // reachable, no password configured
		"redis://default:" + redisPw + "@127.0.0.1:1?timeout=2s",       // unreachable
		"redis://:" + redisPw + "@127.0.0.1:6379?bogus=1",
		"https://u:" + hookPw + "@127.0.0.1:1/services/T000/" + hookToken + "?code=" + hookCode, // private
		"https://u:" + hookPw + "@127.0.0.1:1/services/T000/" + hookToken + "?code=" + hookCode + "&wharf_allow_private=true&wharf_timeout=2s", // unreachable
		"http://u:" + hookPw + "@127.0.0.1:1/x?wharf_bogus=" + hookCode,
		"file://u:" + filesinkPw + "@host/x.jsonl",
		"bogus://u:" + filesinkPw + "@host/",
	}

	type run struct {
		env  []string
		args []string
	}
	var runs []run
	add := func(env []string, args ...string) { runs = append(runs, run{env, args}) }
	schema := []string{"--schema", b.schema}
	for _, format := range []string{"text", "json"} {
		logs := []string{"--log-level", "debug", "--log-format", format}
		for _, db := range []string{goodDB, downDB, noHostDB, dsnDB, badOptDB} {
			dbArgs := append(append([]string{"--database-url", db}, schema...), logs...)
			add(nil, append([]string{"status"}, dbArgs...)...)
			add(nil, append([]string{"dead", "list"}, dbArgs...)...)
			add(nil, append([]string{"outbox", "list"}, dbArgs...)...)
			add(nil, append([]string{"migrate", "status"}, dbArgs...)...)
			add(nil, append([]string{"config", "validate", "--sink", "stdout:"}, dbArgs...)...)
		}
		dbArgs := append(append([]string{"--database-url", goodDB}, schema...), logs...)
		add(nil, append([]string{"outbox", "show", ids[0]}, dbArgs...)...)
		for _, s := range sinks {
			add(nil, append([]string{"relay", "--drain", "--stop-timeout", "2s", "--sink", s}, dbArgs...)...)
			add(nil, append([]string{"config", "validate", "--sink", s}, dbArgs...)...)
			add(nil, append([]string{"relay", "--drain", "--stop-timeout", "2s", "--sink", "null:", "--route", "orders.*=" + s}, dbArgs...)...)
		}
		add(nil, append([]string{"relay", "--drain", "--sink", "stdout:", "--route", "x.*=amqp://guest:" + routePw + "@127.0.0.1:1/", "--route", "bad..pattern=redis://:" + routePw + "@h"}, dbArgs...)...)
		// From the environment and from a config file.
		env := append(testdb.CleanEnv(), "WHARF_DATABASE_URL=postgres://postgres:"+envPw+"@127.0.0.1:1/test?connect_timeout=2", "WHARF_SINK=nats://u:"+envPw+"@127.0.0.1:1")
		add(env, append([]string{"relay", "--drain", "--schema", b.schema}, logs...)...)
		add(env, append([]string{"status", "--schema", b.schema}, logs...)...)
		add(append(testdb.CleanEnv(), "DATABASE_URL="+withPassword(t, envPw)), append([]string{"relay", "--drain", "--sink", "stdout:", "--schema", b.schema}, logs...)...)
		cfg := filepath.Join(t.TempDir(), "wharf.yaml")
		require.NoError(t, os.WriteFile(cfg, []byte("database_url: "+withPassword(t, filePw)+"\nsink: redis://:"+filePw+"@127.0.0.1:6379\nroutes:\n  - {topic: \"a.*\", sink: \"amqp://guest:"+filePw+"@127.0.0.1:1/\"}\n"), 0o600))
		add(nil, append([]string{"config", "validate", "--config", cfg, "--schema", b.schema}, logs...)...)
		add(nil, append([]string{"relay", "--drain", "--config", cfg, "--schema", b.schema}, logs...)...)
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		require.NoError(t, os.WriteFile(bad, []byte("database_url: "+withPassword(t, filePw)+"\nsink: [redis://:"+filePw+"@h]\n"), 0o600))
		add(nil, append([]string{"status", "--config", bad}, logs...)...)
	}

	delivered := false
	for _, r := range runs {
		res := runCLI(t, r.env, 90*time.Second, r.args...)
		require.Falsef(t, res.timedOut, "wharf %q timed out", r.args)
		for _, s := range secrets {
			if strings.Contains(res.stdout, s) || strings.Contains(res.stderr, s) {
				t.Errorf("wharf %q (exit %d) shows a password:\nstdout: %s\nstderr: %s", r.args, res.code, res.stdout, res.stderr)
				break
			}
		}
		delivered = delivered || strings.Contains(res.stdout, ids[0])
	}
	require.True(t, delivered, "no run delivered the test message, so the successful path went unchecked")
	t.Logf("%d wharf runs checked for %d passwords", len(runs), len(secrets))
}

// A sink URL typed without its scheme, as "guest:PASSWORD@rabbit:5672"
// (amqp:// forgotten), parses as the scheme "guest" and an opaque rest, and
// the unknown-scheme error, the route error and config validate's settings
// table must not echo its password (internal/sinkurl redact and
// internal/cli redactURL hide it: everything from the first ':' to the last
// '@').
func TestNoPasswordInSchemelessSinkURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pw := secret("Schemeless")
	db := []string{"--database-url", databaseURL, "--schema", b.schema}
	for _, args := range [][]string{
		append([]string{"relay", "--drain", "--sink", "guest:" + pw + "@127.0.0.1:5672"}, db...),
		append([]string{"config", "validate", "--sink", "guest:" + pw + "@127.0.0.1:5672"}, db...),
		append([]string{"relay", "--drain", "--sink", "null:", "--route", "orders.*=guest:" + pw + "@127.0.0.1:5672"}, db...),
	} {
		res := runCLI(t, nil, time.Minute, args...)
		if strings.Contains(res.stdout+res.stderr, pw) {
			t.Errorf("wharf %q (exit %d) shows the password:\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
		}
	}
}
