package cli

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// demoFile returns the path of the file sink the demo names on its sink line.
func demoFile(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^sink +(file://\S+): JSON lines`).FindStringSubmatch(out)
	require.NotNil(t, m, "the demo names its file sink:\n%s", out)
	u, err := url.Parse(m[1])
	require.NoError(t, err)
	return filepath.FromSlash(u.Path)
}

// demoSchema returns the schema the demo names on its database line.
func demoSchema(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^database .*, (?:new )?schema (wharf_demo_[0-9a-f]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "the demo names its schema:\n%s", out)
	return m[1]
}

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	defer pool.Close()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n))
	return n > 0
}

// The demo shows the product: where it runs, the sink it names, the messages
// of one transaction as they arrive in per-key order, a relay stopped hard
// and the file read back and checked, then the rate into the null sink,
// clearly labelled. It removes its schema and file afterwards.
func TestDemoShowsDeliveryCrashCheckAndRate(t *testing.T) {
	t.Parallel()
	code, out, errOut := run("demo", "--database-url", databaseURL, "--messages", "500", "--keys", "10")
	require.Equal(t, 0, code, errOut)

	require.Regexp(t, `(?m)^database +PostgreSQL \d+.* at postgres://.*, new schema wharf_demo_[0-9a-f]+ \(dropped at exit\)$`, out)
	path := demoFile(t, out)
	require.Contains(t, out, "fsync'd before each acknowledgement (removed at exit; --keep keeps it)")

	// Step 1: every message of the transaction printed with id, topic, key
	// and payload, and each key's in enqueue order.
	for k := 1; k <= 3; k++ {
		var last int
		for _, ev := range []string{"created", "paid", "shipped"} {
			line := regexp.MustCompile(fmt.Sprintf(`(?m)^   delivered  id [0-9a-f-]{36}  topic orders  key order-%d  payload \{"order":"order-%d","event":"%s"\}$`, k, k, ev))
			loc := line.FindStringIndex(out)
			require.NotNil(t, loc, "order-%d %s is printed:\n%s", k, ev, out)
			require.Greater(t, loc[0], last, "order-%d's messages are printed in enqueue order", k)
			last = loc[0]
		}
		require.Regexp(t, fmt.Sprintf(`(?m)^   key order  order-%d arrived as seq \d+, \d+, \d+ \(created, paid, shipped\): enqueue order$`, k), out)
	}

	// Step 2: the hard stop, the second relay and a passing check that found
	// redeliveries (the batch the first relay never recorded).
	require.Regexp(t, `relay 1    stopped hard right after the file took a batch of [1-9]\d* messages`, out)
	require.Regexp(t, `relay 2    \S+ starts`, out)
	require.Regexp(t, `all 1009 messages of steps 1 and 2 delivered at least once`, out)
	require.Regexp(t, `[1-9]\d* delivered again after the crash with the same id`, out)
	require.Regexp(t, `e\.g\. id [0-9a-f-]{36} \(key order-\d+\) is on lines \d+ and \d+`, out)
	require.Contains(t, out, "every key's messages arrived in enqueue order across 20 keys: OK")

	// Step 3: the checkouts started, awaiting, signalled and done, each
	// with its three steps and their times, its children, and the message
	// its last step emitted, delivered.
	requireDemoFlows(t, out)

	// Step 4: the rate, into null:, saying so.
	require.Contains(t, out, "4. Throughput: 500 messages")
	require.Contains(t, out, "sink       null:, the null sink: it acknowledges and discards every message")
	require.Regexp(t, `delivered  500 messages in \S+ \(\d+ msg/s\), 0 redelivered`, out)
	require.Contains(t, out, "key order  intact across 10 keys")
	// The saturation run says its latency is queueing; a paced run gives
	// the steady-state latency.
	require.Contains(t, out, "saturation the producers enqueue as fast as they can, faster than the relay delivers")
	require.Regexp(t, `latency    commit -> sink ack \(saturated, mostly queueing\): p50 `, out)
	require.Regexp(t, `(?m)^   steady     \d+ messages paced at \d+ msg/s \(half the rate above\), so the relay keeps up:$`, out)
	require.Regexp(t, `latency    commit -> sink ack \(steady state\): p50 \S+  p95 \S+  p99 \S+  max \S+`, out)
	require.Equal(t, 2, strings.Count(out, "key order  intact across 10 keys"), "both runs keep per-key order")

	require.NoFileExists(t, path)
	require.NoDirExists(t, filepath.Dir(path))
	require.False(t, schemaExists(t, demoSchema(t, out)), "the demo schema is dropped")
}

// With --keep the file stays, and holds every message at least once.
func TestDemoKeepKeepsTheFile(t *testing.T) {
	t.Parallel()
	code, out, errOut := run("demo", "--database-url", databaseURL, "--messages", "100", "--keys", "5", "--keep")
	require.Equal(t, 0, code, errOut)
	path := demoFile(t, out)
	schema := demoSchema(t, out)
	t.Cleanup(func() {
		_ = os.RemoveAll(filepath.Dir(path))
		pool, err := pgxpool.New(context.Background(), databaseURL)
		if err == nil {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			pool.Close()
		}
	})
	require.Contains(t, out, "(kept after the demo)")
	require.Contains(t, out, "schema "+schema+" (kept)")
	require.True(t, schemaExists(t, schema))
	// The flows the demo printed are the ones in the database: three
	// checkouts and six shipping children, done, with one history row per
	// step printed.
	requireDemoFlows(t, out)
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	defer pool.Close()
	var checkouts, children, steps, consumed int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
  (SELECT count(*) FROM `+schema+`.flow_instances WHERE flow = 'checkout' AND status = 'done'),
  (SELECT count(*) FROM `+schema+`.flow_instances WHERE flow = 'shipping' AND status = 'done' AND parent_id IS NOT NULL),
  (SELECT count(*) FROM `+schema+`.flow_steps),
  (SELECT count(*) FROM `+schema+`.flow_signals WHERE consumed_step = 'paid')`).Scan(&checkouts, &children, &steps, &consumed))
	require.Equal(t, []int{3, 6, 15, 3}, []int{checkouts, children, steps, consumed})
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Count(string(data), "\n")
	require.GreaterOrEqual(t, lines, 1009, "every message of steps 1 and 2 is in the file")
	require.Regexp(t, fmt.Sprintf(`read the file back: %d lines`, lines), out)
}

// The demo prints where it runs without the database password, whether the
// URL is a URL or a key=value connection string.
func TestDemoPrintsNoDatabasePassword(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "DEMOSECRET")
	host, port, _ := strings.Cut(u.Host, ":")
	dsn := fmt.Sprintf("host=%s port=%s user=%s password=DSNDEMOSECRET dbname=%s", host, cmp.Or(port, "5432"), u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	for _, db := range []string{u.String(), dsn} {
		code, out, errOut := run("demo", "--database-url", db, "--messages", "200", "--keys", "10", "--log-level", "debug")
		require.Equal(t, 0, code, errOut)
		require.Regexp(t, `(?m)^database +PostgreSQL .* at (postgres://\S+:xxxxx@|host=)`, out)
		require.Contains(t, out, "4. Throughput: 200 messages")
		require.NotContains(t, out+errOut, "SECRET")
	}
}

// When the file does not hold what was enqueued, the demo says so in one
// line and exits 1: the check verifies, it does not just claim. Not parallel:
// it sets the hook the other demo tests leave unset.
func TestDemoFailsWhenTheCheckFails(t *testing.T) {
	demoBeforeCheck = func(path string) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		lines := strings.SplitAfter(string(data), "\n")
		// Drop the first line: step 1's first delivered message.
		require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines[1:], "")), 0o644))
	}
	t.Cleanup(func() { demoBeforeCheck = nil })
	code, out, errOut := run("demo", "--database-url", databaseURL, "--messages", "10", "--keys", "2")
	require.Equal(t, 1, code, out)
	require.Regexp(t, `(?m)^wharf: guarantee check FAILED on \S+delivered\.jsonl: 1 never delivered \(first: id [0-9a-f-]{36} \(key order-\d, seq \d+\) is not in the file\)$`, errOut)
	require.NotContains(t, out, ": OK")
	require.NotContains(t, out, "3. Flows")
	require.NotContains(t, out, "4. Throughput")
}

// checkDelivered counts redeliveries as such and catches every way the file
// can break the guarantees.
func TestCheckDelivered(t *testing.T) {
	t.Parallel()
	var sent []sentMsg
	for seq := int64(1); seq <= 6; seq++ {
		key := "a"
		if seq%2 == 0 {
			key = "b"
		}
		sent = append(sent, sentMsg{id: wharf.FormatID(seq, seq), topic: "orders", key: key, seq: seq})
	}
	line := func(seq int64) string {
		s := sent[seq-1]
		return fmt.Sprintf(`{"id":%q,"seq":%d,"topic":"orders","key":%q,"headers":{},"payload":{}}`+"\n", s.id, s.seq, s.key)
	}
	check := func(seqs ...int64) deliveryCheck {
		var b strings.Builder
		for _, s := range seqs {
			b.WriteString(line(s))
		}
		p := filepath.Join(t.TempDir(), "f.jsonl")
		require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
		c, err := checkDelivered(p, sent)
		require.NoError(t, err)
		return c
	}

	c := check(1, 2, 3, 4, 5, 6)
	require.True(t, c.ok(), c.problem())
	require.Equal(t, deliveryCheck{lines: 6, unique: 6, keys: 2}, c)

	// Redelivered after a crash: the same ids again, then the rest.
	c = check(2, 1, 3, 1, 3, 5, 4, 6)
	require.True(t, c.ok(), c.problem())
	require.Equal(t, 8, c.lines)
	require.Equal(t, 2, c.dups)
	require.Contains(t, c.firstDup, "is on lines 2 and 4")

	c = check(1, 2, 3, 4, 6)
	require.False(t, c.ok())
	require.Equal(t, 1, c.missing)
	require.Contains(t, c.problem(), "1 never delivered")

	c = check(1, 2, 5, 3, 4, 6)
	require.False(t, c.ok())
	require.Equal(t, 1, c.order)
	require.Contains(t, c.problem(), "line 4: key a seq 3 arrived after seq 5")

	p := filepath.Join(t.TempDir(), "f.jsonl")
	body := line(1) + `{"id":"00000000-0000-8063-8000-000000000000","seq":99,"topic":"orders","key":"a"}` + "\n" + "not json\n"
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	c, err := checkDelivered(p, sent[:1])
	require.NoError(t, err)
	require.False(t, c.ok())
	require.Equal(t, 1, c.unknown)
	require.Equal(t, 1, c.bad)
	require.Contains(t, c.problem(), "1 not enqueued by the demo, 1 unreadable lines")

	_, err = checkDelivered(filepath.Join(t.TempDir(), "missing.jsonl"), sent)
	require.ErrorContains(t, err, "cannot read the demo's file sink back")
}

// The Quick start: with no database URL the demo starts a throwaway
// PostgreSQL, says so, runs every step and removes the cluster. Not parallel:
// it clears the database URL variables.
func TestDemoOnAThrowawayDatabase(t *testing.T) {
	t.Setenv("WHARF_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	code, out, errOut := run("demo", "--messages", "200", "--keys", "10")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "No database URL given: starting a throwaway PostgreSQL")
	require.Regexp(t, `(?m)^database +throwaway PostgreSQL \d+.* at postgres://\S+, schema wharf \(removed at exit\)$`, out)
	require.NoFileExists(t, demoFile(t, out))
	require.Contains(t, out, "every key's messages arrived in enqueue order across 20 keys: OK")
	require.Contains(t, out, "key order  intact across 10 keys")
}

// Given a schema whose outbox holds an application's messages, the demo
// refuses rather than deliver them to its own sinks, and leaves them there.
func TestDemoRefusesASchemaWithMessages(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	_, err := b.client.Enqueue(context.Background(), wharf.Message{Topic: "app", Key: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	code, out, errOut := run(b.cmd("demo", "--messages", "10")...)
	require.Equal(t, 2, code, out)
	require.Equal(t, "wharf: --schema "+b.schema+": its outbox holds messages, which the demo would deliver to its own sinks: give an unused schema, or no --schema\n", errOut)
	require.Equal(t, 1, b.count(t, "outbox"))

	// Nor does it run an application's active checkout flows.
	_, err = b.pool.Exec(context.Background(), "DELETE FROM "+b.schema+".outbox")
	require.NoError(t, err)
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT "+b.schema+".start_flow('checkout', '{}', 'app-1', 'reserve')").Scan(&id))
	code, out, errOut = run(b.cmd("demo", "--messages", "10")...)
	require.Equal(t, 2, code, out)
	require.Equal(t, "wharf: --schema "+b.schema+": it has active checkout or shipping flows, which the demo's flow runner would run: give an unused schema, or no --schema\n", errOut)
	require.Equal(t, "ready", b.flowStatus(t, id))
}

// requireDemoFlows checks the demo's flow step: three checkouts started in
// one transaction, awaiting, signalled and done; each printed with its
// three steps (reserve awaits, paid spawns, shipped is done), a time per
// step and its shipping children; 15 steps in all; and each checkout's
// "shipped" message delivered by the relay.
func requireDemoFlows(t *testing.T, out string) {
	t.Helper()
	require.Contains(t, out, "\n3. Flows: 3 checkouts await their payment, ship each item in a child flow, then emit \"shipped\"\n")
	require.Contains(t, out, "   start      checkout-1 (book, lamp), checkout-2 (pen), checkout-3 (cup, mug, plate): started in one transaction\n")
	require.Contains(t, out, "   awaiting   all 3 ran their first step and wait for the signal payment-captured\n")
	require.Contains(t, out, "   signal     payment-captured sent to each, in one transaction")
	require.Regexp(t, `(?m)^   done       all 3 done \S+ after the signal$`, out)
	dur := `\d[\d.]*(?:ns|µs|ms|s)`
	for _, c := range []struct {
		key, items, shipped string
		n                   int
	}{
		{"checkout-1", `"book","lamp"`, `2 shipping flows \(book done, lamp done\)`, 2},
		{"checkout-2", `"pen"`, `1 shipping flow \(pen done\)`, 1},
		{"checkout-3", `"cup","mug","plate"`, `3 shipping flows \(cup done, mug done, plate done\)`, 3},
	} {
		require.Regexp(t, `(?m)^   flow       `+c.key+`, instance \d+: 3 steps\n`+
			` {16}reserve  -> await  `+dur+`\n`+
			` {16}paid     -> spawn  `+dur+`\n`+
			` {16}shipped  -> done   `+dur+`\n`+
			` {16}children: `+c.shipped+`, one step each, longest `+dur+`$`, out)
		require.Regexp(t, `(?m)^   delivered  id [0-9a-f-]{36}  topic orders  key `+c.key+`  payload \{"items":\[`+c.items+`\],"order":"`+c.key+`","status":"shipped"\}$`, out)
	}
	require.Contains(t, out, "   steps      15 steps run, each outcome")
	flows := out[strings.Index(out, "3. Flows"):strings.Index(out, "4. Throughput")]
	require.Equal(t, 3, strings.Count(flows, "   delivered  "), "the relay delivers the three messages the flows emitted, once each")
}
