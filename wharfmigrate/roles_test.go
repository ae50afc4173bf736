package wharfmigrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// roleNames returns fresh role names and drops the roles when the test ends
// (roles belong to the cluster, not to the test's schema).
func roleNames(t *testing.T, admin *pgxpool.Pool) (producer, relay string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	producer, relay = "wp_"+suffix, "wr_"+suffix
	t.Cleanup(func() {
		ctx := context.Background()
		for _, r := range []string{producer, relay} {
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+r)
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+r)
		}
	})
	return producer, relay
}

// poolAs connects to the test database as role.
func poolAs(t *testing.T, role, password string) *pgxpool.Pool {
	t.Helper()
	return poolAtAs(t, databaseURL, role, password)
}

// poolAtAs connects to url as role.
func poolAtAs(t *testing.T, url, role, password string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = password
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// requireDenied checks that sql fails for lack of privilege (42501).
func requireDenied(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql)
	var pe *pgconn.PgError
	require.Truef(t, errors.As(err, &pe) && pe.Code == "42501", "%s: %v, want permission denied (42501)", sql, err)
}

func migrated(t *testing.T) (*pgxpool.Pool, string, *wharfmigrate.Migrator) {
	t.Helper()
	admin, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(context.Background(), admin)
	require.NoError(t, err)
	return admin, schema, m
}

// With the roles created, a producer connection can enqueue (Go client with
// and without dedup keys, and the SQL functions) but read no message and
// change nothing else; a relay connection delivers a batch end to end,
// dead-letters a failing message, and can neither enqueue nor change the
// schema.
func TestRolesEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema, m := migrated(t)
	producer, relay := roleNames(t, admin)
	runner, reader := flowRoleNames(t, admin)
	opts := wharfmigrate.RoleOptions{Producer: producer, Relay: relay, FlowRunner: runner, FlowReader: reader,
		ProducerPassword: "pw-" + producer, RelayPassword: "pw-" + relay}
	require.NoError(t, m.CreateRoles(ctx, admin, opts))

	// Producer.
	pp := poolAs(t, producer, opts.ProducerPassword)
	pc, err := wharf.NewClient(pp, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	var msgs []wharf.Message
	for i := range 20 {
		msgs = append(msgs, wharf.Message{Topic: "orders", Key: fmt.Sprint(i % 3), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: map[string]string{"h": "v"}})
	}
	msgs = append(msgs, wharf.Message{Topic: "poison", Payload: []byte(`{}`)})
	ids, err := pc.Enqueue(ctx, msgs...)
	require.NoError(t, err, "the producer enqueues")
	require.Len(t, ids, len(msgs))
	first, err := pc.Enqueue(ctx, wharf.Message{Topic: "orders", Key: "d", Payload: []byte(`1`), DedupKey: "once"})
	require.NoError(t, err, "the producer enqueues with a dedup key")
	again, err := pc.Enqueue(ctx, wharf.Message{Topic: "orders", Key: "d", Payload: []byte(`2`), DedupKey: "once"})
	require.NoError(t, err, "the producer's dedup lookup works")
	require.Equal(t, first, again)
	var sqlID string
	require.NoError(t, pp.QueryRow(ctx, `SELECT `+schema+`.enqueue('orders', 'sql', '{"via":"sql"}'::jsonb)::text`).Scan(&sqlID))
	require.NoError(t, pp.QueryRow(ctx, `SELECT `+schema+`.enqueue_bytes('orders', 'sql', '\x00ff'::bytea, '{}', NULL, 'dk')::text`).Scan(&sqlID))
	for _, sql := range []string{
		`SELECT payload FROM S.outbox`, `SELECT * FROM S.outbox`, `SELECT topic, key, headers FROM S.outbox`,
		`DELETE FROM S.outbox`, `UPDATE S.outbox SET topic = 'x'`, `TRUNCATE S.outbox`,
		`SELECT * FROM S.dead_letters`, `SELECT * FROM S.retries`, `UPDATE S.lanes SET owner = 'me'`,
		`INSERT INTO S.relays (relay_id) VALUES ('p')`, `DELETE FROM S.schema_migrations`,
		`CREATE TABLE S.x (i int)`, `DROP TABLE S.lanes`, `ALTER TABLE S.outbox DISABLE TRIGGER outbox_notify`,
	} {
		requireDenied(t, pp, strings.ReplaceAll(sql, "S.", schema+"."))
	}

	// Relay.
	rp := poolAs(t, relay, opts.RelayPassword)
	got := drainAs(t, rp, schema)
	for _, id := range ids[:20] {
		require.Equal(t, 1, got[id], "message %s delivered once", id)
	}
	require.Equal(t, 1, got[first[0]])
	require.Len(t, got, 23) // 20 + the deduplicated one + the two SQL ones
	var replication bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT rolreplication FROM pg_roles WHERE rolname = $1`, relay).Scan(&replication))
	require.False(t, replication, "a table outbox's relay role needs no REPLICATION")
	var left, dead int
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.outbox), (SELECT count(*) FROM `+schema+`.dead_letters)`).Scan(&left, &dead))
	require.Equal(t, 0, left, "delivered rows are deleted")
	require.Equal(t, 1, dead, "the failing message is dead-lettered")
	for _, sql := range []string{
		`INSERT INTO S.outbox (topic, payload) VALUES ('x', '')`, `SELECT S.enqueue('x', NULL, '{}'::jsonb)`,
		`UPDATE S.outbox SET topic = 'x'`, `TRUNCATE S.outbox`, `DELETE FROM S.dead_letters`,
		`INSERT INTO S.schema_migrations SELECT * FROM S.schema_migrations`, `DELETE FROM S.lanes`, `INSERT INTO S.lanes (lane) VALUES (99)`,
		`CREATE TABLE S.x (i int)`, `DROP TABLE S.retries`, `ALTER TABLE S.outbox ENABLE TRIGGER outbox_notify`,
	} {
		requireDenied(t, rp, strings.ReplaceAll(sql, "S.", schema+"."))
	}
}

// On an outbox in WAL mode the roles get what that mode needs as well: the
// producer may emit (Go client and SQL enqueue) and still read nothing, the
// relay gets REPLICATION and streams, delivers and dead-letters end to end.
func TestRolesWALMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema := logical(t)
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, admin)
	require.NoError(t, err)
	require.NoError(t, m.SetWALMode(ctx, admin))
	producer, relay := roleNames(t, admin)
	runner, reader := flowRoleNames(t, admin)
	opts := wharfmigrate.RoleOptions{Producer: producer, Relay: relay, FlowRunner: runner, FlowReader: reader,
		ProducerPassword: "pw-" + producer, RelayPassword: "pw-" + relay}
	require.NoError(t, m.CreateRoles(ctx, admin, opts))

	pp := poolAtAs(t, url, producer, opts.ProducerPassword)
	pc, err := wharf.NewClient(pp, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	var msgs []wharf.Message
	for i := range 20 {
		msgs = append(msgs, wharf.Message{Topic: "orders", Key: fmt.Sprint(i % 3), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	msgs = append(msgs, wharf.Message{Topic: "poison", Payload: []byte(`{}`)})
	ids, err := pc.Enqueue(ctx, msgs...)
	require.NoError(t, err, "the producer emits")
	var sqlID string
	require.NoError(t, pp.QueryRow(ctx, `SELECT `+schema+`.enqueue('orders', 'sql', '{"via":"sql"}'::jsonb)::text`).Scan(&sqlID),
		"the producer enqueues from SQL")
	for _, sql := range []string{`SELECT * FROM S.dead_letters`, `SELECT * FROM S.retries`, `UPDATE S.lanes SET owner = 'me'`,
		// Only through enqueue_wal: no message of its own making, no row
		// in the outbox table, even with the relay's spill setting.
		`SELECT pg_logical_emit_message(true, 'S', '\x01'::bytea)`, `SELECT pg_logical_emit_message(true, 'S', 'x'::text)`,
		`INSERT INTO S.outbox (topic, payload) VALUES ('x', '')`, `SELECT id FROM S.outbox`} {
		requireDenied(t, pp, strings.ReplaceAll(strings.ReplaceAll(sql, "S.", schema+"."), "'S'", "'"+schema+"'"))
	}
	tx, err := pp.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL wharf.spill = 'on'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+schema+".outbox (topic, payload) VALUES ('x', '')")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "42501", "the producer inserted into a WAL outbox's table: %v", err)
	require.NoError(t, tx.Rollback(ctx))
	// Another role with the schema's USAGE (here the relay's) may not.
	requireDenied(t, poolAtAs(t, url, relay, opts.RelayPassword), `SELECT `+schema+`.enqueue('orders', 'k', '{}'::jsonb)`)
	// The flow runner may: a flow outcome's messages are enqueued with it.
	// The flow reader may not.
	_, err = admin.Exec(ctx, "ALTER ROLE "+runner+" LOGIN PASSWORD 'pw-"+runner+"'")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER ROLE "+reader+" LOGIN PASSWORD 'pw-"+reader+"'")
	require.NoError(t, err)
	fc, err := wharf.NewClient(poolAtAs(t, url, runner, "pw-"+runner), &wharf.Config{Schema: schema})
	require.NoError(t, err)
	runnerIDs, err := fc.Enqueue(ctx, wharf.Message{Topic: "orders", Key: "flow", Payload: []byte(`{"from":"a flow"}`)})
	require.NoError(t, err, "the flow runner emits")
	requireDenied(t, poolAtAs(t, url, reader, "pw-"+reader), `SELECT `+schema+`.enqueue('orders', 'k', '{}'::jsonb)`)

	var replication bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT rolreplication FROM pg_roles WHERE rolname = $1`, relay).Scan(&replication))
	require.True(t, replication, "the relay role streams the slot: it needs REPLICATION")
	rp := poolAtAs(t, url, relay, opts.RelayPassword)
	got := drainAs(t, rp, schema)
	for _, id := range append(append(ids[:20], sqlID), runnerIDs...) {
		require.Equal(t, 1, got[id], "message %s delivered once", id)
	}
	var dead int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.dead_letters`).Scan(&dead))
	require.Equal(t, 1, dead, "the failing message is dead-lettered")
}

// A schema owner who is not a superuser cannot give the relay role
// REPLICATION: CreateRoles on a WAL outbox fails with one line that says
// so and how to go on, and grants nothing.
func TestRolesWALModeNeedsASuperuserForReplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema := logical(t)
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	owner, _ := roleNames(t, admin)
	producer, relay := roleNames(t, admin)
	_, err = admin.Exec(ctx, "CREATE ROLE "+owner+" LOGIN CREATEROLE REPLICATION PASSWORD 'pw'")
	require.NoError(t, err)
	var db string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	_, err = admin.Exec(ctx, "GRANT CREATE ON DATABASE "+db+" TO "+owner)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "REVOKE CREATE ON DATABASE "+db+" FROM "+owner) })
	op := poolAtAs(t, url, owner, "pw")
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, op)
	require.NoError(t, err)
	if err := m.SetWALMode(ctx, op); err != nil {
		// The owner may not revoke pg_logical_emit_message from PUBLIC, or
		// call it: a superuser runs what the refusal names.
		_, fix, ok := strings.Cut(err.Error(), "have a superuser run ")
		require.True(t, ok, err)
		fix, _, _ = strings.Cut(fix, "; then run this again")
		// Other tests' migrators revoke in this database meanwhile; the
		// advisory lock they take keeps the ACL updates apart.
		_, err = admin.Exec(ctx, "BEGIN; SELECT pg_advisory_xact_lock(hashtext('wharfmigrate:pg_logical_emit_message')); "+fix+"; COMMIT")
		require.NoError(t, err)
	}
	require.NoError(t, m.SetWALMode(ctx, op))

	runner, reader := flowRoleNames(t, admin)
	err = m.CreateRoles(ctx, op, wharfmigrate.RoleOptions{Producer: producer, Relay: relay, FlowRunner: runner, FlowReader: reader})
	require.ErrorContains(t, err, "the relay role "+relay+" needs the REPLICATION attribute to stream its slot, and only a superuser can give it")
	require.NotContains(t, err.Error(), "\n", "one line")
	t.Log(err)
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2, $3, $4)", producer, relay, runner, reader).Scan(&n))
	require.Zero(t, n, "a failed CreateRoles leaves no role behind")
}

// drainAs runs a relay on pool (a relay role's connection) until schema's
// outbox is drained, failing the messages of topic poison (two attempts,
// then a dead letter), and returns how often each message was delivered.
func drainAs(t *testing.T, pool *pgxpool.Pool, schema string) map[string]int {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	rc, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Handler: func(_ context.Context, msg *wharf.Message) error {
			if msg.Topic == "poison" {
				return errors.New("cannot handle poison")
			}
			mu.Lock()
			got[msg.ID]++
			mu.Unlock()
			return nil
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, rc.Drain(ctx), "the relay role runs a relay to the end")
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(got)
}

// privileges lists what role may do on every table, column group and
// function of the schema, to compare two ways of granting.
func privileges(t *testing.T, pool *pgxpool.Pool, schema, role string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT c.relname || ':' || p.priv || '=' || has_table_privilege($2, c.oid, p.priv)::text
FROM pg_class c CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) AS p(priv)
WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r'
UNION ALL
SELECT 'outbox.' || a.attname || ':' || p.priv || '=' || has_column_privilege($2, ($1 || '.outbox')::regclass, a.attname, p.priv)::text
FROM pg_attribute a CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE']) AS p(priv)
WHERE a.attrelid = ($1 || '.outbox')::regclass AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'schema:' || p.priv || '=' || has_schema_privilege($2, $1, p.priv)::text FROM unnest(ARRAY['USAGE','CREATE']) AS p(priv)
UNION ALL
SELECT 'function:' || f.proname || ':EXECUTE=' || has_function_privilege($2, f.oid, 'EXECUTE')::text
FROM pg_proc f WHERE f.pronamespace = $1::regnamespace
ORDER BY 1`, schema, role)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return strings.Join(out, "\n")
}

// The printed script grants exactly what CreateRoles grants, holds no
// password, and a second CreateRoles takes back grants added by hand.
func TestRolesSQLMatchesCreateRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema, m := migrated(t)
	p1, r1 := roleNames(t, admin)
	p2, r2 := roleNames(t, admin)
	fr1, fd1 := flowRoleNames(t, admin)
	fr2, fd2 := flowRoleNames(t, admin)
	o1 := wharfmigrate.RoleOptions{Producer: p1, Relay: r1, FlowRunner: fr1, FlowReader: fd1}
	require.NoError(t, m.CreateRoles(ctx, admin, o1))

	script, err := m.RolesSQL(wharfmigrate.RoleOptions{Producer: p2, Relay: r2, FlowRunner: fr2, FlowReader: fd2, RelayPassword: "S3cretRelayPw"})
	require.NoError(t, err)
	require.NotContains(t, script, "S3cretRelayPw")
	require.Contains(t, script, "PASSWORD :'"+r2+"_password'")
	// Run it as psql would, with the variable set.
	_, err = admin.Exec(ctx, strings.ReplaceAll(script, ":'"+r2+"_password'", "'S3cretRelayPw'"))
	require.NoError(t, err)

	require.Equal(t, privileges(t, admin, schema, p1), privileges(t, admin, schema, p2))
	require.Equal(t, privileges(t, admin, schema, r1), privileges(t, admin, schema, r2))
	require.Equal(t, privileges(t, admin, schema, fr1), privileges(t, admin, schema, fr2))
	require.Equal(t, privileges(t, admin, schema, fd1), privileges(t, admin, schema, fd2))
	var login1, login2 bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT rolcanlogin FROM pg_roles WHERE rolname = $1), (SELECT rolcanlogin FROM pg_roles WHERE rolname = $2)`, r1, r2).Scan(&login1, &login2))
	require.False(t, login1, "no password: NOLOGIN")
	require.True(t, login2, "a password: LOGIN")

	// The producer sees id, nonce and dedup_key, nothing else of the outbox.
	priv := privileges(t, admin, schema, p1)
	for _, want := range []string{"outbox.id:SELECT=true", "outbox.nonce:SELECT=true", "outbox.dedup_key:SELECT=true", "outbox.payload:SELECT=false",
		"outbox.topic:SELECT=false", "outbox.payload:INSERT=true", "outbox.id:INSERT=false", "outbox:DELETE=false", "schema:CREATE=false"} {
		require.Contains(t, priv, want)
	}
	// It starts and signals flows through their functions only.
	for _, want := range []string{"function:start_flows:EXECUTE=true", "function:signal:EXECUTE=true", "flow_instances:SELECT=false",
		"flow_instances:UPDATE=false", "flow_signals:INSERT=false"} {
		require.Contains(t, priv, want)
	}
	// The reader reads the flow tables and starts nothing.
	priv = privileges(t, admin, schema, fd1)
	for _, want := range []string{"flow_instances:SELECT=true", "flow_steps:SELECT=true", "flow_instances:UPDATE=false",
		"function:start_flows:EXECUTE=false", "function:signal_flows:EXECUTE=false", "outbox:SELECT=false"} {
		require.Contains(t, priv, want)
	}

	// Broader grants added by hand are taken back by a second run.
	_, err = admin.Exec(ctx, fmt.Sprintf("GRANT ALL ON %[1]s.outbox, %[1]s.dead_letters TO %[2]s", schema, p1))
	require.NoError(t, err)
	require.NoError(t, m.CreateRoles(ctx, admin, o1))
	require.Equal(t, privileges(t, admin, schema, p2), privileges(t, admin, schema, p1))
}

func TestRolesRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := wharfmigrate.New("wharf")
	require.NoError(t, err)
	for _, o := range []wharfmigrate.RoleOptions{
		{Producer: "same", Relay: "same"}, {Producer: "Bad-Name"}, {Relay: "pg_monitor"}, {Producer: "public"},
		{Relay: strings.Repeat("x", 64)}, {Producer: "a;DROP TABLE x"}, {FlowRunner: "wharf_relay"}, {FlowReader: "x-y"},
		{FlowRunner: "r", FlowReader: "r"},
	} {
		_, err := m.RolesSQL(o)
		require.Error(t, err, "%+v", o)
		require.NotContains(t, err.Error(), "\n")
		require.Regexp(t, regexp.MustCompile(`give them different names|invalid (producer|relay|flow runner|flow reader) role name`), err.Error())
	}
	def, err := m.RolesSQL(wharfmigrate.RoleOptions{})
	require.NoError(t, err)
	require.Contains(t, def, "CREATE ROLE wharf_producer NOLOGIN")
	require.Contains(t, def, "CREATE ROLE wharf_relay NOLOGIN")
	require.Contains(t, def, "CREATE ROLE wharf_flow_runner NOLOGIN")
	require.Contains(t, def, "CREATE ROLE wharf_flow_reader NOLOGIN")
	require.NotContains(t, def, "PASSWORD")

	// A superuser or the owner is refused, and keeps its rights.
	admin, schema, m2 := migrated(t)
	var me string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_user").Scan(&me))
	_, relay := roleNames(t, admin)
	err = m2.CreateRoles(ctx, admin, wharfmigrate.RoleOptions{Producer: me, Relay: relay})
	require.ErrorContains(t, err, "is a superuser or owns the outbox tables")
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))

	// An unmigrated schema is refused with the usual advice.
	_, fresh := setup(t)
	m3, err := wharfmigrate.New(fresh)
	require.NoError(t, err)
	require.ErrorIs(t, m3.CreateRoles(ctx, admin, wharfmigrate.RoleOptions{Relay: relay}), wharfmigrate.ErrNotMigrated)
}
