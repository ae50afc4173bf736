package wharf_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// Other relays delete a relay's registration three lease TTLs after its last
// heartbeat. A relay that was cut off from the database that long (a
// partition, a pause, a database outage) finds no row when it comes back: it
// registers again and goes on delivering, instead of stopping as if its id
// had been taken. A row of another incarnation (a relay started with the
// same id meanwhile) still stops it with ErrRelayIDInUse.
func TestRelayRegistersAgainWhenItsRowIsGone(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.RelayID = "comes-back"
	cfg.Handler = rec.handle
	cfg.RebalanceInterval = 100 * time.Millisecond
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { _ = client.Stop(ctx) }()
	rows := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".relays WHERE relay_id = 'comes-back'").Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return rows() == 1 }, time.Minute, 20*time.Millisecond)

	_, err = b.pool.Exec(ctx, "DELETE FROM "+b.schema+".relays WHERE relay_id = 'comes-back'")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rows() == 1 }, time.Minute, 20*time.Millisecond, "registered again")
	ids, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	require.NoError(t, err)
	waitDelivered(t, rec, ids...)
	select {
	case <-client.Stopped():
		t.Fatal("the relay stopped after its row was deleted")
	default:
	}

	// Another incarnation holds the id now: the relay must stop.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.schema+".relays SET incarnation = 'someone-else' WHERE relay_id = 'comes-back'")
	require.NoError(t, err)
	select {
	case <-client.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the relay kept running while another incarnation held its id")
	}
	err = client.Stop(ctx)
	require.ErrorIs(t, err, wharf.ErrRelayIDInUse)
}
