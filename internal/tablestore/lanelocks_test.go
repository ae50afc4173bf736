package tablestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// scratchOutbox migrates a schema of its own (named prefix_<random>) on the
// test database, dropped at cleanup, and returns a pool and the schema.
func scratchOutbox(t *testing.T, prefix string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url := os.Getenv("TEST_DATABASE_URL") // set by TestMain (internal/testdb)
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set (TestMain sets it)")
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := prefix + "_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, err := wharfmigrate.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	return pool, schema
}

// The completer's fenced writes lock the relay's lane rows FOR SHARE while
// the lease loop's renewal updates the same rows: both must take the locks in
// one order (by lane), or they deadlock, and each deadlock stalls both for
// deadlock_timeout (1 s) before PostgreSQL cancels one (seen in a 30-minute
// soak: 3 deadlocks, commit → ack spikes of 6 s). The lane rows are first
// laid out on the page in descending lane order, the order a relay's updates
// can leave them in.
func TestFencedWritesAndRenewalsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "wl")
	for lane := wharfmigrate.Lanes - 1; lane >= 0; lane-- {
		if _, err := pool.Exec(ctx, "UPDATE "+schema+".lanes SET owner = 'r1', fence = 1 WHERE lane = $1", lane); err != nil {
			t.Fatal(err)
		}
	}
	q := newQueries(schema)
	lanes := make([]int16, wharfmigrate.Lanes)
	fences := make([]int64, wharfmigrate.Lanes)
	for i := range lanes {
		lanes[i], fences[i] = int16(i), 1
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		deadlocks int
		other     error
	)
	count := func(err error) {
		var pe *pgconn.PgError
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
		case errors.As(err, &pe) && pe.Code == "40P01":
			deadlocks++
		case other == nil:
			other = err
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for w := 0; w < 2; w++ {
		wg.Add(2)
		go func() { // the lease loop
			defer wg.Done()
			for time.Now().Before(deadline) {
				_, err := pool.Exec(ctx, q.renew, "r1")
				count(err)
			}
		}()
		go func() { // the completer
			defer wg.Done()
			for time.Now().Before(deadline) {
				_, err := pool.Exec(ctx, q.ack, lanes, fences, "r1", []int16{}, []int64{}, []int64{}, []pgtype.TID{}, []int64{}, []int64{})
				count(err)
			}
		}()
	}
	wg.Wait()
	if other != nil {
		t.Fatal(other)
	}
	if deadlocks > 0 {
		t.Fatalf("%d deadlocks between fenced writes and lease renewals", deadlocks)
	}
}

// Exclusive claims take turns: a claim that starts while another relay's
// claim (here made in the same transaction as that relay's registration, the
// worst case) is not yet committed takes no lane once it commits. Waiting for
// the lane row locks alone let the second claim check each row against a
// snapshot that did not see the winner registered, and take every lane from
// it.
func TestClaimAloneLosesToAClaimInProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := scratchOutbox(t, "wc")
	q := newQueries(schema)
	register := `INSERT INTO ` + schema + `.relays (relay_id, lease_until) VALUES ($1, now() + interval '1 minute')`
	if _, err := pool.Exec(ctx, register, "relay-b"); err != nil {
		t.Fatal(err)
	}
	stB := &Store{pool: pool, q: q, schema: schema, owner: "relay-b"}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, sql := range []string{
		`SELECT pg_advisory_xact_lock(hashtextextended('wharf claimAlone ` + schema + `', 0))`,
		`INSERT INTO ` + schema + `.relays (relay_id, lease_until) VALUES ('relay-a', now() + interval '1 minute')`,
		`UPDATE ` + schema + `.lanes SET owner = 'relay-a', fence = fence + 1`,
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		got []store.LaneLease
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := stB.ClaimAlone(ctx)
		done <- result{got, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the claim did not wait for the one in progress: %v, %v", r.got, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.got) != 0 {
		t.Fatalf("the second claim took %d lanes from the relay that had just claimed them all", len(r.got))
	}
	var a int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".lanes WHERE owner = 'relay-a'").Scan(&a); err != nil {
		t.Fatal(err)
	}
	if a != wharfmigrate.Lanes {
		t.Fatalf("relay-a holds %d lanes, want all %d", a, wharfmigrate.Lanes)
	}
}
