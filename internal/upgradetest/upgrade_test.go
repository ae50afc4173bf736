package upgradetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

// releases maps each release that has a fixture to its last migration.
var releases = []struct {
	version       string
	lastMigration int
}{
	{"0.1.0", 9},
}

// writeFixtureEnv names the release whose fixture TestFixtureRecipe writes.
const writeFixtureEnv = "WHARF_WRITE_UPGRADE_FIXTURE"

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// freshSchema returns the name of a schema no one uses, dropped after t.
func freshSchema(t *testing.T, p *pgxpool.Pool, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := prefix + "_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, _ = p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s+" CASCADE")
	})
	return s
}

// migrateTo brings schema to migration version (creating it), applying the
// migrations up to version forward only, as the release did: reverting from
// the head instead would test from whatever the later migrations' down
// files leave, which need not be the release's schema (a column re-added by
// a down file lands last, and the fixture's INSERTs are positional).
func migrateTo(t *testing.T, p *pgxpool.Pool, schema string, version int) *wharfmigrate.Migrator {
	t.Helper()
	ctx := context.Background()
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	if version >= m.Latest() {
		_, err = m.Up(ctx, p)
		require.NoError(t, err)
		return m
	}
	// The version table as Migrator.Up creates it.
	_, err = p.Exec(ctx, `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, mg := range m.Migrations() {
		if mg.Version > version {
			break
		}
		err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, mg.Up); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.schema_migrations (version) VALUES ($1)`, mg.Version)
			return err
		})
		require.NoError(t, err, "migration %d", mg.Version)
	}
	v, err := m.Version(ctx, p)
	require.NoError(t, err)
	require.Equal(t, version, v)
	return m
}

// A database each release left behind — pending and retrying messages, a
// dead letter, flows ready, awaiting, joining (children awaiting) and failed,
// a signal kept before its await — upgrades to the head and runs to the end:
// every message delivered once in key order, every instance done, each step's
// history once, one message per emitting step.
func TestUpgradeRunsWhatEachReleaseLeftToTheEnd(t *testing.T) {
	for _, r := range releases {
		t.Run(r.version, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			p := pool(t)
			schema := freshSchema(t, p, "upgrade")
			m := migrateTo(t, p, schema, r.lastMigration)
			body, err := os.ReadFile(filepath.Join("testdata", r.version+".sql"))
			require.NoError(t, err, "the fixture of release %s", r.version)
			_, err = p.Exec(ctx, strings.ReplaceAll(string(body), "{{schema}}", schema))
			require.NoError(t, err, "loading the fixture of release %s", r.version)
			before := takeSnapshot(t, p, schema)
			applied, err := m.Up(ctx, p)
			require.NoError(t, err, "migrating from %s to the head", r.version)
			t.Logf("from %s: applied migrations %v", r.version, applied)
			if sql := os.Getenv(futureMigrationEnv); sql != "" {
				// TestUpgradeCatchesHarmfulMigrations: a migration a later
				// release might bring, which this test must catch.
				_, err := p.Exec(ctx, strings.ReplaceAll(sql, "{{schema}}", schema))
				require.NoError(t, err, "the simulated migration")
			}
			requirePreserved(t, before, takeSnapshot(t, p, schema))
			runToTheEnd(t, p, schema, before)
		})
	}
}

// The recipe of the next release's fixture works at the head, and what it
// leaves runs to the end. With WHARF_WRITE_UPGRADE_FIXTURE=<version> (at the
// release's commit, once) it also writes testdata/<version>.sql.
func TestFixtureRecipe(t *testing.T) {
	ctx := context.Background()
	p := pool(t)
	schema := freshSchema(t, p, "upgrade_fixture")
	m := migrateTo(t, p, schema, 1<<30)
	stop, err := Build(ctx, p, schema)
	require.NoError(t, err)
	if version := os.Getenv(writeFixtureEnv); version != "" {
		last := releases[len(releases)-1]
		require.Equal(t, last.version, version, "add the release to releases first, with its last migration")
		require.Equal(t, last.lastMigration, m.Latest(), "write a release's fixture at the release's commit")
		// While the relay and the runner still hold their leases: what a
		// kill -9 leaves.
		writeFixture(t, schema, filepath.Join("testdata", version+".sql"))
	}
	stop()
	runToTheEnd(t, p, schema, takeSnapshot(t, p, schema))
}

var dumpNoise = regexp.MustCompile(`^(--|SET |SELECT pg_catalog\.set_config\('search_path'|\\)`)

// writeFixture dumps schema's data (not its schema: the release's migrations
// create that) to path, with the schema's name as {{schema}}.
func writeFixture(t *testing.T, schema, path string) {
	t.Helper()
	bin, err := exec.LookPath("pg_dump")
	if err != nil {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_dump")
		require.NotEmpty(t, found, "pg_dump: not on PATH nor in /usr/lib/postgresql/*/bin")
		bin = newestPgDump(found)
	}
	out, err := exec.Command(bin, "--data-only", "--inserts", "--schema="+schema,
		"--exclude-table-data="+schema+".schema_migrations", "--dbname="+databaseURL).Output()
	require.NoError(t, err, "pg_dump")
	var kept []string
	for _, line := range strings.Split(string(out), "\n") {
		if dumpNoise.MatchString(line) || (line == "" && (len(kept) == 0 || kept[len(kept)-1] == "")) {
			continue
		}
		kept = append(kept, strings.ReplaceAll(line, schema+".", "{{schema}}."))
	}
	header := "-- The data of an outbox and its flows as Wharf " + os.Getenv(writeFixtureEnv) + " left them\n" +
		"-- (internal/upgradetest.Build, dumped by pg_dump). Written once at the release; never edit.\n" +
		"-- The migrations fill lanes; the dump has its rows as the relay left them.\n" +
		"DELETE FROM {{schema}}.lanes;\n"
	require.NoError(t, os.WriteFile(path, []byte(header+strings.Join(kept, "\n")), 0o644))
	t.Logf("wrote %s", path)
}

// newestPgDump returns the pg_dump of the highest PostgreSQL version among
// /usr/lib/postgresql/<version>/bin/pg_dump paths: Glob sorts them as text,
// where 9.6 comes after 15, and a pg_dump older than the server refuses to
// dump it.
func newestPgDump(found []string) string {
	major := func(p string) int {
		v := filepath.Base(filepath.Dir(filepath.Dir(p)))
		n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
		return n
	}
	return slices.MaxFunc(found, func(a, b string) int { return major(a) - major(b) })
}

// recorder records what a relay delivers.
type recorder struct {
	mu   sync.Mutex
	msgs []wharf.Message
}

func (r *recorder) handle(_ context.Context, m *wharf.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, *m)
	return nil
}

// drain runs a relay over schema's outbox until nothing is deliverable and
// returns what it delivered.
func drain(t *testing.T, p *pgxpool.Pool, schema string) []wharf.Message {
	t.Helper()
	rec := &recorder{}
	// Short intervals, as the root package's tests use: Drain's checks
	// that nothing is deliverable come round sooner.
	client, err := wharf.NewClient(p, &wharf.Config{Schema: schema, Handler: rec.handle, LeaseTTL: 3 * time.Second, RebalanceInterval: 200 * time.Millisecond,
		RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, client.Drain(ctx))
	return rec.msgs
}

// runToTheEnd runs what Build left in schema to the end and checks it.
// before is what the release left, with the ids consumers saw.
func runToTheEnd(t *testing.T, p *pgxpool.Pool, schema string, before snapshot) {
	t.Helper()
	ctx := context.Background()

	// The outbox: every pending message once, in order per key; the retrying
	// one keeps its attempts; the dead letter is retried with its id.
	msgs := drain(t, p, schema)
	require.Len(t, msgs, PendingMessages)
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range msgs {
		require.Falsef(t, seen[m.ID], "message %s delivered twice", m.ID)
		seen[m.ID] = true
		if m.Key != "" {
			require.Greaterf(t, m.Seq, last[m.Key], "key %s out of order", m.Key)
			last[m.Key] = m.Seq
		}
		if m.Key == "h1" {
			require.Equal(t, "t-1", m.Headers["trace"], "headers survive")
			require.Equal(t, "acme", m.Headers["tenant"], "headers survive")
		}
	}
	// The message scheduled for 2100 stays, with its time.
	var scheduled string
	require.NoError(t, p.QueryRow(ctx, `SELECT `+schema+`.message_id(id, nonce)::text FROM `+schema+`.outbox
WHERE deliver_at = '2100-01-01T00:00:00Z'`).Scan(&scheduled))
	var left int
	require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox`).Scan(&left))
	require.Equal(t, ScheduledMessages, left, "only the message scheduled for 2100 is left")
	ids := []string{scheduled}
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	require.Equal(t, before.pending, ids, "the pending messages keep the ids consumers deduplicate by")
	require.Equal(t, 3, msgs[slices.IndexFunc(msgs, func(m wharf.Message) bool { return string(m.Payload) == `{"n": 3}` })].Attempt,
		"the retrying message's third attempt")
	client, err := wharf.NewClient(p, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	dead, err := client.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, before.dead, []string{dead[0].ID}, "the dead letter keeps its id")
	n, err := client.RetryDeadLetters(ctx, wharf.DeadLetterFilter{IDs: []string{dead[0].ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	retried := drain(t, p, schema)
	require.Len(t, retried, 1)
	require.Equal(t, dead[0].ID, retried[0].ID)

	// The flows: pay the awaiting orders (the first twice, one dedup key) and
	// the ready one without its payment (before it awaits it), pick up every
	// parcel, retry the failed instances after the fix.
	flows := NewFlows()
	fc, err := wharfflow.NewClient(p, schema)
	require.NoError(t, err)
	runner, err := wharfflow.NewRunner(p, &wharfflow.Config{Schema: schema, Flows: flows.Definitions(), RateLimits: RateLimits})
	require.NoError(t, err)
	require.NoError(t, runner.Start(ctx))
	defer runner.Stop(ctx) //nolint:errcheck
	for i := 1; i <= AwaitingOrders+CancelledOrders+ReadyOrders; i++ {
		key := fmt.Sprintf("o%d", i)
		if key == EarlyPaidOrder || (i > AwaitingOrders && i <= AwaitingOrders+CancelledOrders) {
			continue // paid before the upgrade, or cancelled
		}
		sig := wharfflow.Signal{Flow: "order", Key: key, Name: "payment", DedupKey: fmt.Sprintf("psp-%d", i)}
		for range min(i, 2) {
			_, err := fc.Send(ctx, sig)
			require.NoError(t, err)
		}
	}
	failed, err := fc.List(ctx, wharfflow.ListOptions{Flow: "flaky", Status: "failed"})
	require.NoError(t, err)
	require.Len(t, failed, FailedFlaky)
	for _, inst := range failed {
		require.NoError(t, fc.Retry(ctx, inst.ID))
	}
	wantCounts := map[string]int64{
		"order/done":      AwaitingOrders + ReadyOrders,
		"order/cancelled": CancelledOrders,
		"shipment/done":   JoiningShipments + ReadyShipments,
		"parcel/done":     2 * (JoiningShipments + ReadyShipments),
		"flaky/done":      FailedFlaky,
		"slow/done":       RunningSlow,
		"note/done":       DoneNotes + ReadyNotes,
	}
	deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		// Parcels await their pickup, including those the ready shipment
		// spawns after the upgrade; a repeated pickup is deduplicated.
		awaiting, err := fc.List(ctx, wharfflow.ListOptions{Flow: "parcel", Status: "awaiting"})
		require.NoError(t, err)
		for _, inst := range awaiting {
			// It may end between the list and the signal.
			_, err := fc.Send(ctx, wharfflow.Signal{Instance: inst.ID, Name: "pickup", DedupKey: fmt.Sprint("pickup-", inst.ID)})
			if !errors.Is(err, wharfflow.ErrNoInstance) {
				require.NoError(t, err)
			}
		}
		counts, err := fc.StatusCounts(ctx)
		require.NoError(t, err)
		got := map[string]int64{}
		for _, c := range counts {
			got[c.Flow+"/"+c.Status] += c.N
		}
		if fmt.Sprint(got) == fmt.Sprint(wantCounts) {
			break
		}
		select {
		case <-deadline.Done():
			t.Fatalf("flows did not all finish: have %v, want %v", got, wantCounts)
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.NoError(t, runner.Stop(ctx))

	// History: each step once, but the failed step that was retried.
	want := map[string]string{
		"order":    "reserve:await paid:done",
		"shipment": "pack:spawn joined:done",
		"parcel":   "wait:await picked:done",
		"flaky":    "start:fail start:done",
		"slow":     "work:done",
		"note":     "write:done",
		// Cancelled while it awaited its payment.
		"order/cancelled": "reserve:await",
	}
	rows, err := p.Query(ctx, `SELECT i.id, i.flow, i.status, string_agg(s.step || ':' || s.outcome, ' ' ORDER BY s.finished_at, s.step)
FROM `+schema+`.flow_instances i LEFT JOIN `+schema+`.flow_steps s ON s.instance_id = i.id GROUP BY i.id, i.flow, i.status`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var flow, status, history string
		require.NoError(t, rows.Scan(&id, &flow, &status, &history))
		w, ok := want[flow+"/"+status]
		if !ok {
			w = want[flow]
		}
		require.Equalf(t, w, history, "the history of instance %d (%s, %s)", id, flow, status)
	}
	require.NoError(t, rows.Err())
	// One orders.shipped message per order.
	shipped := drain(t, p, schema)
	var keys []string
	for _, m := range shipped {
		require.Equal(t, "orders.shipped", m.Topic)
		keys = append(keys, m.Key)
	}
	slices.Sort(keys)
	require.Equal(t, []string{"o1", "o2", "o3", "o5", "o6"}, keys)
}
