package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// --async-commit: the producers' sessions commit with synchronous_commit
// off, the control connection keeps the server's setting, and the run says
// so in its settings and notes.
func TestAsyncCommitProducers(t *testing.T) {
	ctx := context.Background()
	err := Options{Mode: ModeDrain, AsyncCommit: true}.Validate()
	require.ErrorContains(t, err, "--async-commit")
	require.NotContains(t, err.Error(), "\n")

	ctl, err := pgx.Connect(ctx, databaseURL)
	require.NoError(t, err)
	var server string
	require.NoError(t, ctl.QueryRow(ctx, "SHOW synchronous_commit").Scan(&server))
	require.NoError(t, ctl.Close(ctx))
	for _, async := range []bool{false, true} {
		o := smokeOptions(ModeSteady)
		o.AsyncCommit = async
		o.Producers = 2
		e := &env{o: o}
		pool, err := e.producerPool(ctx)
		require.NoError(t, err)
		var setting string
		require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		pool.Close()
		if async {
			require.Equal(t, "off", setting)
		} else {
			require.Equal(t, server, setting, "without --async-commit the server's setting stands")
		}
	}

	o := smokeOptions(ModeSteady)
	o.Rate = 2000
	o.Duration = time.Second
	o.AsyncCommit = true
	r, err := Run(ctx, o)
	require.NoError(t, err)
	require.True(t, r.Settings.AsyncCommit)
	require.Equal(t, r.Messages, r.Delivered)
	var sum bytes.Buffer
	require.NoError(t, WriteSummary(&sum, r))
	require.Contains(t, sum.String(), "synchronous_commit off (--async-commit)")
	found := false
	for _, s := range r.Settings.Applicable() {
		found = found || (s.Name == "async-commit" && s.Value == "true")
	}
	require.True(t, found, "the report lists --async-commit")
}
