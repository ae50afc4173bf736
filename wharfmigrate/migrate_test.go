package wharfmigrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }

func setup(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "wm_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	return pool, schema
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&ok))
	return ok
}

func TestUpStatusCheckDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)

	require.ErrorIs(t, m.Check(ctx, pool), wharfmigrate.ErrNotMigrated)
	st, err := m.Status(ctx, pool)
	require.NoError(t, err)
	require.Len(t, st, m.Latest())
	require.True(t, st[0].AppliedAt.IsZero())

	done, err := m.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}, done)
	require.NoError(t, m.Check(ctx, pool))
	again, err := m.Up(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, again, "up is idempotent")
	st, err = m.Status(ctx, pool)
	require.NoError(t, err)
	require.False(t, st[0].AppliedAt.IsZero())

	var lanes int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".lanes").Scan(&lanes))
	require.Equal(t, wharfmigrate.Lanes, lanes)

	down, err := m.Down(ctx, pool, 1)
	require.NoError(t, err)
	require.Equal(t, []int{9}, down, "down 1 reverts one step, not all")
	require.ErrorIs(t, m.Check(ctx, pool), wharfmigrate.ErrNotMigrated)
	down, err = m.Down(ctx, pool, 1)
	require.NoError(t, err)
	require.Equal(t, []int{8}, down)
	// Reverting 8 gives start_flows and signal_flows back the caller's
	// rights, and PUBLIC its EXECUTE; 8 again takes them.
	definer := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace
AND proname IN ('start_flows', 'signal_flows') AND prosecdef AND NOT has_function_privilege('public', oid, 'EXECUTE')`, schema).Scan(&n))
		return n
	}
	require.Zero(t, definer())
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, 2, definer())
	_, err = m.DownTo(ctx, pool, 10)
	require.ErrorContains(t, err, "target version 10 is outside 0..9")
	down, err = m.DownTo(ctx, pool, 1)
	require.NoError(t, err)
	require.Equal(t, []int{9, 8, 7, 6, 5, 4, 3, 2}, down)
	down, err = m.Down(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, []int{1}, down)
	require.False(t, schemaExists(t, pool, schema), "down removes the schema it created")
	require.ErrorIs(t, m.Check(ctx, pool), wharfmigrate.ErrNotMigrated)
}

// Down never drops a schema that holds someone else's tables.
func TestDownKeepsForeignObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE "+schema+".app_table (x int)")
	require.NoError(t, err)
	_, err = m.Down(ctx, pool, 0)
	require.NoError(t, err)
	require.True(t, schemaExists(t, pool, schema))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".app_table").Scan(&n))
}

// Migrators racing on one schema apply each migration once.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	applied := make([][]int, 4)
	var g errgroup.Group
	for i := range applied {
		g.Go(func() error {
			var err error
			applied[i], err = m.Up(ctx, pool)
			return err
		})
	}
	require.NoError(t, g.Wait())
	total := 0
	for _, a := range applied {
		total += len(a)
	}
	require.Equal(t, m.Latest(), total)
	require.NoError(t, m.Check(ctx, pool))
}

// The printed SQL, applied by hand, gives a schema wharf accepts, and the
// printed down SQL removes it.
func TestPrintedSQLApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, m.SQL(true))
	require.NoError(t, err)
	require.NoError(t, m.Check(ctx, pool))
	_, err = pool.Exec(ctx, m.SQL(false))
	require.NoError(t, err)
	require.ErrorIs(t, m.Check(ctx, pool), wharfmigrate.ErrNotMigrated)
}

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"wharf", "_x", "a1_b2", "s" + string(make([]byte, 0))} {
		require.NoError(t, wharfmigrate.ValidateSchema(ok), ok)
	}
	for _, bad := range []string{"", "Wharf", "1abc", "a-b", "a b", "a;drop", "pg_catalog", `"quoted"`, "x" + fmt.Sprintf("%063d", 0)} {
		require.Error(t, wharfmigrate.ValidateSchema(bad), bad)
	}
	_, err := wharfmigrate.New("Bad")
	require.ErrorContains(t, err, `invalid schema name "Bad"`)
}

// DownToIfEmpty refuses while the outbox or the dead letters hold rows (and
// changes nothing), plans and versions are reported without changing
// anything, and an empty outbox goes down.
func TestDownToIfEmptyRefusesWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	v, err := m.Version(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, v, "no version table yet")
	msgs, dead, err := m.Contents(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, msgs+dead)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)

	_, err = pool.Exec(ctx, "SELECT "+schema+".enqueue('t', 'k', '1') FROM generate_series(1, 1002)")
	require.NoError(t, err)
	_, err = m.DownToIfEmpty(ctx, pool, 1)
	require.ErrorIs(t, err, wharfmigrate.ErrNotEmpty)
	require.ErrorContains(t, err, "holds more than 1000 pending messages and 0 dead letters")
	v, err = m.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, 9, v, "a refused down changes nothing, not even the reverts that keep messages")
	// Reverting only migrations that keep messages is not refused.
	done, err := m.DownToIfEmpty(ctx, pool, 2)
	require.NoError(t, err)
	require.Equal(t, []int{9, 8, 7, 6, 5, 4, 3}, done)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
	require.Equal(t, 1002, n)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)

	applied, plan, err := m.PlanDownTo(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, 9, applied)
	require.Len(t, plan, 9)
	for i, v := range []int{9, 8, 7, 6, 5, 4, 3, 2, 1} {
		require.Equal(t, v, plan[i].Version)
	}
	require.True(t, plan[0].KeepsMessages, "reverting 9 keeps messages")
	require.True(t, plan[1].KeepsMessages, "reverting 8 keeps messages")
	require.True(t, plan[2].KeepsMessages, "reverting 7 keeps messages")
	require.True(t, plan[3].KeepsMessages, "reverting 6 keeps messages")
	require.True(t, plan[4].KeepsMessages, "reverting 5 keeps messages")
	require.True(t, plan[5].KeepsMessages, "reverting 4 keeps messages")
	require.True(t, plan[6].KeepsMessages, "reverting 3 keeps messages")
	require.False(t, plan[7].KeepsMessages, "reverting 2 changes ids")
	require.False(t, plan[8].KeepsMessages, "reverting 1 drops the outbox")
	_, _, err = m.PlanDownTo(ctx, pool, 10)
	require.ErrorContains(t, err, "outside 0..9")

	_, err = pool.Exec(ctx, "DELETE FROM "+schema+".outbox")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (id, nonce, topic, payload, created_at, attempts, last_error)
VALUES (1, 1, 't', '\x00', now(), 1, 'x')`)
	require.NoError(t, err)
	_, err = m.DownToIfEmpty(ctx, pool, 0)
	require.ErrorContains(t, err, "holds 0 pending messages and 1 dead letter;")
	_, err = pool.Exec(ctx, "DELETE FROM "+schema+".dead_letters")
	require.NoError(t, err)
	done, err = m.DownToIfEmpty(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, []int{9, 8, 7, 6, 5, 4, 3, 2, 1}, done)
	require.False(t, schemaExists(t, pool, schema))
}
