package wharfmigrate

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Default role names of [Migrator.RolesSQL] and [Migrator.CreateRoles].
const (
	DefaultProducerRole   = "wharf_producer"
	DefaultRelayRole      = "wharf_relay"
	DefaultFlowRunnerRole = "wharf_flow_runner"
	DefaultFlowReaderRole = "wharf_flow_reader"
)

// RoleOptions names the least-privilege roles and, optionally, their
// passwords. A role without a password is created NOLOGIN: a group role
// that login roles are granted (GRANT wharf_producer TO app_user).
type RoleOptions struct {
	// Producer may enqueue, start flows and signal them, and nothing else:
	// in table mode, insert into the outbox (the enqueue functions run with
	// the caller's rights) and read back only the id, nonce and dedup key
	// columns, which enqueue returns and its dedup lookup reads; in WAL
	// mode, execute <schema>.enqueue_wal and nothing on the outbox table.
	// Flows it starts and signals only through <schema>.start_flows,
	// start_flow, signal_flows and signal, which run with their owner's
	// rights: it has no right on the flow tables. "" means
	// DefaultProducerRole.
	Producer string
	// FlowRunner may run wharfflow runners: claim steps, write their
	// outcomes (state, history, signals consumed, children, key pauses),
	// renew and release leases, wake awaiting instances, register in
	// flow_runners (signals lease it the steps they resume), delete finished
	// ones after their retention, write rate limits, enqueue the messages
	// outcomes emit (the producer's outbox rights), start and signal flows,
	// and read the schema version. It cannot read or delete outbox
	// messages, lease lanes or touch dead letters. "" means
	// DefaultFlowRunnerRole.
	FlowRunner string
	// FlowReader may read the flow tables (wharf flow list and show,
	// wharfflow.NewMetrics) and the schema version, and change nothing.
	// "" means DefaultFlowReaderRole.
	FlowReader string
	// Relay may do what a running relay does: read and delete outbox rows,
	// lease lanes, register in relays, record retries and dead letters,
	// read the schema version. "" means DefaultRelayRole.
	Relay string
	// ProducerPassword, RelayPassword, FlowRunnerPassword and
	// FlowReaderPassword, when set, make the role LOGIN with that password.
	ProducerPassword   string
	RelayPassword      string
	FlowRunnerPassword string
	FlowReaderPassword string
}

// roleSpec is one role of RoleOptions: its flag name, name, password and
// grants.
type roleSpec struct {
	what, name, password string
	grants               []string
}

// specs lists the roles of validated options in the order they are created.
func (o RoleOptions) specs() []roleSpec {
	return []roleSpec{
		{"producer", o.Producer, o.ProducerPassword, producerGrants},
		{"relay", o.Relay, o.RelayPassword, relayGrants},
		{"flow runner", o.FlowRunner, o.FlowRunnerPassword, flowRunnerGrants},
		{"flow reader", o.FlowReader, o.FlowReaderPassword, flowReaderGrants},
	}
}

var roleRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// validate fills in the defaults and checks the names.
func (o RoleOptions) validate() (RoleOptions, error) {
	if o.Producer == "" {
		o.Producer = DefaultProducerRole
	}
	if o.Relay == "" {
		o.Relay = DefaultRelayRole
	}
	if o.FlowRunner == "" {
		o.FlowRunner = DefaultFlowRunnerRole
	}
	if o.FlowReader == "" {
		o.FlowReader = DefaultFlowReaderRole
	}
	seen := map[string]string{}
	for _, r := range o.specs() {
		if !roleRE.MatchString(r.name) || strings.HasPrefix(r.name, "pg_") || r.name == "public" {
			return o, fmt.Errorf("invalid %s role name %q: use 1-63 lowercase letters, digits and underscores, starting with a letter or underscore, not starting with pg_ and not public", r.what, r.name)
		}
		if other, ok := seen[r.name]; ok {
			return o, fmt.Errorf("the %s and %s roles are both %q: give them different names, so each has only its own rights", other, r.what, r.name)
		}
		seen[r.name] = r.what
	}
	return o, nil
}

// roleGrants are the privileges of each role on the objects of the latest
// schema version, found from the migrations and the queries the client runs
// (enqueue.go, internal/tablestore, internal/walstore): {S} stands for the schema, {R} for
// the role.
var (
	// enqueueGrants: enqueueing into the outbox.
	enqueueGrants = []string{
		`GRANT USAGE ON SCHEMA {S} TO {R}`,
		// In table mode enqueue inserts these columns; the others take
		// their defaults. RETURNING id, nonce[, dedup_key], the ON CONFLICT
		// (dedup_key) arbiter and the dedup lookup read the selected ones,
		// and no others: the producer cannot read topics, keys, payloads or
		// headers. In WAL mode the table holds only what the relay moves
		// there, and a producer gets nothing on it: enqueue_wal is its only
		// way in.
		`DO $wharf$ BEGIN IF to_regprocedure('{S}.enqueue_wal(bytea)') IS NULL THEN
    GRANT INSERT (topic, key, payload, headers, deliver_at, dedup_key) ON {S}.outbox TO {R};
    GRANT SELECT (id, nonce, dedup_key) ON {S}.outbox TO {R};
END IF; END $wharf$`,
		`GRANT EXECUTE ON FUNCTION {S}.enqueue(text, text, jsonb, jsonb, timestamptz, text) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.enqueue_bytes(text, text, bytea, jsonb, timestamptz, text) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.message_id(bigint, bigint) TO {R}`,
		// In WAL mode enqueueing is emitting through enqueue_wal, which only
		// the roles granted it may call (SetWALMode revokes it from PUBLIC).
		`DO $wharf$ BEGIN IF to_regprocedure('{S}.enqueue_wal(bytea)') IS NOT NULL THEN
    GRANT EXECUTE ON FUNCTION {S}.enqueue_wal(bytea) TO {R};
END IF; END $wharf$`,
	}
	// startSignalGrants: starting and signalling flows. These functions run
	// with their owner's rights (migration 8) and only the roles granted
	// them may call them; the caller needs nothing on the flow tables.
	startSignalGrants = []string{
		`GRANT EXECUTE ON FUNCTION {S}.start_flows(jsonb) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.signal_flows(jsonb, boolean) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.signal(text, text, text, jsonb, text, boolean) TO {R}`,
	}
	// flowRunnerGrants: what a wharfflow runner does (wharfflow/runner.go
	// and the functions of migration 7 it calls, which run with its
	// rights), plus the producer's rights: an outcome's messages are
	// enqueued in its transaction, and a step may start or signal flows.
	producerGrants   = slices.Concat(enqueueGrants, startSignalGrants)
	flowRunnerGrants = slices.Concat([]string{
		// The runner checks the schema version before it starts.
		`GRANT SELECT ON {S}.schema_migrations TO {R}`,
		// claim_flow_steps leases rows, complete_flow_steps writes outcomes
		// and inserts children, renew, release and wake_flows move run_at,
		// cleanup_flows deletes finished instances with their children.
		`GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.flow_instances TO {R}`,
		// Signals a step receives are read with the claim and marked
		// consumed by the outcome; cleanup_flows deletes an instance's.
		`GRANT SELECT, UPDATE, DELETE ON {S}.flow_signals TO {R}`,
		// One history row per outcome; cleanup deletes an instance's.
		`GRANT SELECT, INSERT, DELETE ON {S}.flow_steps TO {R}`,
		// Concurrency limits and token buckets (the runner writes
		// Config.ConcurrencyLimits and RateLimits; the claim takes slots
		// and tokens) and pauses (RateLimited outcomes).
		`GRANT SELECT, INSERT, UPDATE ON {S}.flow_keys TO {R}`,
		// The runner writes its flows' steps when it starts (a start from
		// SQL without a step begins at the first).
		`GRANT SELECT, INSERT, UPDATE ON {S}.flow_definitions TO {R}`,
		// Registers and heartbeats while it listens, removes itself when
		// it stops (signals lease awaiting instances to live runners).
		`GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.flow_runners TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.claim_flow_steps(text, text[], integer, interval) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.complete_flow_steps(text, jsonb, interval, text[], integer, bigint[], bigint[], text[], boolean[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_outcomes(jsonb) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_lock_keys(text[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_signals_for(bigint, text[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_key_free(text[], text, text[], integer, interval, bigint[], bigint[], boolean[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.repair_flow_joins(integer) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.next_flow_due(timestamptz) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_leased_steps(text, bigint, bigint[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_unheard_leases(text, bigint) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_notify_leased(bigint[], bigint[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.renew_flow_leases(text, bigint[], bigint[], interval) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.release_flow_leases(text, bigint[], bigint[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.wake_flows(bigint[], boolean) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.flow_resume(bigint[]) TO {R}`,
		`GRANT EXECUTE ON FUNCTION {S}.cleanup_flows(timestamptz, integer) TO {R}`,
	}, enqueueGrants, startSignalGrants)
	// flowReaderGrants: wharf flow list and show, and NewMetrics, read
	// these tables and nothing else.
	flowReaderGrants = []string{
		`GRANT USAGE ON SCHEMA {S} TO {R}`,
		`GRANT SELECT ON {S}.schema_migrations TO {R}`,
		`GRANT SELECT ON {S}.flow_instances, {S}.flow_signals, {S}.flow_steps, {S}.flow_keys, {S}.flow_runners, {S}.flow_definitions TO {R}`,
	}
	relayGrants = []string{
		`GRANT USAGE ON SCHEMA {S} TO {R}`,
		// The relay checks the schema version before it starts.
		`GRANT SELECT ON {S}.schema_migrations TO {R}`,
		// Reads batches; deletes delivered and dead-lettered rows.
		`GRANT SELECT, DELETE ON {S}.outbox TO {R}`,
		// Claims, renews and releases leases (UPDATE; also what FOR SHARE
		// and FOR UPDATE SKIP LOCKED need).
		`GRANT SELECT, UPDATE ON {S}.lanes TO {R}`,
		// Registers, heartbeats, and removes itself and dead relays.
		`GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.relays TO {R}`,
		// Records attempts (upsert) and forgets them on success.
		`GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.retries TO {R}`,
		// Moves failed messages here (upsert); never deletes them.
		`GRANT SELECT, INSERT, UPDATE ON {S}.dead_letters TO {R}`,
		// In WAL mode the relay records how far the stream is settled, and
		// moves messages held long in its memory into the outbox table.
		`DO $wharf$ BEGIN IF to_regclass('{S}.wal_progress') IS NOT NULL THEN
    GRANT SELECT, UPDATE ON {S}.wal_progress TO {R};
    GRANT INSERT ON {S}.outbox TO {R};
END IF; END $wharf$`,
		// In WAL mode the relay streams the outbox's replication slot, which
		// takes the REPLICATION attribute; only a superuser can give it.
		`DO $wharf$ BEGIN
IF to_regprocedure('{S}.enqueue_wal(bytea)') IS NOT NULL AND NOT (SELECT rolreplication FROM pg_roles WHERE rolname = '{R}') THEN
    BEGIN
        ALTER ROLE {R} REPLICATION;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'outbox {S} is in WAL mode: the relay role {R} needs the REPLICATION attribute to stream its slot, and only a superuser can give it: run this as a superuser, or have one give it first (CREATE ROLE {R} REPLICATION, or ALTER ROLE {R} REPLICATION)' USING ERRCODE = '42501';
    END;
END IF; END $wharf$`,
	}
)

// tables are every table of the schema, for the REVOKE that makes a second
// run leave exactly the grants above.
var tables = []string{"outbox", "lanes", "relays", "retries", "dead_letters", "schema_migrations",
	"flow_instances", "flow_signals", "flow_steps", "flow_keys", "flow_runners", "flow_definitions"}

// roleStatements returns the statements that create (if missing) and grant
// one role; password writes the SQL value of its password.
func roleStatements(schema, role, password string, passwordSQL func(string) string, grants []string) []string {
	out := []string{
		// Idempotent: a role that exists keeps its attributes.
		fmt.Sprintf("DO $wharf$ BEGIN CREATE ROLE %s NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $wharf$", role),
	}
	// Revoking from a superuser or the tables' owner would take the
	// owner's rights away and grant nothing: refuse.
	out = append(out, fmt.Sprintf(`DO $wharf$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = '%[1]s' AND (r.rolsuper OR pg_has_role(r.oid, (SELECT relowner FROM pg_class WHERE oid = '%[2]s.outbox'::regclass), 'MEMBER'))) THEN RAISE EXCEPTION 'role %[1]s is a superuser or owns the outbox tables: give the producer, relay and flow roles names of their own' USING ERRCODE = '42501'; END IF; END $wharf$`, role, schema))
	if password != "" {
		out = append(out, fmt.Sprintf("ALTER ROLE %s LOGIN PASSWORD %s", role, passwordSQL(password)))
	}
	for _, t := range tables {
		out = append(out, fmt.Sprintf("REVOKE ALL ON %s.%s FROM %s", schema, t, role))
	}
	// The WAL mode's table exists only in WAL mode.
	out = append(out, fmt.Sprintf("DO $wharf$ BEGIN IF to_regclass('%[1]s.wal_progress') IS NOT NULL THEN REVOKE ALL ON %[1]s.wal_progress FROM %[2]s; END IF; END $wharf$", schema, role))
	out = append(out, fmt.Sprintf("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %s FROM %s", schema, role))
	out = append(out, fmt.Sprintf("REVOKE ALL ON ALL SEQUENCES IN SCHEMA %s FROM %s", schema, role))
	r := strings.NewReplacer("{S}", schema, "{R}", role)
	for _, g := range grants {
		out = append(out, r.Replace(g))
	}
	return out
}

// RolesSQL returns a psql script that creates the producer, relay, flow
// runner and flow reader roles and grants them exactly what they need on this migrator's schema (at the
// latest version). Passwords are never written into it: a role given a
// password is made LOGIN with the psql variable <role>_password, so run it
// with psql -v wharf_producer_password=... .
func (m *Migrator) RolesSQL(o RoleOptions) (string, error) {
	o, err := o.validate()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- Least-privilege roles for the Wharf outbox in schema %s (version %d).\n", m.schema, m.Latest())
	fmt.Fprintf(&b, "-- %s may enqueue, start and signal flows only; %s may run the relay only;\n", o.Producer, o.Relay)
	fmt.Fprintf(&b, "-- %s may run flow runners only; %s may read the flow tables only. Run as the schema owner.\n", o.FlowRunner, o.FlowReader)
	for _, r := range o.specs() {
		if r.password != "" {
			fmt.Fprintf(&b, "-- %s logs in: run with psql -v %s_password=... (the password is not in this script).\n", r.name, r.name)
		}
	}
	b.WriteString("BEGIN;\n")
	psqlVar := func(role string) func(string) string {
		return func(string) string { return ":'" + role + "_password'" }
	}
	for _, r := range o.specs() {
		for _, st := range roleStatements(m.schema, r.name, r.password, psqlVar(r.name), r.grants) {
			b.WriteString(st + ";\n")
		}
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// CreateRoles creates the producer, relay, flow runner and flow reader roles (keeping any that
// exist, with their attributes) and sets their grants on this migrator's
// schema to exactly what each needs, in one transaction. The schema must be
// at the latest version: the grants name its tables and functions. The
// connection needs the right to create roles and to grant on the schema
// (its owner, or a superuser).
func (m *Migrator) CreateRoles(ctx context.Context, conn Conn, o RoleOptions) error {
	o, err := o.validate()
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("wharfmigrate: roles: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := m.Check(ctx, tx); err != nil {
		return err
	}
	// The server quotes the password (format %L), so no character of it
	// can end the literal; only the statement's own text is ours.
	quoted := func(pw string) (string, error) {
		var lit string
		err := tx.QueryRow(ctx, `SELECT format('%L', $1::text)`, pw).Scan(&lit)
		return lit, err
	}
	for _, r := range o.specs() {
		lit := ""
		if r.password != "" {
			if lit, err = quoted(r.password); err != nil {
				return fmt.Errorf("wharfmigrate: roles: %w", err)
			}
		}
		for _, st := range roleStatements(m.schema, r.name, r.password, func(string) string { return lit }, r.grants) {
			if _, err := tx.Exec(ctx, st); err != nil {
				// Never echo the statement: it may hold the password.
				return fmt.Errorf("wharfmigrate: roles: role %s: %w", r.name, err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("wharfmigrate: roles: %w", err)
	}
	return nil
}
