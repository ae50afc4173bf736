package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// setupWAL is setup for an outbox in WAL mode (wharf migrate up --mode wal)
// on a cluster with wal_level=logical; it returns the cluster's URL too.
func setupWAL(t *testing.T) (*bundle, string) {
	t.Helper()
	url, err := testdb.LogicalURL()
	require.NoError(t, err)
	schema := "wew_" + randHex(5)
	res := runCLI(t, nil, time.Minute, "migrate", "up", "--mode", "wal", "--schema", schema, "--database-url", url)
	require.Equalf(t, 0, res.code, "wharf migrate up --mode wal failed:\nstdout: %s\nstderr: %s", res.stdout, res.stderr)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() {
		m, _ := wharfmigrate.New(schema)
		for i := 0; i < 50; i++ { // the relays' walsenders end a moment after them
			if _, err := m.Down(context.Background(), pool, 0); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		pool.Close()
	})
	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, client: client}, url
}
