package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// rolePair returns fresh role names, dropped when the test ends (roles
// belong to the cluster, not to the test's schema).
func rolePair(t *testing.T, admin *pgxpool.Pool) (producer, relay string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := hex.EncodeToString(b[:])
	producer, relay = "cp_"+s, "cr_"+s
	t.Cleanup(func() {
		for _, r := range []string{producer, relay, "f" + producer, "f" + relay} {
			_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+r)
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	return producer, relay
}

// flowPair returns fresh flow runner and reader role names, dropped when the
// test ends.
func flowPair(t *testing.T, admin *pgxpool.Pool) (runner, reader string) {
	t.Helper()
	p, r := rolePair(t, admin)
	return "f" + p, "f" + r
}

// urlAs is the test database's URL with another user and password.
func urlAs(t *testing.T, user, password string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cc := cfg.ConnConfig
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: cc.Host + ":" + strconv.Itoa(int(cc.Port)), Path: "/" + cc.Database}
	if cc.TLSConfig == nil {
		u.RawQuery = "sslmode=disable"
	}
	return u.String()
}

// `wharf migrate roles --create` makes roles under which a producer enqueues
// and `wharf relay --drain` delivers the batch to a file, and neither can do
// the other's work; the password is never printed.
func TestMigrateRolesCreate(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	producer, relay := rolePair(t, b.pool)
	runner, reader := flowPair(t, b.pool)
	const pw = "Rel4yPassw0rdXyz"
	code, out, errOut := run(b.cmd("migrate", "roles", "--create", "--producer", producer, "--relay", relay, "--flow-runner", runner,
		"--flow-reader", reader, "--relay-password", pw, "--producer-password", pw+"p", "--flow-reader-password", pw+"r")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "producer role "+producer+": grants on schema "+b.schema+" set (LOGIN")
	require.Contains(t, out, "relay role "+relay+": grants on schema "+b.schema+" set (LOGIN")
	require.Contains(t, out, "flow runner role "+runner+": grants on schema "+b.schema+" set (NOLOGIN")
	require.Contains(t, out, "flow reader role "+reader+": grants on schema "+b.schema+" set (LOGIN")
	require.NotContains(t, out+errOut, pw)

	// The producer enqueues through its own connection.
	pp, err := pgxpool.New(ctx, urlAs(t, producer, pw+"p"))
	require.NoError(t, err)
	defer pp.Close()
	pc, err := wharf.NewClient(pp, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	var msgs []wharf.Message
	for i := range 50 {
		msgs = append(msgs, wharf.Message{Topic: "orders", Key: strconv.Itoa(i % 5), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	ids, err := pc.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	_, err = pp.Exec(ctx, "SELECT payload FROM "+b.schema+".outbox")
	require.ErrorContains(t, err, "permission denied")

	// The relay delivers them under the relay role.
	file := filepath.Join(t.TempDir(), "out.jsonl")
	relayURL := urlAs(t, relay, pw)
	code, _, errOut = run("relay", "--drain", "--sink", "file://"+file, "--schema", b.schema, "--database-url", relayURL, "--log-level", "debug")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, errOut, pw)
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m struct{ ID string }
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		seen[m.ID] = true
	}
	for _, id := range ids {
		require.True(t, seen[id], "message %s delivered", id)
	}
	require.Equal(t, 0, b.count(t, "outbox"))

	// The relay role cannot enqueue or change the schema; errors stay one
	// line and hide the password.
	rp, err := pgxpool.New(ctx, relayURL)
	require.NoError(t, err)
	defer rp.Close()
	rc, err := wharf.NewClient(rp, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	_, err = rc.Enqueue(ctx, wharf.Message{Topic: "x", Payload: []byte(`1`)})
	require.ErrorContains(t, err, "permission denied")
	code, _, errOut = run("notify", "on", "--schema", b.schema, "--database-url", relayURL)
	require.NotEqual(t, 0, code)
	requireOneLineError(t, errOut, "")
	require.NotContains(t, errOut, pw)

	// A second run keeps the roles and their rights.
	code, _, errOut = run(b.cmd("migrate", "roles", "--create", "--producer", producer, "--relay", relay, "--flow-runner", runner, "--flow-reader", reader)...)
	require.Equal(t, 0, code, errOut)
	_, err = pc.Enqueue(ctx, wharf.Message{Topic: "orders", Payload: []byte(`1`)})
	require.NoError(t, err)

	// The producer starts a flow from SQL and `wharf flow signal`s it; the
	// flow reader lists and shows it, and cannot cancel it.
	var id int64
	require.NoError(t, pp.QueryRow(ctx, "SELECT "+b.schema+".start_flow('checkout', '{}', 'o-1', 'reserve')").Scan(&id))
	producerURL := urlAs(t, producer, pw+"p")
	code, _, errOut = run("flow", "signal", "--flow", "checkout", "--key", "o-1", "--name", "paid", "--schema", b.schema, "--database-url", producerURL)
	require.Equal(t, 0, code, errOut)
	readerURL := urlAs(t, reader, pw+"r")
	code, out, errOut = run("flow", "list", "--schema", b.schema, "--database-url", readerURL)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^`+strconv.FormatInt(id, 10)+`\s+checkout\s+o-1\s+ready\s+reserve\s`, out)
	code, out, errOut = run("flow", "show", strconv.FormatInt(id, 10), "--json", "--schema", b.schema, "--database-url", readerURL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"name":"paid"`)
	code, _, errOut = run("flow", "cancel", strconv.FormatInt(id, 10), "--schema", b.schema, "--database-url", readerURL)
	require.NotEqual(t, 0, code)
	requireOneLineError(t, errOut, "permission denied")
	require.Equal(t, "ready", b.flowStatus(t, id))
}

// flowStatus is a flow instance's status, read as the schema owner.
func (b *schemaBundle) flowStatus(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT status FROM "+b.schema+".flow_instances WHERE id = $1", id).Scan(&s))
	return s
}

// The printed script hides the password behind a psql variable and, run
// with psql, creates working roles.
func TestMigrateRolesPrint(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	producer, relay := rolePair(t, b.pool)
	runner, reader := flowPair(t, b.pool)
	const pw = "Pr0ducerSecretQq"
	code, script, errOut := run("migrate", "roles", "--schema", b.schema, "--producer", producer, "--relay", relay,
		"--flow-runner", runner, "--flow-reader", reader, "--producer-password", pw)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, script, pw)
	require.Contains(t, script, "GRANT INSERT (topic, key, payload, headers, deliver_at, dedup_key) ON "+b.schema+".outbox TO "+producer)
	require.Contains(t, script, "CREATE ROLE "+relay+" NOLOGIN")

	psql, err := exec.LookPath("psql")
	require.NoError(t, err, "psql is needed to run the printed script")
	cmd := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", producer+"_password="+pw, "-d", databaseURL, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	outB, err := cmd.CombinedOutput()
	require.NoError(t, err, string(outB))

	pp, err := pgxpool.New(context.Background(), urlAs(t, producer, pw))
	require.NoError(t, err)
	defer pp.Close()
	c, err := wharf.NewClient(pp, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)
	_, err = c.Enqueue(context.Background(), wharf.Message{Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, "outbox"))
}

func TestMigrateRolesRefusals(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--producer", "same", "--relay", "same"},
		{"--flow-runner", "wharf_producer"},
		{"--flow-reader", "Bad-Name"},
		{"--relay", "Bad-Name"},
		{"--producer", "pg_read_all_data"},
		{"--create", "--producer", "x;y"},
	} {
		code, out, errOut := run(append([]string{"migrate", "roles"}, args...)...)
		require.Equal(t, 2, code, "%v: %s%s", args, out, errOut)
		requireOneLineError(t, errOut, "role")
		require.Empty(t, out)
	}
}
