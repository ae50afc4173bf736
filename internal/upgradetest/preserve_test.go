package upgradetest

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// snapshot is what a release left in a schema: each table's rows as JSON,
// each sequence's last value, and the ids consumers saw for the pending
// messages and the dead letters (computed by the release's own message_id).
type snapshot struct {
	rows      map[string][]map[string]any
	sequences map[string]int64
	pending   []string
	dead      []string
}

func takeSnapshot(t *testing.T, p *pgxpool.Pool, schema string) snapshot {
	t.Helper()
	ctx := context.Background()
	s := snapshot{rows: map[string][]map[string]any{}, sequences: map[string]int64{}}
	tables, err := p.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'`, schema)
	require.NoError(t, err)
	var names []string
	for tables.Next() {
		var n string
		require.NoError(t, tables.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, tables.Err())
	for _, n := range names {
		rows, err := p.Query(ctx, `SELECT to_jsonb(t)::text FROM `+schema+`.`+n+` t`)
		require.NoError(t, err)
		for rows.Next() {
			var j string
			require.NoError(t, rows.Scan(&j))
			var m map[string]any
			d := json.NewDecoder(strings.NewReader(j))
			d.UseNumber() // bigint nonces do not fit a float64
			require.NoError(t, d.Decode(&m))
			s.rows[n] = append(s.rows[n], m)
		}
		require.NoError(t, rows.Err())
	}
	seqs, err := p.Query(ctx, `SELECT sequencename, coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = $1`, schema)
	require.NoError(t, err)
	for seqs.Next() {
		var n string
		var v int64
		require.NoError(t, seqs.Scan(&n, &v))
		s.sequences[n] = v
	}
	require.NoError(t, seqs.Err())
	ids := func(table string) []string {
		var out []string
		rows, err := p.Query(ctx, `SELECT `+schema+`.message_id(id, nonce)::text FROM `+schema+`.`+table)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			out = append(out, id)
		}
		require.NoError(t, rows.Err())
		slices.Sort(out)
		return out
	}
	s.pending, s.dead = ids("outbox"), ids("dead_letters")
	return s
}

// requirePreserved checks that migrating kept what the release left: every
// row of every table with the values of the columns it had (a migration may
// add columns, tables and rows, not change or drop what is there), and no
// sequence behind where it was. A migration meant to change existing data
// must say so here, with the data it changes.
func requirePreserved(t *testing.T, before, after snapshot) {
	t.Helper()
	for table, rows := range before.rows {
		left := map[string]int{}
		for _, r := range canon(t, after.rows[table], rows) {
			left[r]++
		}
		var lost []string
		for _, r := range canon(t, rows, nil) {
			if left[r] == 0 {
				lost = append(lost, r)
				continue
			}
			left[r]--
		}
		require.Emptyf(t, lost, "table %s: rows the release left are gone or changed (in the columns they had) after migrating to the head", table)
	}
	for seq, v := range before.sequences {
		_, ok := after.sequences[seq]
		require.Truef(t, ok, "sequence %s is gone", seq)
		require.GreaterOrEqualf(t, after.sequences[seq], v, "sequence %s went back: ids would be handed out again", seq)
	}
}

// canon renders rows as sorted JSON, each limited to the columns of like's
// rows when like is set.
func canon(t *testing.T, rows, like []map[string]any) []string {
	t.Helper()
	var cols map[string]bool
	if len(like) > 0 {
		cols = map[string]bool{}
		for k := range like[0] {
			cols[k] = true
		}
	}
	var out []string
	for _, r := range rows {
		if cols != nil {
			r2 := map[string]any{}
			for k := range cols {
				r2[k] = r[k]
			}
			r = r2
		}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

func TestNewestPgDump(t *testing.T) {
	found := []string{"/usr/lib/postgresql/10/bin/pg_dump", "/usr/lib/postgresql/15/bin/pg_dump", "/usr/lib/postgresql/9.6/bin/pg_dump"}
	require.Equal(t, "/usr/lib/postgresql/15/bin/pg_dump", newestPgDump(found))
}

// migrateTo below the head (the path every release's fixture takes once a
// later migration exists) creates that version forward only, and Up takes it
// to the head.
func TestMigrateToBelowTheHead(t *testing.T) {
	p := pool(t)
	schema := freshSchema(t, p, "upgrade_below")
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	migrateTo(t, p, schema, m.Latest()-1)
	applied, err := m.Up(context.Background(), p)
	require.NoError(t, err)
	require.Equal(t, []int{m.Latest()}, applied)
	require.NoError(t, m.Check(context.Background(), p))
}
