package wharfmigrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// An older binary meets a schema a newer one migrated (a rollback of the
// binary, or two versions running `wharf migrate` at once): it does not know
// the newer migrations, so it must not revert anything beneath them (the
// newer migrations may depend on what it would drop) nor report success.
// Simulated by recording one migration past this build's latest.
func TestOlderBuildRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := setup(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	newer := m.Latest() + 1
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.schema_migrations (version) VALUES ($1)`, newer)
	require.NoError(t, err)
	require.Error(t, m.Check(ctx, pool), "Check refuses a newer schema")

	done, err := m.Up(ctx, pool)
	assert.Error(t, err, "Up on a schema newer than the build reports it, as Check does (it applied %v)", done)

	done, err = m.Down(ctx, pool, 1)
	assert.Error(t, err, "Down 1 cannot revert migration %d, which this build does not know (it reverted %v)", newer, done)
	assert.Empty(t, done)

	done, err = m.DownTo(ctx, pool, m.Latest()-2)
	require.Error(t, err, "DownTo must not revert migrations beneath an unknown newer one (it reverted %v)", done)
	require.Empty(t, done)

	v, err := m.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, newer, v)
	st, err := m.Status(ctx, pool)
	require.NoError(t, err)
	for _, s := range st {
		require.False(t, s.AppliedAt.IsZero(), "migration %d was reverted beneath migration %d", s.Version, newer)
	}
}
