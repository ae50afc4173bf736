package tablestore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// expiredOwner gives every lane to relay-a with fence 1 and a lease that ran
// out a second ago (a relay paused past its lease), and returns relay-a's
// store on a pool of its own whose connections are named app, and relay-b's.
func expiredOwner(t *testing.T, prefix, app string) (pool *pgxpool.Pool, a, b *Store) {
	t.Helper()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, prefix)
	for _, sql := range []string{
		`INSERT INTO ` + schema + `.relays (relay_id, incarnation, lease_until) VALUES ('relay-a', 'inc-a', now() - interval '1 second')`,
		`INSERT INTO ` + schema + `.relays (relay_id, incarnation, lease_until) VALUES ('relay-b', 'inc-b', now() + interval '1 minute')`,
		`UPDATE ` + schema + `.lanes SET owner = 'relay-a', fence = 1`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("TEST_DATABASE_URL"))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(poolA.Close)
	q := newQueries(schema)
	a = &Store{pool: poolA, q: q, schema: schema, owner: "relay-a", incarnation: "inc-a", host: "a", pid: 1}
	b = &Store{pool: pool, q: q, schema: schema, owner: "relay-b", incarnation: "inc-b", host: "b", pid: 2}
	return pool, a, b
}

// laneOwners returns each lane's owner and fence.
func laneOwners(t *testing.T, pool *pgxpool.Pool, schema string) map[int16]store.LaneLease {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT lane, coalesce(owner, ''), fence FROM `+schema+`.lanes`)
	require.NoError(t, err)
	out := map[int16]store.LaneLease{}
	var lane int16
	var owner string
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&lane, &owner, &fence}, func() error {
		out[lane] = store.LaneLease{Lane: lane, Fence: fence}
		if owner != "relay-a" && owner != "relay-b" {
			t.Errorf("lane %d: owner %q", lane, owner)
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// A relay paused past its lease renews while another relay claims, and the
// claim's view of the owner's lease predates the renewal's commit while its
// lane locks come after it: the renewal only locked the lane rows (it
// updates the relays row), so the locks are granted with no recheck. Here
// the claim's first statement runs as a cursor, so its snapshot is taken
// before the owner's round and its rows are locked after the round
// committed: the locks succeed on every lane, and the claim must still take
// none, because the owner's round returned them all as renewed. The same
// holds when the owner's relays row was gone (deleted three lease TTLs after
// its last heartbeat) and its round registers it again, and for an
// exclusive relay's claim.
func TestClaimDoesNotTakeLanesRenewedAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		alone bool
		gone  bool
	}{
		{"claim", false, false},
		{"claim, owner's row gone", false, true},
		{"claimAlone", true, false},
		{"claimAlone, owner's row gone", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, a, b := expiredOwner(t, "wr", "wharf-test-claim-snapshot")
			if c.gone {
				_, err := pool.Exec(ctx, `DELETE FROM `+a.schema+`.relays WHERE relay_id = 'relay-a'`)
				require.NoError(t, err)
			}

			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			// The claim's snapshot: relay-a's lease ran out.
			_, err = tx.Exec(ctx, `DECLARE cand NO SCROLL CURSOR FOR `+b.q.claimLock, nil)
			require.NoError(t, err)

			// relay-a's round: heartbeat, renewal (locks its lane rows), commit.
			lr, err := a.LeaseRound(ctx, time.Minute)
			require.NoError(t, err)
			require.False(t, lr.LostID)
			require.Len(t, lr.Renewed, wharfmigrate.Lanes, "relay-a's round renews every lane")

			// The claim locks the rows now, after the round committed, with
			// the view of its older snapshot: every lane looks expired.
			rows, err := tx.Query(ctx, `FETCH ALL FROM cand`)
			require.NoError(t, err)
			locked, err := pgx.CollectRows(rows, pgx.RowTo[int16])
			require.NoError(t, err)
			require.Len(t, locked, wharfmigrate.Lanes, "the race was not forced: the stale snapshot should see every lane expired")

			got, err := b.takeLocked(ctx, tx, c.alone, locked)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			for _, g := range got {
				if f, ok := lr.Renewed[g.Lane]; ok {
					t.Errorf("lane %d: relay-a renewed it (fence %d) and relay-b claimed it (fence %d)", g.Lane, f, g.Fence)
				}
			}
			for lane, l := range laneOwners(t, pool, a.schema) {
				require.EqualValues(t, 1, l.Fence, "lane %d changed hands", lane)
			}
		})
	}
}

// The other order: the claim holds the lane locks before the owner's round
// reaches them. The round's renewal waits for the claim; the claim checks
// the owner's lease on a snapshot taken after its locks, sees it ran out
// (the round's heartbeat is not committed), and takes the lanes; the
// renewal then finds them gone, so the owner does not believe it keeps
// them. Only one relay ever holds a lane and only the new fence is in the
// table.
func TestOwnerRenewingBehindAClaimLearnsItLostTheLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const app = "wharf-test-renew-behind-claim"
	pool, a, b := expiredOwner(t, "wb", app)

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	locked, err := b.lockCandidates(ctx, tx, nil)
	require.NoError(t, err)
	require.Len(t, locked, wharfmigrate.Lanes)

	type result struct {
		lr  store.LeaseRound
		err error
	}
	done := make(chan result, 1)
	go func() {
		lr, err := a.LeaseRound(ctx, time.Minute)
		done <- result{lr, err}
	}()
	// Wait until relay-a's renewal waits for the claim's lane locks.
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		return err == nil && n == 1
	}, 60*time.Second, 5*time.Millisecond, "relay-a's round never waited for the claim's locks")

	got, err := b.takeLocked(ctx, tx, false, locked)
	require.NoError(t, err)
	require.Len(t, got, wharfmigrate.Lanes, "relay-a's heartbeat is not committed: its lease ran out")
	require.NoError(t, tx.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.False(t, r.lr.LostID)
	for _, g := range got {
		require.EqualValues(t, 2, g.Fence)
		if f, ok := r.lr.Renewed[g.Lane]; ok {
			t.Errorf("lane %d: relay-a renewed it (fence %d) and relay-b claimed it (fence %d)", g.Lane, f, g.Fence)
		}
	}
	for lane, l := range laneOwners(t, pool, a.schema) {
		require.EqualValues(t, 2, l.Fence, "lane %d", lane)
	}
}

// Claim and ClaimAlone, end to end: they take expired lanes, and none of a
// live owner's.
func TestClaimTakesExpiredLanesOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, a, b := expiredOwner(t, "wt", "wharf-test-claim-expired")
	got, err := b.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, got, 10)
	// relay-a renews what it still holds; relay-b's claim takes nothing more.
	lr, err := a.LeaseRound(ctx, time.Minute)
	require.NoError(t, err)
	require.Len(t, lr.Renewed, wharfmigrate.Lanes-10)
	got, err = b.Claim(ctx, 64)
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = b.ClaimAlone(ctx)
	require.NoError(t, err)
	require.Empty(t, got, "another live relay holds lanes")
	// relay-a's lease runs out again: ClaimAlone takes the rest.
	_, err = pool.Exec(ctx, `UPDATE `+a.schema+`.relays SET lease_until = now() - interval '1 second' WHERE relay_id = 'relay-a'`)
	require.NoError(t, err)
	got, err = b.ClaimAlone(ctx)
	require.NoError(t, err)
	require.Len(t, got, wharfmigrate.Lanes-10)
}
