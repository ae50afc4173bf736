// Package wharfmigrate creates and upgrades the Wharf outbox schema.
//
// Migrations are numbered up/down SQL files embedded in the binary and recorded
// in <schema>.schema_migrations. Teams that run their own migration tool can
// print the SQL with [Migrator.SQL] (or `wharf migrate print`).
package wharfmigrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DefaultSchema is the schema Wharf uses when none is configured.
const DefaultSchema = "wharf"

// Lanes is the number of lanes the outbox spreads keys over (fixed by migration 1).
const Lanes = 64

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks that name is a plain lowercase SQL identifier, so it can
// be used unquoted and means the same thing in every client.
func ValidateSchema(name string) error {
	if !schemaRE.MatchString(name) || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("invalid schema name %q: use 1-63 lowercase letters, digits and underscores, starting with a letter or underscore, not starting with pg_", name)
	}
	return nil
}

// NotifyChannel is the LISTEN/NOTIFY channel the outbox trigger notifies.
func NotifyChannel(schema string) string { return schema + "_outbox" }

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
	// KeepsMessages is set when reverting the migration neither drops
	// messages nor changes their ids: its down file has the line
	// "-- wharfmigrate:keeps-messages". Only such reverts run while the
	// outbox holds messages without being forced.
	KeepsMessages bool
}

// keepsMessagesMarker marks a down file whose revert keeps every message as it is.
const keepsMessagesMarker = "-- wharfmigrate:keeps-messages"

// Status is a migration and when it was applied (zero when pending).
type Status struct {
	Migration
	AppliedAt time.Time
}

// Migrator applies the embedded migrations to one schema.
type Migrator struct {
	schema     string
	migrations []Migration
}

// New returns a migrator for schema ("" means DefaultSchema).
func New(schema string) (*Migrator, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	ms, err := load(schema)
	if err != nil {
		return nil, err
	}
	return &Migrator{schema: schema, migrations: ms}, nil
}

// Latest is the highest migration version this build knows.
func (m *Migrator) Latest() int { return m.migrations[len(m.migrations)-1].Version }

// Migrations returns the embedded migrations, in version order, with the
// schema name filled in.
func (m *Migrator) Migrations() []Migration { return append([]Migration(nil), m.migrations...) }

var fileRE = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

func load(schema string) ([]Migration, error) { return loadFS(migrationFS, schema) }

func loadFS(fsys fs.FS, schema string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	r := strings.NewReplacer("{{schema}}", schema, "{{channel}}", NotifyChannel(schema))
	for _, e := range entries {
		parts := fileRE.FindStringSubmatch(e.Name())
		if parts == nil {
			return nil, fmt.Errorf("wharfmigrate: bad migration file name %q", e.Name())
		}
		v, _ := strconv.Atoi(parts[1])
		body, err := fs.ReadFile(fsys, "migrations/"+e.Name())
		if err != nil {
			return nil, err
		}
		mg := byVersion[v]
		if mg == nil {
			mg = &Migration{Version: v, Name: parts[2]}
			byVersion[v] = mg
		}
		if mg.Name != parts[2] {
			// Two branches that each added the next migration, merged:
			// one file would silently replace the other.
			return nil, fmt.Errorf("wharfmigrate: migration %d has two names, %s and %s: renumber one of them after the last migration", v, mg.Name, parts[2])
		}
		if parts[3] == "up" {
			mg.Up = r.Replace(string(body))
		} else {
			mg.Down = r.Replace(string(body))
			mg.KeepsMessages = slices.Contains(strings.Split(mg.Down, "\n"), keepsMessagesMarker)
		}
	}
	var out []Migration
	for _, mg := range byVersion {
		if mg.Up == "" || mg.Down == "" {
			return nil, fmt.Errorf("wharfmigrate: migration %d needs both up and down files", mg.Version)
		}
		out = append(out, *mg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, mg := range out {
		if mg.Version != i+1 {
			return nil, fmt.Errorf("wharfmigrate: migration versions must be 1..n without gaps, found %d at position %d", mg.Version, i+1)
		}
	}
	return out, nil
}

// Conn is what the migrator needs: a *pgx.Conn, *pgxpool.Pool or *pgxpool.Conn.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Up applies every pending migration, each in its own transaction, and returns
// the versions applied. Concurrent migrators serialise on an advisory lock.
func (m *Migrator) Up(ctx context.Context, conn Conn) ([]int, error) {
	return m.run(ctx, conn, func(applied int) []step {
		var steps []step
		for _, mg := range m.migrations {
			if mg.Version > applied {
				steps = append(steps, step{mg: mg, up: true})
			}
		}
		return steps
	})
}

// Down reverts the n most recently applied migrations (all of them when n <= 0)
// and returns the versions reverted. Reverting migration 1 drops the outbox and
// every message in it.
func (m *Migrator) Down(ctx context.Context, conn Conn, n int) ([]int, error) {
	target := -1
	return m.run(ctx, conn, func(applied int) []step {
		if target < 0 {
			// Fixed at the first step, under the lock: each later step
			// recomputes the plan from the version it finds.
			target = 0
			if n > 0 {
				target = max(0, applied-n)
			}
		}
		return m.downTo(applied, target)
	})
}

// DownTo reverts migrations until version target is the latest applied (0
// reverts everything) and returns the versions reverted.
func (m *Migrator) DownTo(ctx context.Context, conn Conn, target int) ([]int, error) {
	if target < 0 || target > m.Latest() {
		return nil, fmt.Errorf("wharfmigrate: target version %d is outside 0..%d", target, m.Latest())
	}
	return m.run(ctx, conn, func(applied int) []step { return m.downTo(applied, target) })
}

// ErrNotEmpty is returned by [Migrator.DownToIfEmpty] when the outbox or
// the dead-letter table holds rows and a migration to revert drops them
// (version 1) or the message ids consumers deduplicate by (version 2), or
// when flow instances have not ended and a migration to revert drops the
// flow tables (version 7).
var ErrNotEmpty = errors.New("the outbox is not empty")

// DownToIfEmpty is DownTo that refuses, with an error wrapping ErrNotEmpty,
// while the outbox or the dead-letter table holds rows, unless every
// migration it reverts keeps messages (Migration.KeepsMessages). The check runs in
// each step's transaction after locking both tables, so no message enqueued
// meanwhile can be dropped unseen.
func (m *Migrator) DownToIfEmpty(ctx context.Context, conn Conn, target int) ([]int, error) {
	if target < 0 || target > m.Latest() {
		return nil, fmt.Errorf("wharfmigrate: target version %d is outside 0..%d", target, m.Latest())
	}
	return m.runGuarded(ctx, conn, func(applied int) []step { return m.downTo(applied, target) }, m.requireEmpty)
}

// PlanDownTo returns the migrations DownTo(target) would revert now, in the
// order it would revert them, and the version applied now.
func (m *Migrator) PlanDownTo(ctx context.Context, q Querier, target int) (applied int, plan []Migration, err error) {
	if target < 0 || target > m.Latest() {
		return 0, nil, fmt.Errorf("wharfmigrate: target version %d is outside 0..%d", target, m.Latest())
	}
	if applied, err = m.Version(ctx, q); err != nil {
		return 0, nil, err
	}
	for _, s := range m.downTo(applied, target) {
		plan = append(plan, s.mg)
	}
	return applied, plan, nil
}

// Version returns the latest applied migration (0 when none is).
func (m *Migrator) Version(ctx context.Context, q Querier) (int, error) {
	exists, err := m.versionTableExists(ctx, q)
	if err != nil || !exists {
		return 0, err
	}
	return m.appliedVersion(ctx, q)
}

// Contents counts the rows of the outbox and of the dead-letter table, up to
// 1001 each (enough to say "more than 1000"); 0 for a table that does not
// exist.
func (m *Migrator) Contents(ctx context.Context, q Querier) (messages, deadLetters int64, err error) {
	if messages, err = m.countUpTo(ctx, q, "outbox", 1001); err != nil {
		return 0, 0, err
	}
	deadLetters, err = m.countUpTo(ctx, q, "dead_letters", 1001)
	return messages, deadLetters, err
}

func (m *Migrator) countUpTo(ctx context.Context, q Querier, table string, limit int) (int64, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema+"."+table).Scan(&exists); err != nil {
		return 0, fmt.Errorf("wharfmigrate: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var n int64
	if err := q.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s.%s LIMIT %d) t`, m.schema, table, limit)).Scan(&n); err != nil {
		return 0, fmt.Errorf("wharfmigrate: count %s: %w", table, err)
	}
	return n, nil
}

// requireEmpty refuses a run whose reverts would drop what is still to be
// done. When one of them drops messages or their ids (a migration without
// KeepsMessages), it locks the outbox and the dead-letter table against
// writes until the step's transaction ends and refuses while either holds
// rows. When one drops the flow tables, it locks them likewise and refuses
// while an instance has not ended (ready, running, awaiting, joining or
// failed): its state, pending signals and children would be lost.
func (m *Migrator) requireEmpty(ctx context.Context, tx pgx.Tx, steps []step) error {
	if slices.ContainsFunc(steps, func(s step) bool { return !s.up && !s.mg.KeepsMessages }) {
		if err := m.requireNoMessages(ctx, tx); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(steps, func(s step) bool { return !s.up && s.mg.DropsFlows() }) {
		return m.requireNoLiveFlows(ctx, tx)
	}
	return nil
}

var dropsFlowInstances = regexp.MustCompile(`(?i)DROP\s+TABLE\s+(IF\s+EXISTS\s+)?\S+\.flow_instances\b`)

func (m *Migrator) requireNoMessages(ctx context.Context, tx pgx.Tx) error {
	for _, table := range []string{"outbox", "dead_letters"} {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema+"."+table).Scan(&exists); err != nil {
			return fmt.Errorf("wharfmigrate: %w", err)
		}
		if exists {
			if _, err := tx.Exec(ctx, `LOCK TABLE `+m.schema+`.`+table+` IN SHARE MODE`); err != nil {
				return fmt.Errorf("wharfmigrate: lock %s: %w", table, err)
			}
		}
	}
	msgs, dead, err := m.Contents(ctx, tx)
	if err != nil {
		return err
	}
	if msgs > 0 || dead > 0 {
		return fmt.Errorf("%w: schema %s holds %s and %s; reverting would drop them or change their ids",
			ErrNotEmpty, m.schema, plural(msgs, "pending message"), plural(dead, "dead letter"))
	}
	return nil
}

func (m *Migrator) requireNoLiveFlows(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema+".flow_instances").Scan(&exists); err != nil {
		return fmt.Errorf("wharfmigrate: %w", err)
	}
	if !exists {
		return nil
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+m.schema+`.flow_instances IN SHARE MODE`); err != nil {
		return fmt.Errorf("wharfmigrate: lock flow_instances: %w", err)
	}
	var live int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+m.schema+`.flow_instances
WHERE status NOT IN ('done', 'cancelled') LIMIT 1001) t`).Scan(&live); err != nil {
		return fmt.Errorf("wharfmigrate: count flow instances: %w", err)
	}
	if live > 0 {
		verb := "have"
		if live == 1 {
			verb = "has"
		}
		return liveFlowsError{fmt.Sprintf("schema %s holds %s that %s not ended (ready, running, awaiting, joining or failed); reverting the flows migration would drop them with their signals (let them finish or cancel them with wharf flow cancel, or pass --force)",
			m.schema, plural(live, "flow instance"), verb)}
	}
	return nil
}

// liveFlowsError is the ErrNotEmpty of a revert that would drop live flows.
type liveFlowsError struct{ msg string }

func (e liveFlowsError) Error() string { return e.msg }
func (e liveFlowsError) Unwrap() error { return ErrNotEmpty }

// LiveFlows counts the flow instances that have not ended (at most 1001),
// or 0 when the schema has no flow tables.
func (m *Migrator) LiveFlows(ctx context.Context, q Querier) (int64, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema+".flow_instances").Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var live int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+m.schema+`.flow_instances
WHERE status NOT IN ('done', 'cancelled') LIMIT 1001) t`).Scan(&live)
	return live, err
}

// DropsFlows reports whether reverting mg drops the flow tables.
func (mg Migration) DropsFlows() bool { return dropsFlowInstances.MatchString(mg.Down) }

func plural(n int64, what string) string {
	switch {
	case n > 1000:
		return "more than 1000 " + what + "s"
	case n == 1:
		return "1 " + what
	default:
		return fmt.Sprintf("%d %ss", n, what)
	}
}

func (m *Migrator) downTo(applied, target int) []step {
	var steps []step
	for i := len(m.migrations) - 1; i >= 0; i-- {
		mg := m.migrations[i]
		if mg.Version <= applied && mg.Version > target {
			steps = append(steps, step{mg: mg, up: false})
		}
	}
	return steps
}

type step struct {
	mg Migration
	up bool
}

func (m *Migrator) run(ctx context.Context, conn Conn, plan func(applied int) []step) ([]int, error) {
	return m.runGuarded(ctx, conn, plan, nil)
}

// runGuarded applies the plan one step per transaction; guard, when set, runs
// in each step's transaction before the step and can refuse it.
func (m *Migrator) runGuarded(ctx context.Context, conn Conn, plan func(applied int) []step, guard func(context.Context, pgx.Tx, []step) error) ([]int, error) {
	var done []int
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return done, fmt.Errorf("wharfmigrate: %w", err)
		}
		next, err := m.stepTx(ctx, tx, plan, guard)
		if err != nil {
			_ = tx.Rollback(ctx)
			return done, err
		}
		if next == nil {
			return done, tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return done, fmt.Errorf("wharfmigrate: commit migration %d: %w", next.mg.Version, err)
		}
		done = append(done, next.mg.Version)
	}
}

// stepTx applies the first step of the plan computed under the lock, so two
// migrators running at once never apply the same migration twice.
func (m *Migrator) stepTx(ctx context.Context, tx pgx.Tx, plan func(applied int) []step, guard func(context.Context, pgx.Tx, []step) error) (*step, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "wharfmigrate:"+m.schema); err != nil {
		return nil, fmt.Errorf("wharfmigrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+m.schema+`;
CREATE TABLE IF NOT EXISTS `+m.schema+`.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("wharfmigrate: create version table: %w", err)
	}
	applied, err := m.appliedVersion(ctx, tx)
	if err != nil {
		return nil, err
	}
	if applied > m.Latest() {
		// A newer build migrated this schema: this one does not know the
		// newer migrations, so it can neither revert them nor revert
		// anything they may depend on, and the schema is not "up to date"
		// for it.
		return nil, m.newerErr(applied)
	}
	steps := plan(applied)
	if len(steps) == 0 {
		return nil, nil
	}
	// The guard stands for the whole run: it is checked before the first
	// step against every revert ahead, so a refused run changes nothing.
	if guard != nil {
		if err := guard(ctx, tx, steps); err != nil {
			return nil, err
		}
	}
	s := steps[0]
	if !s.up && s.mg.Version == 1 {
		if err := m.dropWALMode(ctx, tx); err != nil {
			return nil, err
		}
	}
	body := s.mg.Down
	if s.up {
		body = s.mg.Up
	}
	if _, err := tx.Exec(ctx, body); err != nil {
		return nil, fmt.Errorf("wharfmigrate: migration %d_%s %s: %w", s.mg.Version, s.mg.Name, direction(s.up), err)
	}
	q := `INSERT INTO ` + m.schema + `.schema_migrations (version) VALUES ($1)`
	if !s.up {
		q = `DELETE FROM ` + m.schema + `.schema_migrations WHERE version = $1`
	}
	if _, err := tx.Exec(ctx, q, s.mg.Version); err != nil {
		return nil, fmt.Errorf("wharfmigrate: record migration %d: %w", s.mg.Version, err)
	}
	if !s.up && s.mg.Version == 1 {
		// Everything Wharf created is gone: leave no empty schema behind, but
		// never drop one that holds someone else's objects.
		if _, err := tx.Exec(ctx, `DROP TABLE `+m.schema+`.schema_migrations`); err != nil {
			return nil, fmt.Errorf("wharfmigrate: %w", err)
		}
		if _, err := tx.Exec(ctx, `DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '`+m.schema+`')
     AND NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '`+m.schema+`') THEN
    DROP SCHEMA `+m.schema+`;
  END IF;
END $$`); err != nil {
			return nil, fmt.Errorf("wharfmigrate: %w", err)
		}
	}
	return &s, nil
}

func direction(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

// Querier is what the read-only calls need: a *pgx.Conn, *pgxpool.Pool,
// *pgxpool.Conn or pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (m *Migrator) appliedVersion(ctx context.Context, q Querier) (int, error) {
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+m.schema+`.schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("wharfmigrate: read version: %w", err)
	}
	return v, nil
}

// Status lists every known migration and when it was applied.
func (m *Migrator) Status(ctx context.Context, q Querier) ([]Status, error) {
	applied := map[int]time.Time{}
	exists, err := m.versionTableExists(ctx, q)
	if err != nil {
		return nil, err
	}
	if exists {
		rows, err := q.Query(ctx, `SELECT version, applied_at FROM `+m.schema+`.schema_migrations`)
		if err != nil {
			return nil, fmt.Errorf("wharfmigrate: %w", err)
		}
		for rows.Next() {
			var v int
			var at time.Time
			if err := rows.Scan(&v, &at); err != nil {
				rows.Close()
				return nil, err
			}
			applied[v] = at
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out := make([]Status, 0, len(m.migrations))
	for _, mg := range m.migrations {
		out = append(out, Status{Migration: mg, AppliedAt: applied[mg.Version]})
	}
	return out, nil
}

func (m *Migrator) versionTableExists(ctx context.Context, q Querier) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema+".schema_migrations").Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("wharfmigrate: %w", err)
	}
	return exists, nil
}

// Check returns nil when the schema is migrated to this build's latest version,
// and an error telling the operator to run `wharf migrate up` otherwise.
func (m *Migrator) Check(ctx context.Context, q Querier) error {
	exists, err := m.versionTableExists(ctx, q)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("%w (schema %q has no Wharf tables)", ErrNotMigrated, m.schema)
	}
	v, err := m.appliedVersion(ctx, q)
	if err != nil {
		return err
	}
	if v < m.Latest() {
		return fmt.Errorf("%w (schema %q is at version %d, this build needs %d)", ErrNotMigrated, m.schema, v, m.Latest())
	}
	if v > m.Latest() {
		return m.newerErr(v)
	}
	return nil
}

func (m *Migrator) newerErr(v int) error {
	return fmt.Errorf("wharfmigrate: schema %q is at version %d, newer than this build (%d): upgrade wharf", m.schema, v, m.Latest())
}

// ErrNotMigrated means the schema is missing or older than this build needs.
var ErrNotMigrated = errors.New("outbox schema is missing or out of date: run `wharf migrate up`")

// SQL returns the SQL of every migration in one direction, in the order it
// would run, for teams that apply migrations with their own tool. The version
// table bookkeeping is included so `wharf` recognises the result.
func (m *Migrator) SQL(up bool) string {
	var b strings.Builder
	if up {
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\nCREATE TABLE IF NOT EXISTS %s.schema_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());\n", m.schema, m.schema)
		for _, mg := range m.migrations {
			fmt.Fprintf(&b, "\n-- %03d_%s up\n%s\nINSERT INTO %s.schema_migrations (version) VALUES (%d);\n", mg.Version, mg.Name, strings.TrimSpace(mg.Up), m.schema, mg.Version)
		}
		return b.String()
	}
	for i := len(m.migrations) - 1; i >= 0; i-- {
		mg := m.migrations[i]
		fmt.Fprintf(&b, "\n-- %03d_%s down\n%s\nDELETE FROM %s.schema_migrations WHERE version = %d;\n", mg.Version, mg.Name, strings.TrimSpace(mg.Down), m.schema, mg.Version)
	}
	return b.String()
}
