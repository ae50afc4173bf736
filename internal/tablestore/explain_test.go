package tablestore

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfmigrate"
)

const (
	explainSchema  = "wharf_explain"
	explainRows    = 1_000_000
	explainChunks  = 10
	explainKeys    = 1_000
	explainDeleted = 300_000
	explainBatch   = 4000
	explainPerLane = explainBatch / wharfmigrate.Lanes // 62
	explainOwner   = "explain-relay"
	explainDocPath = "testdata/plans.md" // generated; not a user page
	explainCommand = "WHARF_EXPLAIN=1 TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go test -run TestExplainHotPath -count=1 -v ./internal/tablestore"
)

// explainStatusSQL is the head probe of Client.Status (admin.go,
// statusOldestDue), with the schema written as {S} where admin.go
// concatenates `+sc+`. The test fails if admin.go no longer contains it, so
// the documented plan cannot go stale.
const explainStatusSQL = `SELECT l.lane, h.age, h.has_deliver_at
FROM generate_series(0, 63) AS l(lane)
CROSS JOIN LATERAL (
    SELECT extract(epoch FROM now() - o.created_at)::float8 AS age, o.deliver_at IS NOT NULL AS has_deliver_at
    FROM {S}.outbox o WHERE o.lane = l.lane ORDER BY o.id LIMIT 1) h`

type explainCase struct {
	title  string
	sql    string
	args   []any
	params string   // markdown: the arguments, in words
	setup  []string // run in the statement's transaction first (rolled back with it)
	outbox bool     // touches the outbox: check the plan
	bound  int      // most rows any outbox scan, Sort or Hash may handle
}

type explainResult struct {
	c          explainCase
	custom     string  // EXPLAIN (ANALYZE, BUFFERS, TIMING ON) with the arguments bound
	customMS   float64 // its Execution Time
	generic    string  // auto_explain of the statement itself under force_generic_plan
	genericMS  float64 // its duration
	autoChoice string  // the plan plan_cache_mode=auto used on the 6th execution
	maxRows    int64   // most rows through one outbox node, over both plans
	problems   []string
	warnings   []string // many buffers for few rows: dead index entries, typically
}

// TestExplainHotPath regenerates testdata/plans.md: EXPLAIN (ANALYZE, BUFFERS)
// plans of every hot-path statement on a 1,000,000-message backlog, and fails
// when a statement that touches the outbox scans it sequentially or pushes more
// than its batch through a scan, sort or hash. Building the backlog takes
// minutes on a small machine: it runs in the long run (WHARF_LONG_TESTS=1,
// CI) or with WHARF_EXPLAIN=1.
//
//	WHARF_EXPLAIN=1 TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go test -run TestExplainHotPath -count=1 -v ./internal/tablestore
//
// The connection must be a superuser's: the generic plans are captured with
// auto_explain (see explainLogged).
func TestExplainHotPath(t *testing.T) {
	t.Parallel()
	// The plans are checked on every run; WHARF_EXPLAIN=1 also rewrites
	// testdata/plans.md from them.
	writeDoc := os.Getenv("WHARF_EXPLAIN") == "1"
	url := os.Getenv("TEST_DATABASE_URL") // set by TestMain (internal/testdb)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	start := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }

	admin, err := os.ReadFile("../../admin.go")
	require.NoError(t, err)
	require.Contains(t, string(admin), strings.ReplaceAll(explainStatusSQL, "{S}", "`+sc+`"),
		"the status query in admin.go changed: update explainStatusSQL in explain_test.go")
	if !writeDoc {
		testtool.Long(t, "EXPLAIN ANALYZE of the hot path on a 1,000,000-message backlog (WHARF_EXPLAIN=1 runs it too)")
	}

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	// Test binaries running at once on one server take turns: the scratch
	// schema has a fixed name, as the document shows it.
	lock, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, "SELECT pg_advisory_lock(hashtext('wharf explain test'))")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lock.Close(context.Background()) }) // ends the lock
	_, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+explainSchema+" CASCADE")
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if _, err := pool.Exec(cctx, "DROP SCHEMA IF EXISTS "+explainSchema+" CASCADE"); err != nil {
			t.Logf("dropping %s: %v", explainSchema, err)
		}
		pool.Close()
	})
	m, err := wharfmigrate.New(explainSchema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	// Deterministic runs: no autovacuum/autoanalyze racing the load or the
	// plans. (The open transaction below would keep vacuum from removing the
	// deleted rows anyway.)
	_, err = pool.Exec(ctx, "ALTER TABLE "+explainSchema+".outbox SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	phase("migrated " + explainSchema)

	// ---- the backlog: 10 transactions of 100,000 rows ----
	chunk := explainRows / explainChunks
	chunkXids := make([]string, explainChunks)
	for c := 0; c < explainChunks; c++ {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&chunkXids[c]))
		_, err = tx.Exec(ctx, `INSERT INTO `+explainSchema+`.outbox (topic, key, payload)
SELECT 'orders', 'k' || (i % $3), convert_to(rpad('order ' || i || ' ', 200, '.'), 'UTF8')
FROM generate_series($1::bigint, $2::bigint) AS i`, c*chunk+1, (c+1)*chunk, explainKeys)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	var minID, maxID int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(id), max(id) FROM "+explainSchema+".outbox").Scan(&minID, &maxID))
	require.Equal(t, []int64{1, explainRows}, []int64{minID, maxID})
	phase("inserted 1,000,000 rows")
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+explainSchema+".outbox")
	require.NoError(t, err)
	phase("VACUUM ANALYZE")

	// Each lane's cursor: its highest id in the region about to be delivered.
	lanes := make([]int16, wharfmigrate.Lanes)
	cursors := make([]int64, wharfmigrate.Lanes)
	limits := make([]int32, wharfmigrate.Lanes)
	fences := make([]int64, wharfmigrate.Lanes)
	rows, err := pool.Query(ctx, "SELECT lane, max(id) FROM "+explainSchema+".outbox WHERE id <= $1 GROUP BY lane ORDER BY lane", explainDeleted)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		var lane int16
		var cur int64
		require.NoError(t, rows.Scan(&lane, &cur))
		require.Equal(t, int16(n), lane, "every lane holds keys")
		lanes[n], cursors[n], limits[n], fences[n] = lane, cur, explainPerLane, 1
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, wharfmigrate.Lanes, n)

	// A long-running application transaction: in progress during every plan.
	// Opened before the delete, it also keeps the deleted rows from being
	// removable (they stay RECENTLY_DEAD and their index entries unkilled).
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	var openXid string
	_, err = hold.Exec(ctx, `INSERT INTO `+explainSchema+`.outbox (topic, key, payload) VALUES ('orders', 'k0', convert_to(rpad('in progress', 200, '.'), 'UTF8'))`)
	require.NoError(t, err)
	require.NoError(t, hold.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&openXid))

	// Delivered: the first 300,000 ids, deleted and not vacuumed.
	tag, err := pool.Exec(ctx, "DELETE FROM "+explainSchema+".outbox WHERE id <= $1", explainDeleted)
	require.NoError(t, err)
	require.EqualValues(t, explainDeleted, tag.RowsAffected())
	// Statistics as autoanalyze would have them soon after (ANALYZE does not
	// prune or vacuum).
	_, err = pool.Exec(ctx, "ANALYZE "+explainSchema+".outbox")
	require.NoError(t, err)
	phase("deleted the first 300,000 ids (not vacuumed), open transaction xid " + openXid)

	_, err = pool.Exec(ctx, "INSERT INTO "+explainSchema+".relays (relay_id, lease_until) VALUES ($1, now() + interval '1 hour')", explainOwner)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+explainSchema+".lanes SET owner = $1, fence = 1", explainOwner)
	require.NoError(t, err)

	var prevXmax string
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&prevXmax))
	finishedXid := chunkXids[explainDeleted/chunk] // the first undelivered chunk, committed long ago
	deliveredXid := chunkXids[explainDeleted/chunk-1]
	prevXip := []string{openXid, finishedXid}

	// The next rows after the cursors: 4,000 to ack, 10 to retry, 10 to dead-letter.
	var nextLanes []int16
	var nextIDs []int64
	var nextAts []pgtype.TID // where the fetch read them
	var nextNonces []int64
	rows, err = pool.Query(ctx, "SELECT lane, id, ctid, nonce FROM "+explainSchema+".outbox WHERE id > $1 ORDER BY id LIMIT $2", explainDeleted, explainBatch+20)
	require.NoError(t, err)
	for rows.Next() {
		var lane int16
		var id int64
		var at pgtype.TID
		var nonce int64
		require.NoError(t, rows.Scan(&lane, &id, &at, &nonce))
		nextNonces = append(nextNonces, nonce)
		nextLanes = append(nextLanes, lane)
		nextIDs = append(nextIDs, id)
		nextAts = append(nextAts, at)
	}
	require.NoError(t, rows.Err())
	require.Len(t, nextIDs, explainBatch+20)
	retryLanes, retryIDs, retryNonces := nextLanes[explainBatch:explainBatch+10], nextIDs[explainBatch:explainBatch+10], nextNonces[explainBatch:explainBatch+10]
	deadLanes, deadIDs, deadNonces := nextLanes[explainBatch+10:], nextIDs[explainBatch+10:], nextNonces[explainBatch+10:]
	attempts := make([]int32, 10)
	nextAt := make([]time.Time, 10)
	errs := make([]string, 10)
	for i := range attempts {
		attempts[i] = 3
		nextAt[i] = time.Now().Add(time.Minute)
		errs[i] = "explain: sink unavailable"
	}

	shape := explainShape(ctx, t, pool, cursors, chunkXids, openXid, prevXmax)
	phase("backlog ready")

	// ---- the statements ----
	q := newQueries(explainSchema)
	fetchArgs := func(xip []string) []any { return []any{lanes, cursors, limits, prevXmax, xip} }
	loadLanes, loadIDs := nextLanes[:200], nextIDs[:200]
	claimSetup := []string{
		"INSERT INTO " + explainSchema + ".relays (relay_id, lease_until) VALUES ('explain-relay-gone', now() - interval '1 second')",
		"UPDATE " + explainSchema + ".lanes SET owner = 'explain-relay-gone' WHERE lane >= 32"}
	upperLanes := make([]int16, 0, 32)
	for l := int16(32); l < wharfmigrate.Lanes; l++ {
		upperLanes = append(upperLanes, l)
	}
	cases := []explainCase{
		{
			title: "fetch", sql: q.fetch, args: fetchArgs(prevXip), outbox: true, bound: explainBatch,
			params: fmt.Sprintf("all 64 lanes; cursors = each lane's highest delivered (deleted) id (%d..%d); "+
				"limits = %d per lane; prevXmax = `%s` (the current snapshot's xmax); "+
				"prevXip = `{%s (still in progress), %s (chunk 4, committed)}`.",
				minOf(cursors), maxOf(cursors), explainPerLane, prevXmax, openXid, finishedXid),
		},
		{
			title: "load", sql: q.load, outbox: true, bound: 200,
			args:   []any{loadLanes, loadIDs},
			params: fmt.Sprintf("200 held messages read again by (lane, id): ids %d..%d.", loadIDs[0], loadIDs[199]),
		},
		{
			title: "ack", sql: q.ack, outbox: true, bound: explainBatch,
			args: []any{lanes, fences, explainOwner, nextLanes[:explainBatch], nextIDs[:explainBatch], []int64{}, nextAts[:explainBatch], nextNonces[:explainBatch], []int64{}},
			params: fmt.Sprintf("64 lanes with fence 1, owner `%s`; deletes the %d rows after the cursors (ids %d..%d) "+
				"with their lanes and the ctids the fetch read them at; no retries to clear (`{}`). Rolled back.",
				explainOwner, explainBatch, nextIDs[0], nextIDs[explainBatch-1]),
		},
		{
			title: "retry", sql: q.retry, outbox: true, bound: 10,
			args: []any{lanes, fences, explainOwner, retryLanes, retryIDs, attempts, nextAt, errs, retryNonces},
			params: fmt.Sprintf("64 lanes with fence 1; 10 rows (ids %d..%d, each checked in the outbox with its nonce), attempts 3, next attempt in a minute. Rolled back.",
				retryIDs[0], retryIDs[9]),
		},
		{
			title: "dead", sql: q.dead, outbox: true, bound: 10,
			args: []any{lanes, fences, explainOwner, deadLanes, deadIDs, attempts, errs, deadNonces},
			params: fmt.Sprintf("64 lanes with fence 1; moves 10 rows (ids %d..%d) to dead_letters. Rolled back.",
				deadIDs[0], deadIDs[9]),
		},
		{
			title: "claim, lock", sql: q.claimLock, outbox: false, bound: 64,
			args:  []any{32},
			setup: claimSetup,
			params: "a second relay locks up to 32 candidate lanes; in the same transaction lanes 32..63 were first given " +
				"to a relay whose lease ran out, so it locks 32. Rolled back.",
		},
		{
			title: "claim, take", sql: q.claimTake, outbox: false, bound: 64,
			args:  []any{"explain-relay-2", upperLanes},
			setup: claimSetup,
			params: "the claim's second statement takes the 32 lanes (32..63) its first locked, whose owner's lease " +
				"ran out (set up as for claim, lock). Rolled back.",
		},
		{
			title: "renew", sql: q.renew, outbox: false, bound: 64,
			args:   []any{explainOwner},
			params: fmt.Sprintf("owner `%s` reads and locks its 64 lanes (its heartbeat extended their lease). Rolled back.", explainOwner),
		},
		{
			title: "status head probe (Client.Status)", sql: strings.ReplaceAll(explainStatusSQL, "{S}", explainSchema), outbox: true, bound: 64,
			params: "no arguments: one probe per lane. The statement is copied from admin.go (the test checks it still matches).",
		},
		{
			title: "fetch, stress variant: prevXip names an already delivered transaction", sql: q.fetch, outbox: true, bound: explainBatch,
			args: fetchArgs([]string{openXid, deliveredXid}),
			params: fmt.Sprintf("as fetch, but the finished xid in prevXip is %s (chunk 3), all of whose 100,000 rows "+
				"lie below the cursors and were deleted without vacuum. A relay does not get here in steady state "+
				"(a finished xid is in prevXip for one read only, and its rows are undelivered then); it shows what "+
				"the late-commit probe costs when its range is all dead index entries.", deliveredXid),
		},
	}

	ec := explainConnect(ctx, t, url)   // EXPLAIN and forced generic plans
	auto := explainConnect(ctx, t, url) // a fresh plan cache for plan_cache_mode=auto
	results := make([]explainResult, 0, len(cases))
	for _, c := range cases {
		r := explainResult{c: c}
		// Warm the cache (and set hint bits) so the plans show a relay's steady state.
		_, _, err = explainLogged(ctx, ec, c, "force_custom_plan", false)
		require.NoError(t, err, c.title)
		r.custom, err = explainCustom(ctx, ec.Conn, c)
		require.NoError(t, err, c.title)
		r.customMS = planFloat(t, reExecTime, r.custom)
		r.generic, r.genericMS, err = explainLogged(ctx, ec, c, "force_generic_plan", true)
		require.NoError(t, err, c.title)
		for i := 1; i <= 5; i++ {
			_, _, err = explainLogged(ctx, auto, c, "auto", false)
			require.NoError(t, err, c.title)
		}
		sixth, _, err := explainLogged(ctx, auto, c, "auto", true)
		require.NoError(t, err, c.title)
		switch planNormalize(sixth, false) {
		case planNormalize(r.generic, false):
			r.autoChoice = "generic"
		case planNormalize(r.custom, false):
			r.autoChoice = "custom"
		default:
			r.autoChoice = "unrecognised"
			t.Logf("%s: 6th execution under plan_cache_mode=auto matches neither plan:\n%s", c.title, sixth)
		}
		if c.outbox {
			for _, p := range []struct{ name, text string }{{"custom plan", r.custom}, {"generic plan", r.generic}} {
				probs, most := planCheck(p.text, c.bound)
				for _, pr := range probs {
					r.problems = append(r.problems, p.name+": "+pr)
				}
				r.maxRows = max(r.maxRows, most)
				if hitRead, _ := planOutboxBuffers(p.text); hitRead > int64(8*c.bound+1000) {
					r.warnings = append(r.warnings, fmt.Sprintf("%s touches %d outbox buffers for at most %d rows", p.name, hitRead, c.bound))
				}
			}
		}
		results = append(results, r)
		phase(fmt.Sprintf("%s: %.3f ms custom, %.3f ms generic, auto picks %s", c.title, r.customMS, r.genericMS, r.autoChoice))
	}

	doc := explainDoc(shape, results)
	require.NoError(t, os.MkdirAll("docs", 0o755))
	if writeDoc {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(explainDocPath, []byte(doc), 0o644))
		phase("wrote " + explainDocPath)
	}

	var bad []string
	for _, r := range results {
		for _, w := range r.warnings {
			t.Logf("%s: warning: %s", r.c.title, w)
		}
		if len(r.problems) > 0 {
			bad = append(bad, fmt.Sprintf("== %s ==\n%s\n\ncustom plan:\n%s\n\ngeneric plan:\n%s",
				r.c.title, strings.Join(r.problems, "\n"), r.custom, r.generic))
		}
	}
	if len(bad) > 0 {
		require.Failf(t, "bad plans (see "+explainDocPath+")", "%s", strings.Join(bad, "\n\n"))
	}
}

// noticeConn is a connection whose notices (auto_explain's LOG messages) are kept.
type noticeConn struct {
	*pgx.Conn
	mu      sync.Mutex
	notices []string
}

func (nc *noticeConn) take() []string {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	n := nc.notices
	nc.notices = nil
	return n
}

func explainConnect(ctx context.Context, t *testing.T, url string) *noticeConn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	// The relay's transactions run with JIT and bitmap scans off
	// (hotPathSettings in tablestore.go). Explain under the same settings.
	cfg.RuntimeParams["jit"] = "off"
	cfg.RuntimeParams["enable_bitmapscan"] = "off"
	nc := &noticeConn{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		nc.mu.Lock()
		nc.notices = append(nc.notices, n.Message)
		nc.mu.Unlock()
	}
	nc.Conn, err = pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close(context.Background()) })
	_, err = nc.Exec(ctx, "LOAD 'auto_explain'")
	require.NoError(t, err, "loading auto_explain (needs a superuser connection)")
	return nc
}

// explainCustom runs EXPLAIN (ANALYZE, BUFFERS) on the statement with its
// arguments bound, in a transaction it rolls back. PostgreSQL plans an EXPLAIN
// with the bound values as constants whatever plan_cache_mode says, so this is
// always the custom plan.
func explainCustom(ctx context.Context, conn *pgx.Conn, c explainCase) (string, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range c.setup {
		if _, err := tx.Exec(ctx, s); err != nil {
			return "", err
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, TIMING ON) "+c.sql, c.args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	return strings.Join(lines, "\n"), nil
}

// explainLogged executes the statement itself as the relay does (pgx prepares
// it), in a transaction it rolls back, with plan_cache_mode set to mode. With
// logPlan, auto_explain sends the executed plan (analyzed, with buffers) to the
// client as a LOG notice, and it is returned with its duration in ms.
func explainLogged(ctx context.Context, nc *noticeConn, c explainCase, mode string, logPlan bool) (string, float64, error) {
	tx, err := nc.Begin(ctx)
	if err != nil {
		return "", 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range c.setup {
		if _, err := tx.Exec(ctx, s); err != nil {
			return "", 0, err
		}
	}
	sets := []string{"SET LOCAL plan_cache_mode = " + mode}
	if logPlan {
		sets = append(sets,
			"SET LOCAL auto_explain.log_min_duration = 0",
			"SET LOCAL auto_explain.log_analyze = on",
			"SET LOCAL auto_explain.log_buffers = on",
			"SET LOCAL auto_explain.log_timing = on",
			"SET LOCAL auto_explain.log_format = text",
			"SET LOCAL auto_explain.log_nested_statements = off",
			"SET LOCAL client_min_messages = log")
	}
	for _, s := range sets {
		if _, err := tx.Exec(ctx, s); err != nil {
			return "", 0, err
		}
	}
	nc.take()
	rows, err := tx.Query(ctx, c.sql, c.args...)
	if err != nil {
		return "", 0, err
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", 0, err
	}
	// A SELECT's executor ends when its portal is dropped: by the rollback at
	// the latest.
	if err := tx.Rollback(ctx); err != nil {
		return "", 0, err
	}
	if !logPlan {
		return "", 0, nil
	}
	prefix := "Query Text: " + c.sql + "\n"
	for _, n := range nc.take() {
		m := reDuration.FindStringSubmatch(n)
		if m == nil || !strings.Contains(n, prefix) {
			continue
		}
		ms, _ := strconv.ParseFloat(m[1], 64)
		return strings.TrimRight(n[strings.Index(n, prefix)+len(prefix):], "\n"), ms, nil
	}
	return "", 0, fmt.Errorf("no auto_explain output for %s", c.title)
}

var (
	reExecTime = regexp.MustCompile(`(?m)^Execution Time: ([0-9.]+) ms`)
	reDuration = regexp.MustCompile(`^duration: ([0-9.]+) ms\s+plan:`)
	reActual   = regexp.MustCompile(`\(actual time=[0-9.]+\.\.[0-9.]+ rows=([0-9]+) loops=([0-9]+)\)`)
	reRemoved  = regexp.MustCompile(`^Rows Removed by (?:Filter|Index Recheck|Join Filter): ([0-9]+)`)
	reCost     = regexp.MustCompile(`\s*\((?:cost|actual)[^)]*\)|\s*\(never executed\)`)
	reBuffers  = regexp.MustCompile(`^Buffers: (.*)$`)
	reJIT      = regexp.MustCompile(`(?m)^\s*Timing: Generation .* Total ([0-9.]+) ms`)
)

func planFloat(t *testing.T, re *regexp.Regexp, plan string) float64 {
	t.Helper()
	m := re.FindStringSubmatch(plan)
	require.NotNil(t, m, "no %s in\n%s", re, plan)
	f, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return f
}

type planNode struct {
	header  string // "Index Scan using outbox_lane_id on outbox o"
	rows    int64  // per loop
	loops   int64
	removed int64 // per loop
}

func planNodes(plan string) []*planNode {
	var nodes []*planNode
	for _, line := range strings.Split(plan, "\n") {
		s := strings.TrimPrefix(strings.TrimSpace(line), "->  ")
		if i := strings.Index(s, "  (cost="); i >= 0 {
			n := &planNode{header: s[:i]}
			if m := reActual.FindStringSubmatch(s); m != nil {
				n.rows, _ = strconv.ParseInt(m[1], 10, 64)
				n.loops, _ = strconv.ParseInt(m[2], 10, 64)
			}
			nodes = append(nodes, n)
			continue
		}
		if m := reRemoved.FindStringSubmatch(s); m != nil && len(nodes) > 0 {
			r, _ := strconv.ParseInt(m[1], 10, 64)
			nodes[len(nodes)-1].removed += r
		}
	}
	return nodes
}

// reOutbox matches a node that reads or writes the outbox table itself (not
// "Bitmap Index Scan on outbox_lane_xid").
var reOutbox = regexp.MustCompile(` on outbox(?: |$)`)

// planCheck reports a sequential scan of the outbox, and any outbox scan that
// handles more than bound rows (counting rows a filter discarded), or Sort or
// Hash over more than bound rows (or the 64 lanes). It also returns the most
// rows through one outbox node.
func planCheck(plan string, bound int) (problems []string, most int64) {
	sortBound := int64(max(bound, wharfmigrate.Lanes))
	for _, n := range planNodes(plan) {
		total := (n.rows + n.removed) * n.loops
		onOutbox := reOutbox.MatchString(n.header)
		if onOutbox {
			most = max(most, total)
		}
		switch {
		case strings.Contains(n.header, "Seq Scan on outbox"):
			problems = append(problems, fmt.Sprintf("%s (%d rows)", n.header, total))
		case onOutbox && total > int64(bound):
			problems = append(problems, fmt.Sprintf("%s handles %d rows, more than the batch (%d)", n.header, total, bound))
		case (strings.HasPrefix(n.header, "Sort") || strings.HasPrefix(n.header, "Incremental Sort") || n.header == "Hash") && total > sortBound:
			problems = append(problems, fmt.Sprintf("%s over %d rows, more than the batch (%d)", n.header, total, sortBound))
		}
	}
	return problems, most
}

// planOutboxBuffers sums the Buffers lines of the outermost outbox nodes (an
// outbox node's count includes its children's): shared hit+read, and the
// line's parts added up ("hit=.. read=.. dirtied=..").
func planOutboxBuffers(plan string) (hitRead int64, detail string) {
	type frame struct {
		indent int
		outbox bool
	}
	var stack []frame
	counting := false // the current node is an outermost outbox node
	sums := map[string]int64{}
	for _, line := range strings.Split(plan, "\n") {
		s := strings.TrimSpace(line)
		if strings.Contains(s, "(cost=") {
			indent := len(line) - len(strings.TrimLeft(line, " "))
			for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
				stack = stack[:len(stack)-1]
			}
			nested := false
			for _, f := range stack {
				nested = nested || f.outbox
			}
			isOutbox := reOutbox.MatchString(strings.SplitN(s, "  (cost=", 2)[0])
			counting = isOutbox && !nested
			stack = append(stack, frame{indent, isOutbox})
			continue
		}
		m := reBuffers.FindStringSubmatch(s)
		if m == nil || !counting {
			continue
		}
		counting = false // the node's first Buffers line; later ones are planning or children
		for _, kv := range strings.Fields(m[1]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSuffix(v, ","), 10, 64)
			if err != nil {
				continue
			}
			sums[k] += n
		}
	}
	var parts []string
	for _, k := range []string{"hit", "read", "dirtied", "written"} {
		if sums[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, sums[k]))
		}
	}
	if len(parts) == 0 {
		return 0, "none"
	}
	return sums["hit"] + sums["read"], strings.Join(parts, " ")
}

// planJIT is the JIT total time in ms, or 0 when the plan was not compiled.
func planJIT(plan string) float64 {
	m := reJIT.FindStringSubmatch(plan)
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	return f
}

// planNormalize drops timings, costs, row counts and per-run counters. With
// shapeOnly it keeps node headers only; otherwise conditions stay too, which
// tells a generic plan ($n) from a custom one (constants).
func planNormalize(plan string, shapeOnly bool) string {
	var out []string
	for _, line := range strings.Split(plan, "\n") {
		s := strings.TrimSpace(line)
		isNode := strings.Contains(s, "(cost=")
		skip := s == ""
		for _, p := range []string{"Planning", "Execution Time", "Buffers:", "Rows Removed", "Heap Fetches", "Heap Blocks",
			"Sort Method", "Memory Usage", "Batches", "Buckets", "I/O Timings", "JIT", "Functions:", "Options:", "Timing:",
			"Worker", "Trigger", "Tuples Inserted", "Conflicting Tuples"} {
			skip = skip || strings.HasPrefix(s, p)
		}
		if skip || (shapeOnly && !isNode) {
			continue
		}
		out = append(out, reCost.ReplaceAllString(line, ""))
	}
	return strings.Join(out, "\n")
}

type explainBacklog struct {
	version, settings                  string
	live, dead, reltuples              int64
	tableSize, laneIDSize, laneXidSize string
	laneMin, laneMax                   int64
	cursorMin, cursorMax               int64
	chunkXids                          []string
	openXid, prevXmax                  string
}

func explainShape(ctx context.Context, t *testing.T, pool *pgxpool.Pool, cursors []int64, chunkXids []string, openXid, prevXmax string) explainBacklog {
	t.Helper()
	s := explainBacklog{cursorMin: minOf(cursors), cursorMax: maxOf(cursors), chunkXids: chunkXids, openXid: openXid, prevXmax: prevXmax}
	sc := explainSchema
	require.NoError(t, pool.QueryRow(ctx, "SHOW server_version").Scan(&s.version))
	require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(name || ' = ' || setting || coalesce(unit, ''), ', ' ORDER BY name)
FROM pg_settings WHERE name IN ('shared_buffers', 'work_mem', 'random_page_cost', 'effective_cache_size', 'jit', 'max_parallel_workers_per_gather')`).Scan(&s.settings))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), min(c), max(c) FROM (SELECT count(*) AS c FROM `+sc+`.outbox GROUP BY lane) x`).Scan(new(int64), &s.laneMin, &s.laneMax))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+sc+`.outbox`).Scan(&s.live))
	_, _ = pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, pool.QueryRow(ctx, `SELECT n_dead_tup, (SELECT reltuples::bigint FROM pg_class WHERE oid = '`+sc+`.outbox'::regclass)
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'`, sc).Scan(&s.dead, &s.reltuples))
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_table_size('`+sc+`.outbox')),
    pg_size_pretty(pg_relation_size('`+sc+`.outbox_lane_id')), pg_size_pretty(pg_relation_size('`+sc+`.outbox_lane_xid'))`).Scan(&s.tableSize, &s.laneIDSize, &s.laneXidSize))
	return s
}

func explainDoc(s explainBacklog, results []explainResult) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Hot-path query plans on a 1,000,000-message backlog\n\n")
	w("Generated by `TestExplainHotPath` (internal/tablestore/explain_test.go); do not edit by hand. It was produced with\n"+
		"`%s`, which migrates a scratch schema `%s`, loads the backlog described below, runs each statement "+
		"Wharf's relay and `Client.Status` run with realistic arguments, writes this file and drops the schema. "+
		"Each statement is shown twice: `EXPLAIN (ANALYZE, BUFFERS, TIMING ON)` with the arguments bound through pgx "+
		"(PostgreSQL plans an EXPLAIN with bound values as constants, so this is the **custom plan**), and the "+
		"**generic plan** of the statement itself, executed as pgx prepares it under `plan_cache_mode = force_generic_plan` "+
		"and captured with `auto_explain` (`log_analyze`, `log_buffers`; the time is auto_explain's duration). "+
		"It also executes each statement 6 times on a fresh connection under `plan_cache_mode = auto` and records which "+
		"plan the 6th execution used: that is the plan a relay runs once pgx's prepared statement is warm. "+
		"Each statement runs once before it is explained (warm cache, hint bits set); writes run in transactions that are rolled back. Times vary from run to run; the plan shapes and buffer counts are the point. "+
		"The test fails if any statement touching the outbox has a `Seq Scan on outbox`, or an outbox scan, Sort or Hash handling more rows than its batch.\n\n",
		explainCommand, explainSchema)
	w("PostgreSQL **%s** (%s), on a 2-core machine.\n\n", s.version, s.settings)
	w("## Backlog\n\n")
	w("- 1,000,000 messages inserted in 10 transactions of 100,000 (`INSERT ... SELECT FROM generate_series`), so rows carry 10 distinct xids: %s.\n", strings.Join(s.chunkXids, ", "))
	w("- topic `orders`, 1,000 keys (`'k' || (i %% 1000)`), 200-byte payloads, no headers; then `VACUUM ANALYZE`.\n")
	w("- Delivered: ids 1..300,000 deleted in one committed transaction and **not vacuumed** (autovacuum is off on the scratch table; "+
		"the open transaction below would keep vacuum from removing them anyway); then `ANALYZE`, as autoanalyze would. "+
		"Live rows: %d; `n_dead_tup` = %d; `reltuples` = %d.\n", s.live, s.dead, s.reltuples)
	w("- Live rows per lane: %d..%d. Cursors (each lane's highest deleted id): %d..%d.\n", s.laneMin, s.laneMax, s.cursorMin, s.cursorMax)
	w("- A long-running application transaction (xid %s) that inserted one row stays open on another connection during every plan; "+
		"it was opened before the delete, so the deleted rows are RECENTLY_DEAD: index scans cannot mark their entries dead.\n", s.openXid)
	w("- All 64 lanes leased to `%s` with fence 1, lease one hour. `prevXmax` = %s (the snapshot xmax after loading).\n", explainOwner, s.prevXmax)
	w("- Sizes: outbox %s, `outbox_lane_id` %s, `outbox_lane_xid` %s.\n\n", s.tableSize, s.laneIDSize, s.laneXidSize)

	w("## Summary\n\n| statement | custom plan | generic plan | auto (6th run) | Seq Scan on outbox | most rows through an outbox node | outbox buffers (custom / generic) |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		seq, most, bufs := "n/a", "n/a", "n/a"
		if r.c.outbox {
			seq = "none"
			if strings.Contains(r.custom+r.generic, "Seq Scan on outbox") {
				seq = "**yes**"
			}
			most = fmt.Sprintf("%d (bound %d)", r.maxRows, r.c.bound)
			c, _ := planOutboxBuffers(r.custom)
			g, _ := planOutboxBuffers(r.generic)
			bufs = fmt.Sprintf("%d / %d", c, g)
		}
		w("| %s | %.3f ms | %.3f ms | %s | %s | %s | %s |\n", r.c.title, r.customMS, r.genericMS, r.autoChoice, seq, most, bufs)
	}
	w("\nOutbox buffers: shared hit + read summed over the outermost nodes that read or write the outbox.\n\n")

	for i, r := range results {
		w("## %d. %s\n\n", i+1, r.c.title)
		w("Arguments: %s\n\n", r.c.params)
		if len(r.c.setup) > 0 {
			w("Run first in the same transaction: `%s`.\n\n", strings.Join(r.c.setup, "; "))
		}
		w("```sql\n%s\n```\n\n", r.c.sql)
		same := "same shape as the custom plan"
		if planNormalize(r.custom, true) != planNormalize(r.generic, true) {
			same = "**differs** from the custom plan"
		}
		w("**Summary:** execution %.3f ms (custom), %.3f ms (generic, %s); `plan_cache_mode = auto` runs the %s plan from the 6th execution",
			r.customMS, r.genericMS, same, r.autoChoice)
		if r.c.outbox {
			seq := "no `Seq Scan on outbox`"
			if strings.Contains(r.custom+r.generic, "Seq Scan on outbox") {
				seq = "**`Seq Scan on outbox`**"
			}
			_, cb := planOutboxBuffers(r.custom)
			_, gb := planOutboxBuffers(r.generic)
			w("; %s; at most %d rows through one outbox node (bound %d); outbox buffers: custom `%s`, generic `%s`", seq, r.maxRows, r.c.bound, cb, gb)
		} else {
			w("; does not touch the outbox")
		}
		if j := max(planJIT(r.custom), planJIT(r.generic)); j > 0 {
			w("; JIT compiled (%.1f ms custom, %.1f ms generic)", planJIT(r.custom), planJIT(r.generic))
		}
		w(".")
		if len(r.problems) > 0 {
			w(" **Problems:** %s.", strings.Join(r.problems, "; "))
		}
		if len(r.warnings) > 0 {
			w(" **Warning:** %s.", strings.Join(r.warnings, "; "))
		}
		w("\n\nCustom plan (`EXPLAIN (ANALYZE, BUFFERS, TIMING ON)`):\n\n```text\n%s\n```\n\n", r.custom)
		w("Generic plan (auto_explain, `plan_cache_mode = force_generic_plan`, duration %.3f ms):\n\n```text\n%s\n```\n\n", r.genericMS, r.generic)
	}
	return b.String()
}

func minOf(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// On an outbox no ANALYZE has seen yet (a new schema filling up before
// autovacuum's first ANALYZE), the planner guesses that xid >= prev_xmax
// matches a third of the table. The fetch's late-commit parts must stay
// per-lane index probes anyway: flattened, the first one became a sequential
// scan of the whole outbox on every fetch.
func TestFetchPlanWithoutStatistics(t *testing.T) {
	t.Parallel()
	pool, schema := oneTransactionOutbox(t, "wp", 40000)
	plan := explainFetch(t, pool, schema, 20000, nil)
	require.NotContains(t, plan, "Seq Scan on outbox", "the fetch reads the whole outbox:\n%s", plan)
}

// An outbox filled by one large transaction (a backfill, a COPY) has a
// single xid in ANALYZE's sample. The planner must still read the rows of a
// finished transaction through (lane, xid, id): with the statistics taken at
// face value, every row matches xid = fin.x, and the fetch scanned each lane
// below its cursor instead (687,982 heap blocks, 1.6-4 s per fetch, while any
// other transaction was in progress at the previous read: a second relay's
// lease round was enough to halve a 1M drain).
func TestFetchPlanAfterOneLargeTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := oneTransactionOutbox(t, "wp1", 100000)
	_, err := pool.Exec(ctx, "ANALYZE "+schema+".outbox")
	require.NoError(t, err)
	// Another transaction, in progress at the previous read, finished since.
	var other string
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&other))
	plan := explainFetch(t, pool, schema, 90000, []string{other})
	require.Regexp(t, `Index Cond: \(\(\(lane\)::integer = \(\w+\.lane\)::integer\) AND \(xid = fin\.x\)`, plan,
		"the rows of a finished transaction are not read through (lane, xid, id):\n%s", plan)
}

// The relay's connections keep the fetch as a prepared statement, and after
// five runs PostgreSQL may plan it once for any parameters. Autovacuum's
// ANALYZE of a queue table runs while it is nearly empty or empty, and with
// what it saw, scanning each lane below its cursor through (lane, id) looked
// as cheap as reading only the rows written since the previous read through
// (lane, xid, id), and a bitmap scan of the whole lane above the cursor,
// sorted, as cheap as reading the first rows in order. Below the cursor lie
// the delivered rows vacuum has not removed yet, above it the backlog: in the
// bench at 100-115k msg/s such plans took 3-25 ms per fetch instead of under
// 1, and the relay fell behind for good. The plan must stay on the right
// index, in order, whatever the statistics.
func TestFetchPlanGenericAfterAnalyzeOfANearlyEmptyOutbox(t *testing.T) {
	t.Parallel()
	for _, analyzedAt := range []int64{200, 0} { // rows left when ANALYZE ran
		t.Run(fmt.Sprintf("analyzed_with_%d_rows", analyzedAt), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, schema := scratchOutbox(t, "wp2")
			exec := func(sql string, args ...any) {
				t.Helper()
				_, err := pool.Exec(ctx, sql, args...)
				require.NoError(t, err)
			}
			exec("ALTER TABLE " + schema + ".outbox SET (autovacuum_enabled = off)")
			fill := `INSERT INTO ` + schema + `.outbox (topic, key, payload)
SELECT 'orders', 'k' || (i / 10), convert_to(rpad('order ' || i, 200, '.'), 'UTF8') FROM generate_series(1, $1::int) AS i`
			var top int64
			load := func(txs int) {
				t.Helper()
				for i := 0; i < txs; i++ {
					exec(fill, 1000)
				}
				require.NoError(t, pool.QueryRow(ctx, "SELECT max(id) FROM "+schema+".outbox").Scan(&top))
			}
			// Autovacuum's turn, when the relay had delivered all but the
			// last few rows.
			load(100)
			exec("DELETE FROM "+schema+".outbox WHERE id <= $1", top-analyzedAt)
			exec("VACUUM (ANALYZE) " + schema + ".outbox")
			// Then delivered and removed, not vacuumed yet, with a backlog
			// above the cursors.
			load(100)
			exec("DELETE FROM "+schema+".outbox WHERE id <= $1", top-3000)

			plan := explainGenericFetch(t, pool, schema, top-2000)
			require.NotRegexp(t, `Index Cond: \(\(lane = \w+\.lane\) AND \(id <= \w+\.cur\)\)|Index Cond: \(id <= `, plan,
				"a late-commit part scans the rows below the cursors:\n%s", plan)
			require.Regexp(t, `Index Cond: \(\(\(lane\)::integer = \(\w+\.lane\)::integer\) AND \(xid >= `, plan,
				"the rows started since the previous read are not read through (lane, xid, id):\n%s", plan)
			require.Regexp(t, `Index Cond: \(\(\(lane\)::integer = \(\w+\.lane\)::integer\) AND \(xid = fin\.x\)`, plan,
				"the rows of a finished transaction are not read through (lane, xid, id):\n%s", plan)
			require.NotContains(t, plan, "Sort", "the forward read sorts the lane's backlog above the cursor:\n%s", plan)
		})
	}
}

// oneTransactionOutbox is a scratch outbox, never vacuumed or analyzed by
// autovacuum, holding n rows inserted by one transaction.
func oneTransactionOutbox(t *testing.T, prefix string, n int) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, prefix)
	_, err := pool.Exec(ctx, "ALTER TABLE "+schema+".outbox SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.outbox (topic, key, payload)
SELECT 'orders', 'k' || (i % 800), convert_to(rpad('order ' || i, 200, '.'), 'UTF8') FROM generate_series(1, $1::int) AS i`, n)
	require.NoError(t, err)
	return pool, schema
}

// explainFetch returns the fetch's plan with every lane's cursor at cursor,
// the previous read's xmax the current one and xip its in-progress xids.
func explainFetch(t *testing.T, pool *pgxpool.Pool, schema string, cursor int64, xip []string) string {
	t.Helper()
	ctx := context.Background()
	var xmax string
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&xmax))
	lanes := make([]int16, wharfmigrate.Lanes)
	cursors := make([]int64, wharfmigrate.Lanes)
	limits := make([]int32, wharfmigrate.Lanes)
	for i := range lanes {
		lanes[i], cursors[i], limits[i] = int16(i), cursor, explainPerLane
	}
	if xip == nil {
		xip = []string{}
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, fetchSettings)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN "+newQueries(schema).fetch, lanes, cursors, limits, xmax, xip)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// explainGenericFetch returns the plan PostgreSQL makes of the fetch once for
// any parameters (a prepared statement's generic plan), run with every
// lane's cursor at cursor and the previous read's xmax the current one.
func explainGenericFetch(t *testing.T, pool *pgxpool.Pool, schema string, cursor int64) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var xmax string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&xmax))
	for _, sql := range []string{
		"SET plan_cache_mode = force_generic_plan",
		"SET jit = off", // hotPathSettings, for the session
		"SET enable_bitmapscan = off",
		"SET enable_seqscan = off", // fetchSettings
		"PREPARE generic_fetch(smallint[], bigint[], int[], text, text[]) AS " + newQueries(schema).fetch,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	lanes, cursors, limits := make([]string, wharfmigrate.Lanes), make([]string, wharfmigrate.Lanes), make([]string, wharfmigrate.Lanes)
	for i := range lanes {
		lanes[i], cursors[i], limits[i] = fmt.Sprint(i), fmt.Sprint(cursor), fmt.Sprint(explainPerLane)
	}
	rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN EXECUTE generic_fetch('{%s}', '{%s}', '{%s}', '%s', '{}')",
		strings.Join(lanes, ","), strings.Join(cursors, ","), strings.Join(limits, ","), xmax))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "DEALLOCATE generic_fetch; RESET plan_cache_mode; RESET jit; RESET enable_bitmapscan; RESET enable_seqscan")
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// A backlog of one key lies in one lane: a WAL outbox's held key moved to
// the table (spilled), or one hot key of a table outbox. ANALYZE then sees a
// single lane, so lane::integer = l.lane matches every row for the generic
// plan, and xid >= $4 a third of them: reading part 2 through
// (lane, xid, id) looked dearer than a sequential scan of the outbox, run once
// per lane of the fetch (64 scans of the whole backlog, 175 ms per fetch for
// 6,000 rows on an idle machine). A relay that took such a backlog over
// delivered it at three rows a fetch and about ten messages a second under
// load. The fetch must read the outbox through its indexes whatever the
// statistics.
func TestFetchPlanGenericAfterAnalyzeOfOneKeysBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "wp3")
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec("ALTER TABLE " + schema + ".outbox SET (autovacuum_enabled = off)")
	for i := 0; i < 50; i++ {
		exec(`INSERT INTO ` + schema + `.outbox (topic, key, payload) SELECT 't', 'held', 'x' FROM generate_series(1, 200)`)
	}
	var lane int16
	var low int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT lane, min(id) FROM "+schema+".outbox GROUP BY lane").Scan(&lane, &low))
	exec("DELETE FROM "+schema+".outbox WHERE id < $1", low+4000) // delivered, not vacuumed yet
	exec("ANALYZE " + schema + ".outbox")

	plan := explainGenericFetch(t, pool, schema, low+4000)
	require.NotContains(t, plan, "Seq Scan on outbox", "the fetch scans the whole outbox once per lane:\n%s", plan)
	require.Regexp(t, `Index Cond: \(\(\(lane\)::integer = \(\w+\.lane\)::integer\) AND \(xid >= `, plan,
		"the rows started since the previous read are not read through (lane, xid, id):\n%s", plan)
}

// A relay's first fetch knows no earlier snapshot ($4 is 0), so part 2
// (rows that committed late below the cursor) matches every row of a lane by
// xid. A lane whose cursor is 0 has no row below it: that part is not run for
// it at all (its one-time filter), instead of reading the lane's whole backlog
// to keep none of it (0.6 s for a fresh relay's first fetch over 300k rows).
func TestFirstFetchDoesNotReadTheBacklogForLanesAtZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "wp4")
	_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox (topic, key, payload) SELECT 't', 'k' || (i % 50), 'x' FROM generate_series(1, 3000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE "+schema+".outbox")
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "PREPARE first_fetch(smallint[], bigint[], int[], text, text[]) AS "+newQueries(schema).fetch)
	require.NoError(t, err)
	lanes, cursors, limits := make([]string, wharfmigrate.Lanes), make([]string, wharfmigrate.Lanes), make([]string, wharfmigrate.Lanes)
	for i := range lanes {
		lanes[i], cursors[i], limits[i] = fmt.Sprint(i), "0", "10"
	}
	rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE first_fetch('{%s}', '{%s}', '{%s}', '0', '{}')",
		strings.Join(lanes, ","), strings.Join(cursors, ","), strings.Join(limits, ",")))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	// Every scan of the outbox by xid is gated off: none ran.
	var xidScans int
	for i, line := range lines {
		if strings.Contains(line, "xid >= ") {
			xidScans++
			node := line
			for j := i; j >= 0 && !strings.Contains(lines[j], "->"); j-- {
				node = lines[j-1]
			}
			require.Contains(t, node, "never executed", "the late-commit part read the lanes' backlog on a first fetch:\n%s", plan)
		}
	}
	require.NotZero(t, xidScans, "no late-commit part in the plan:\n%s", plan)
}
