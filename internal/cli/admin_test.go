package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
)

// databaseURL is TEST_DATABASE_URL, or a throwaway cluster started for the run.
var databaseURL string

func TestMain(m *testing.M) {
	if os.Getenv(cliHelperEnv) == "1" { // this test binary runs as the wharf CLI
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := testdb.Run(m, &databaseURL)
	for _, dir := range []string{releaseDir, ldflagsDir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// session runs wharf commands as an operator would: with a terminal or not,
// answering questions with stdin.
type session struct {
	terminal bool
	stdin    string
}

func (s session) run(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = mainWith(args, ioStreams{stdin: strings.NewReader(s.stdin), stdout: &out, stderr: &errOut, terminal: s.terminal})
	return code, out.String(), errOut.String()
}

// requireOneLineError checks the shape every failure must have.
func requireOneLineError(t *testing.T, stderr string, want string) {
	t.Helper()
	line := strings.TrimRight(stderr, "\n")
	require.NotContains(t, line, "\n", "errors must be one line: %q", stderr)
	require.True(t, strings.HasPrefix(line, "wharf: "), line)
	require.Contains(t, line, want)
}

// schemaBundle is one test's migrated schema, created with `wharf migrate up`.
type schemaBundle struct {
	schema string
	pool   *pgxpool.Pool
	client *wharf.Client
	// args are --schema and --database-url for this schema.
	args []string
}

func newSchema(t *testing.T) *schemaBundle {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wc_" + hex.EncodeToString(b[:])
	args := []string{"--schema", schema, "--database-url", databaseURL}
	code, _, errOut := run(append([]string{"migrate", "up"}, args...)...)
	require.Equal(t, 0, code, errOut)
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	return &schemaBundle{schema: schema, pool: pool, client: c, args: args}
}

func (b *schemaBundle) cmd(args ...string) []string { return append(args, b.args...) }

func (b *schemaBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+"."+table).Scan(&n))
	return n
}

// The outbox commands list, show, cancel (with confirmation) and reschedule
// pending messages, and say that a due message may already be in flight.
func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	ids, err := b.client.Enqueue(ctx,
		wharf.Message{Topic: "orders", Key: "o-1", Payload: []byte(`{"order":1}`), Headers: map[string]string{"trace": "abc"}},
		wharf.Message{Topic: "orders", Key: "o-2", Payload: []byte{0xff, 0x00}, DeliverAt: later},
		wharf.Message{Topic: "mail", Payload: []byte(`"hello"`)},
	)
	require.NoError(t, err)
	script := session{}

	code, out, errOut := script.run(b.cmd("outbox", "list")...)
	require.Equal(t, 0, code, errOut)
	for _, id := range ids {
		require.Contains(t, out, id)
	}
	require.Contains(t, out, "scheduled for ")
	require.Regexp(t, `(?m)^\d+\s+\S+\s+mail\s+due\s`, out)

	code, out, errOut = script.run(b.cmd("outbox", "list", "--json", "--topic", "orders")...)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.Equal(t, ids[0], first["id"])
	require.Equal(t, map[string]any{"order": float64(1)}, first["payload"], "a JSON payload is embedded")
	require.Equal(t, "due", first["state"])
	require.Contains(t, first, "created_at")
	var second map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
	require.Equal(t, "base64", second["payload_encoding"])
	require.Equal(t, "scheduled", second["state"])

	code, out, errOut = script.run(b.cmd("outbox", "show", ids[0])...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `{"order":1}`)
	require.Contains(t, out, "trace: abc")
	code, _, errOut = script.run(b.cmd("outbox", "show", "--id", "nope")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, `--id "nope" is neither a message id`)

	// cancel needs a selector, and a confirmation.
	code, _, errOut = script.run(b.cmd("outbox", "cancel")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "say which messages: --id ID, --topic T, --key K, or --all")
	code, _, errOut = script.run(b.cmd("outbox", "cancel", "--id", ids[1])...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "standard input is not a terminal, so pass --yes")
	code, _, errOut = session{terminal: true, stdin: "no\n"}.run(b.cmd("outbox", "cancel", "--id", ids[1])...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "Cancel 1 pending message selected by --id "+ids[1])
	require.Contains(t, errOut, "may be at a sink at this moment")
	_, answer, _ := strings.Cut(errOut, "Type yes to continue: ")
	requireOneLineError(t, answer, "not confirmed: nothing was changed")
	require.Equal(t, 3, b.count(t, "outbox"))
	code, out, errOut = session{terminal: true, stdin: "yes\n"}.run(b.cmd("outbox", "cancel", "--id", ids[1], "--verbose")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 message cancelled.")
	require.Contains(t, out, "A message that was already due may be at a sink at this moment: it can still be delivered once.", "--verbose says what cancelling does")
	require.Equal(t, 2, b.count(t, "outbox"))
	code, out, errOut = script.run(b.cmd("outbox", "cancel", "--topic", "nothing-here", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 messages cancelled.")

	// reschedule: a delay, a time, now; bad values are refused.
	code, out, errOut = script.run(b.cmd("outbox", "reschedule", "--id", ids[2], "--at", "+2h")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 message rescheduled to ")
	require.NotContains(t, out, "Held messages", "the note needs --verbose")
	ps, err := b.client.PendingMessages(ctx, wharf.PendingFilter{IDs: ids[2:]})
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(2*time.Hour), ps[0].DeliverAt, time.Minute)
	require.Equal(t, ids[2], ps[0].ID, "the id is kept")
	code, _, errOut = script.run(b.cmd("outbox", "reschedule", "--key", "o-1", "--at", "2030-01-02T03:04:05Z")...)
	require.Equal(t, 0, code, errOut)
	ps, err = b.client.PendingMessages(ctx, wharf.PendingFilter{IDs: ids[:1]})
	require.NoError(t, err)
	require.True(t, ps[0].DeliverAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))
	code, out, errOut = script.run(b.cmd("outbox", "reschedule", "--all")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "2 messages rescheduled to now.")
	ps, err = b.client.PendingMessages(ctx, wharf.PendingFilter{})
	require.NoError(t, err)
	for _, p := range ps {
		require.True(t, p.DeliverAt.IsZero())
	}
	for _, bad := range []string{"tomorrow", "-5m", "2030-01-02"} {
		code, _, errOut = script.run(b.cmd("outbox", "reschedule", "--all", "--at", bad)...)
		require.Equal(t, 2, code, bad)
		requireOneLineError(t, errOut, "write now, a time such as 2026-01-02T15:04:05Z (RFC 3339), or a duration from now such as +10m")
	}
	code, _, errOut = script.run(b.cmd("outbox", "list", "--limit", "0")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "--limit must be at least 1 (got 0)")
}

// dead purge asks on a terminal and needs --yes otherwise. Not parallel: it
// sets an environment variable.
func TestDeadPurgeNeedsConfirmation(t *testing.T) {
	b := newSchema(t)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.dead_letters (id, nonce, topic, payload, created_at, attempts, last_error)
SELECT i, 7, 't', '\x00', now(), 3, 'gave up' FROM generate_series(1, 3) i`)
	require.NoError(t, err)

	code, _, errOut := session{}.run(b.cmd("dead", "purge", "--all")...)
	require.Equal(t, 2, code)
	requireOneLineError(t, errOut, "wharf dead purge needs confirmation: standard input is not a terminal, so pass --yes")
	code, _, errOut = session{terminal: true, stdin: "y\n"}.run(b.cmd("dead", "purge", "--all")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "Purge 3 dead letters selected by --all in schema "+b.schema+"? This cannot be undone.")
	require.Equal(t, 3, b.count(t, "dead_letters"), "only yes confirms")
	code, out, errOut := session{terminal: true, stdin: "yes\n"}.run(b.cmd("dead", "purge", "--id", "1,2")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "2 dead letters purged\n", out)
	t.Setenv("WHARF_YES", "true") // not a setting: the environment cannot confirm
	code, _, _ = session{}.run(b.cmd("dead", "purge", "--all")...)
	require.Equal(t, 2, code)
	code, out, errOut = session{}.run(b.cmd("dead", "purge", "--all", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "1 dead letter purged\n", out)
}

// --id takes ids and seqs together: a dead letter either names is listed.
func TestDeadListSelectsIDsAndSeqs(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.schema+`.dead_letters (id, nonce, topic, key, payload, created_at, attempts, last_error)
SELECT i, 7, 't', 'k', '{"n":1}', now(), 3, 'gave up' FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	code, out, errOut := session{}.run(b.cmd("dead", "list", "--json", "--id", "1", "--id", wharf.FormatID(3, 7))...)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	var d map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &d))
	require.Equal(t, wharf.FormatID(3, 7), d["id"])
	require.Equal(t, "gave up", d["last_error"])
}

// status tells scheduled from due messages, shows a killed relay as dead
// with its lanes expired, and --json is snake_case with seconds and lanes
// summarised per owner.
func TestStatusCommand(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	_, err := b.client.Enqueue(ctx,
		wharf.Message{Topic: "t", Key: "a", Payload: []byte("1")},
		wharf.Message{Topic: "t", Key: "b", Payload: []byte("2"), DeliverAt: time.Now().Add(time.Hour)},
		wharf.Message{Topic: "t", Key: "c", Payload: []byte("3"), DeliverAt: time.Now().Add(time.Hour)},
	)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `
INSERT INTO `+b.schema+`.relays (relay_id, host, pid, heartbeat_at, lease_until) VALUES
    ('relay-live', 'h1', 11, now(), now() + interval '10 seconds'),
    ('relay-killed', 'h2', 22, now() - interval '40 seconds', now() - interval '30 seconds');
UPDATE `+b.schema+`.lanes SET owner = 'relay-live' WHERE lane >= 32;
UPDATE `+b.schema+`.lanes SET owner = 'relay-killed' WHERE lane < 32`)
	require.NoError(t, err)

	code, out, errOut := session{}.run(b.cmd("status")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `messages\s+3 \(counted\): 1 due, 2 scheduled for later`, out)
	require.Regexp(t, `relays\s+1 live, 1 dead \(lease TTL 10s\)`, out)
	require.Regexp(t, `relay-killed\s+h2 pid 22: DEAD, no heartbeat for 4\ds; no lanes`, out)
	require.Regexp(t, `relay-live\s+h1 pid 11: live, heartbeat \S+ ago; 32 lanes \(32-63\), leases end in \S+ unless renewed`, out)
	require.Regexp(t, `expired\s+32 lanes \(0-31\) of relay-killed, leases ended 3\ds ago`, out)

	code, out, errOut = session{}.run(b.cmd("status", "--json")...)
	require.Equal(t, 0, code, errOut)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Equal(t, float64(3), st["messages"])
	require.Equal(t, true, st["messages_exact"])
	require.Equal(t, float64(1), st["due"])
	require.Equal(t, float64(2), st["scheduled"])
	require.Equal(t, float64(10), st["lease_ttl_seconds"])
	require.Greater(t, st["oldest_due_age_seconds"], float64(0))
	require.Less(t, st["oldest_due_age_seconds"], float64(60), "seconds, not nanoseconds")
	relays := st["relays"].([]any)
	require.Len(t, relays, 2)
	killed := relays[0].(map[string]any) // in relay id order
	require.Equal(t, "relay-killed", killed["relay_id"])
	require.Equal(t, false, killed["live"])
	require.Equal(t, float64(0), killed["lane_count"])
	require.InDelta(t, 40, killed["heartbeat_age_seconds"], 5)
	lanes := st["lanes"].(map[string]any)
	require.Equal(t, float64(64), lanes["total"])
	require.Equal(t, float64(32), lanes["leased"])
	require.Equal(t, float64(32), lanes["expired"])
	byOwner := lanes["by_owner"].([]any)
	require.Len(t, byOwner, 2, "lanes are summarised per owner, not listed")
	require.Equal(t, map[string]any{"owner": "relay-killed", "count": float64(32), "lanes": "0-31", "expired": true}, byOwner[0])
	require.Equal(t, map[string]any{"owner": "relay-live", "count": float64(32), "lanes": "32-63", "expired": false}, byOwner[1])
	for k := range st {
		require.Regexp(t, `^[a-z_]+$`, k, "snake_case names")
	}
}

// migrate down reverts one step by default, prints its plan with --dry-run,
// refuses while messages or dead letters are there unless --force, and
// checks its flags.
func TestMigrateDown(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	s := session{}
	_, err := b.client.Enqueue(ctx, wharf.Message{Topic: "t", Payload: []byte("x")})
	require.NoError(t, err)

	// Reverting versions 9, 8, 7, 6, 5, 4 and 3 keeps messages; reverting 2 or 1 would not.
	code, out, errOut := s.run(b.cmd("migrate", "down", "--dry-run", "--steps", "7")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "would revert 009_retry_nonce\nwould revert 008_flow_roles\nwould revert 007_flows\nwould revert 006_nonce_62_bits\nwould revert 005_late_commit_index\nwould revert 004_xid_statistics\nwould revert 003_relay_leases\nschema "+b.schema+" would go from version 9 to 2\n"+
		"the outbox holds 1 pending message and 0 dead letters: these reverts keep them\n", out)
	code, out, errOut = s.run(b.cmd("migrate", "down", "--dry-run", "--steps", "8")...)
	require.Equal(t, 1, code, "a dry run that would be refused fails")
	requireOneLineError(t, errOut, "dry run: this migrate down would be refused: the outbox is not empty")
	require.Equal(t, "would revert 009_retry_nonce\nwould revert 008_flow_roles\nwould revert 007_flows\nwould revert 006_nonce_62_bits\nwould revert 005_late_commit_index\nwould revert 004_xid_statistics\nwould revert 003_relay_leases\nwould revert 002_message_ids\nschema "+b.schema+" would go from version 9 to 1\n"+
		"the outbox holds 1 pending message and 0 dead letters: it would be refused: pass --force to revert anyway and lose them\n", out)
	code, _, errOut = s.run(b.cmd("migrate", "down", "--dry-run", "--steps", "8", "--force")...)
	require.Equal(t, 0, code, "with --force the dry run would not be refused: %s", errOut)
	code, out, errOut = s.run(b.cmd("migrate", "down", "--dry-run", "--target-version", "0")...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, out, "would revert 009_retry_nonce\nwould revert 008_flow_roles\nwould revert 007_flows\nwould revert 006_nonce_62_bits\nwould revert 005_late_commit_index\nwould revert 004_xid_statistics\nwould revert 003_relay_leases\nwould revert 002_message_ids\nwould revert 001_outbox\n")

	code, _, errOut = s.run(b.cmd("migrate", "down", "--steps", "8")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "refusing to migrate down: the outbox is not empty: schema "+b.schema+" holds 1 pending message and 0 dead letters; reverting would drop them or change their ids (deliver, cancel or purge them first, or pass --force)")
	require.Equal(t, 1, b.count(t, "outbox"), "a refused down changes nothing")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--steps", "0"}, "--steps must be at least 1 (got 0); to revert everything use --target-version 0"},
		{[]string{"--target-version", "10"}, "--target-version must be between 0 and 9 (got 10)"},
		{[]string{"--target-version", "-1"}, "--target-version must be between 0 and 9 (got -1)"},
		{[]string{"--steps", "1", "--target-version", "0"}, "give --steps or --target-version, not both"},
	} {
		code, _, errOut = s.run(b.cmd(append([]string{"migrate", "down"}, c.args...)...)...)
		require.Equal(t, 2, code, c.args)
		requireOneLineError(t, errOut, c.want)
	}

	// The refused run reverted nothing: versions 9, 8, 7, 6, 5, 4 and 3 are still
	// there to revert, without --force, keeping the message.
	code, out, errOut = s.run(b.cmd("migrate", "down", "--steps", "7")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+b.schema+" migrated down: reverted [9 8 7 6 5 4 3], now at version 2\n", out)
	require.Equal(t, 1, b.count(t, "outbox"))
	code, out, errOut = s.run(b.cmd("migrate", "down", "--force")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+b.schema+" migrated down: reverted [2], now at version 1\n", out)
	code, _, errOut = s.run(b.cmd("migrate", "up")...)
	require.Equal(t, 0, code, errOut)
	_, err = b.pool.Exec(ctx, "DELETE FROM "+b.schema+".outbox")
	require.NoError(t, err)
	code, out, errOut = s.run(b.cmd("migrate", "down", "--target-version", "0")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+b.schema+" migrated down: reverted [9 8 7 6 5 4 3 2 1], now at version 0\n", out)
	code, out, errOut = s.run(b.cmd("migrate", "down")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+b.schema+" is at version 0: nothing to revert\n", out)
}

// migrate down refuses to revert the flows migration while an instance has
// not ended, in its dry run and for real, and --force reverts it anyway.
func TestMigrateDownRefusesToDropLiveFlows(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	s := session{}
	_, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.flow_definitions (flow, first_step, steps, runner) VALUES ('payout', 'charge', '{charge}', 'r')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `SELECT `+b.schema+`.start_flow('payout', '{"amount": 100}', 'p-1')`)
	require.NoError(t, err)

	code, out, errOut := s.run(b.cmd("migrate", "down", "--dry-run", "--steps", "3")...)
	require.Equal(t, 1, code, "a dry run that would be refused fails")
	requireOneLineError(t, errOut, "dry run: this migrate down would be refused: flow instances have not ended")
	require.Contains(t, out, "1 flow instance not ended: it would be refused")
	// Reverting 9 and 8 keeps the flow tables.
	code, out, errOut = s.run(b.cmd("migrate", "down", "--dry-run", "--steps", "2")...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "flow instance")

	code, _, errOut = s.run(b.cmd("migrate", "down", "--steps", "3")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "refusing to migrate down: schema "+b.schema+" holds 1 flow instance that has not ended")
	require.Equal(t, 1, b.count(t, "flow_instances"), "a refused down changes nothing")

	code, out, errOut = s.run(b.cmd("migrate", "down", "--steps", "3", "--force")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+b.schema+" migrated down: reverted [9 8 7], now at version 6\n", out)
}

// wharf status shows the flows on a schema with the flow tables: steps due,
// running, awaiting a signal, joining, failed (with the command that lists
// those), and the live runners.
func TestStatusShowsFlows(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	code, out, errOut := session{}.run(b.cmd("status")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `flows\s+0 runnable, 0 running, 0 awaiting a signal, 0 joining children, 0 failed\n`, out)
	require.Regexp(t, `runners\s+0 live\n`, out)
	require.NotContains(t, out, "--status failed")

	_, err := b.pool.Exec(ctx, `
INSERT INTO `+b.schema+`.flow_instances (flow, step, status, run_at) VALUES
    ('order', 's', 'ready', now() - interval '30 seconds'),
    ('order', 's', 'ready', now() + interval '1 hour'),
    ('invoice', 's', 'ready', now() - interval '5 seconds'),
    ('order', 's', 'running', now() + interval '30 seconds'),
    ('order', 's', 'awaiting', 'infinity'),
    ('order', 's', 'awaiting', 'infinity'),
    ('order', 's', 'joining', now()),
    ('order', 's', 'failed', now()),
    ('invoice', 's', 'failed', now()),
    ('order', 's', 'done', now());
INSERT INTO `+b.schema+`.flow_runners (id, lease, alive_until) VALUES
    ('runner-live', '10 seconds', now() + interval '10 seconds'),
    ('runner-gone', '10 seconds', now() - interval '1 minute')`)
	require.NoError(t, err)

	code, out, errOut = session{}.run(b.cmd("status")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `flows\s+2 runnable \(oldest due 3\ds ago\), 1 running, 2 awaiting a signal, 1 joining children, 2 failed\n`, out)
	require.Regexp(t, `runners\s+1 live\n`, out)
	require.Regexp(t, `failed\s+2 instance\(s\) wait to be retried or cancelled: wharf flow list --status failed\n`, out)

	code, out, errOut = session{}.run(b.cmd("status", "--json")...)
	require.Equal(t, 0, code, errOut)
	var st struct {
		Flows map[string]any `json:"flows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.InDelta(t, 30, st.Flows["oldest_runnable_seconds"], 5)
	delete(st.Flows, "oldest_runnable_seconds")
	require.Equal(t, map[string]any{"runnable": float64(2), "running": float64(1), "awaiting": float64(2), "joining": float64(1),
		"failed": float64(2), "live_runners": float64(1)}, st.Flows)
}
