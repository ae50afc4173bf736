package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A mistyped scheme in the database URL is refused for its scheme, in one
// line, by every command that connects (or hands the URL on), and no echo of
// a database URL hides its user or host: only its password.
func TestDatabaseURLSchemeTypo(t *testing.T) {
	t.Parallel()
	const typo = "postgress://postgres@127.0.0.1/x"
	const want = `--database-url: unknown scheme "postgress": use postgres:// or postgresql:// (or a key=value connection string)`
	for _, args := range [][]string{
		{"status"},
		{"relay", "--sink", "stdout:"},
		{"flow", "list"},
		{"flow", "show", "1"},
		{"migrate", "up"},
		{"migrate", "status"},
		{"migrate", "down"},
		{"outbox", "list"},
		{"dead", "list"},
		{"notify", "on"},
		{"console", "--addr", "127.0.0.1:0"},
		{"config", "validate", "--sink", "stdout:", "--offline"},
		{"demo", "--messages", "10"},
		{"bench", "--mode", "drain", "--messages", "10"},
		{"bench", "--mode", "flow", "--flows", "10"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, _, errOut := run(append([]string{"--database-url", typo}, args...)...)
			require.Equal(t, 2, code, errOut)
			requireOneLineError(t, errOut, want)
			require.NotContains(t, errOut, "xxxx", "the user name is not a password")
			require.NotContains(t, errOut, "keyword/value")
		})
	}
}

// Not parallel: it sets an environment variable.
func TestDatabaseURLSchemeTypoFromTheEnvironment(t *testing.T) {
	t.Setenv("WHARF_DATABASE_URL", "mysql://app:s3cret@db/x")
	code, _, errOut := run("status")
	require.Equal(t, 2, code, errOut)
	requireOneLineError(t, errOut, `--database-url (from environment variable WHARF_DATABASE_URL): unknown scheme "mysql"`)
	require.NotContains(t, errOut, "s3cret")
}

func TestDatabaseURLMistakes(t *testing.T) {
	t.Parallel()
	// A postgres:// URL pgx cannot read: the user and host are shown, the
	// password is not.
	code, _, errOut := run("status", "--database-url", "postgres://alice:s3cret@db.example:badport/x")
	require.Equal(t, 2, code, errOut)
	requireOneLineError(t, errOut, "--database-url is malformed: cannot parse `postgres://alice:xxxxx@db.example:badport/x`: invalid port")
	require.NotContains(t, errOut, "s3cret")

	// Neither a URL nor key=value pairs (the "://" forgotten): not echoed.
	code, _, errOut = run("status", "--database-url", "alice:s3cret@db.example/x")
	require.Equal(t, 2, code, errOut)
	requireOneLineError(t, errOut, "--database-url is neither a URL nor a key=value connection string: use postgres://USER:PASSWORD@HOST:PORT/DATABASE")
	require.NotContains(t, errOut, "s3cret")

	// Key=value connection strings still work, "://" in a value included.
	code, _, errOut = run("status", "--database-url", "host=127.0.0.1 port=1 user=postgres dbname=x application_name=a://b connect_timeout=2")
	require.Equal(t, 1, code, errOut)
	requireOneLineError(t, errOut, "cannot connect to the database at 127.0.0.1:1")

	// postgresql:// is a scheme pgx reads as well.
	code, _, errOut = run("status", "--database-url", "postgresql://postgres@127.0.0.1:1/x?connect_timeout=2")
	require.Equal(t, 1, code, errOut)
	requireOneLineError(t, errOut, "cannot connect to the database at 127.0.0.1:1")
}
