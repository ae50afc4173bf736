package wharf_test

import (
	"context"
	"database/sql"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for the EnqueueSQLTx test
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A relay whose lanes were taken over while a delivery was in flight cannot
// remove the delivered row: its fencing token no longer matches, so the new
// owner still sees (and redelivers) the message.
func TestFencedRelayCannotRemoveRowsAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	inHandler := make(chan string, 1)
	release := make(chan struct{})
	cfg := testConfig(b.schema)
	cfg.LeaseTTL = time.Hour // no expiry: only the takeover moves the lanes
	cfg.Handler = func(ctx context.Context, m *wharf.Message) error {
		select {
		case inHandler <- m.ID:
		default:
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	ids, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "fenced", Payload: []byte(`1`)})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))

	select {
	case id := <-inHandler:
		require.Equal(t, ids[0], id)
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never delivered the message")
	}
	// Another relay takes every lane over (bumping the fence) while the
	// delivery is in flight.
	leaseLanes(t, b, "thief", time.Hour, "true")
	close(release)

	// The acknowledgement is written (or refused) promptly; give it time,
	// then the row must still be there for the new owner.
	time.Sleep(time.Second)
	require.Equal(t, 1, outboxCount(t, b), "a fenced-out relay removed a row")
	var owners []string
	rows, err := b.pool.Query(ctx, "SELECT DISTINCT owner FROM "+b.schema+".lanes")
	require.NoError(t, err)
	for rows.Next() {
		var o string
		require.NoError(t, rows.Scan(&o))
		owners = append(owners, o)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"thief"}, owners, "the fenced-out relay must not take lanes back while they are leased")
	require.NoError(t, client.Stop(ctx))
	require.Equal(t, 1, outboxCount(t, b))
}

// EnqueueSQLTx works through database/sql with the pgx stdlib driver and
// carries every field.
func TestEnqueueSQLTx(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", databaseURL)
	require.NoError(t, err)
	defer db.Close()
	client, err := wharf.NewClient(nil, &wharf.Config{Schema: b.schema})
	require.NoError(t, err)

	at := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := client.EnqueueSQLTx(ctx, tx,
		wharf.Message{Topic: "a", Key: "k", Payload: []byte{0xff, 0x00}, Headers: map[string]string{"x": "y"}, DeliverAt: at},
		wharf.Message{Topic: "b", Payload: []byte(`{"ok":true}`), DedupKey: "d1"},
		wharf.Message{Topic: "c", Payload: []byte(`2`)})
	require.NoError(t, err)
	require.Len(t, ids, 3)
	require.Less(t, ids[0], ids[2])
	again, err := client.EnqueueSQLTx(ctx, tx, wharf.Message{Topic: "b", Payload: []byte(`3`), DedupKey: "d1"})
	require.NoError(t, err)
	require.Equal(t, ids[1], again[0])
	require.NoError(t, tx.Commit())

	rec := &recorder{}
	cfg := testConfig(b.schema)
	cfg.Handler = rec.handle
	relay, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, relay.Drain(ctx))
	got := map[string]wharf.Message{}
	for _, m := range rec.snapshot() {
		got[m.ID] = m
	}
	require.Len(t, got, 3)
	require.Equal(t, []byte{0xff, 0x00}, got[ids[0]].Payload)
	require.Equal(t, "k", got[ids[0]].Key)
	require.Equal(t, map[string]string{"x": "y"}, got[ids[0]].Headers)
	require.True(t, at.Equal(got[ids[0]].DeliverAt), "deliver_at %s != %s", got[ids[0]].DeliverAt, at)
	require.Equal(t, `{"ok":true}`, string(got[ids[1]].Payload))
	require.Equal(t, "c", got[ids[2]].Topic)

	// Rolled back: nothing left behind.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = client.EnqueueSQLTx(ctx, tx, wharf.Message{Topic: "gone", Payload: []byte(`1`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.Equal(t, 0, outboxCount(t, b))
}

// The library a producer imports must not drag in broker clients: sinks live
// in their own packages.
func TestCorePackagesDoNotImportSinkClients(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/wharfhq/wharf", "github.com/wharfhq/wharf/wharfmigrate").CombinedOutput()
	require.NoError(t, err, string(out))
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/twmb/franz-go", "github.com/nats-io/", "github.com/rabbitmq/amqp091-go", "github.com/redis/go-redis", "github.com/spf13/cobra", "gopkg.in/yaml"} {
			require.Falsef(t, strings.HasPrefix(dep, banned), "core package depends on %s", dep)
		}
	}
}

// Enqueue and relay work under every pgx query execution mode, including the
// simple protocol that PgBouncer in transaction mode needs.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"simple_protocol", "exec", "describe_exec", "cache_describe"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t)
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(databaseURL + sep(databaseURL) + "default_query_exec_mode=" + mode)
			require.NoError(t, err)
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			rec := &recorder{}
			rc := testConfig(b.schema)
			rc.Handler = rec.handle
			rc.PollOnly = true
			client, err := wharf.NewClient(pool, rc)
			require.NoError(t, err)
			at := time.Now().Add(-time.Second).Truncate(time.Microsecond)
			ids, err := client.Enqueue(ctx,
				wharf.Message{Topic: "t", Key: "k", Payload: []byte{0, 1, 0xff}, Headers: map[string]string{"a": "b"}, DeliverAt: at},
				wharf.Message{Topic: "t", Key: "k", Payload: []byte(`{"x":1}`), DedupKey: "d"},
				wharf.Message{Topic: "u", Payload: []byte(`2`)})
			require.NoError(t, err)
			again, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Payload: []byte(`3`), DedupKey: "d"})
			require.NoError(t, err)
			require.Equal(t, ids[1], again[0])
			require.NoError(t, client.Drain(ctx))
			got := rec.snapshot()
			require.Len(t, got, 3)
			byID := map[string]wharf.Message{}
			for _, m := range got {
				byID[m.ID] = m
			}
			first := byID[ids[0]]
			require.Equal(t, []byte{0, 1, 0xff}, first.Payload)
			require.Equal(t, map[string]string{"a": "b"}, first.Headers)
			require.True(t, at.Equal(first.DeliverAt))
			require.Equal(t, `{"x":1}`, string(byID[ids[1]].Payload))
			require.Equal(t, "u", byID[ids[2]].Topic)
			requireKeyOrder(t, got)
			require.Equal(t, 0, outboxCount(t, b))
		})
	}
}

func sep(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}

// A publish that lasts several lease TTLs while the leases are renewed is not
// cut short: the sink call's context follows the renewals.
func TestLongPublishOutlivesRenewedLeases(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ctx := context.Background()
	cfg := testConfig(b.schema)
	// Long enough that a renewal delayed by a loaded machine does not let the
	// lease lapse (which would rightly end the publish); the publish lasts
	// two of them.
	cfg.LeaseTTL = 3 * time.Second
	delivered := make(chan error, 4)
	cfg.Handler = func(ctx context.Context, m *wharf.Message) error {
		end := time.Now().Add(2 * cfg.LeaseTTL)
		for time.Now().Before(end) {
			if err := ctx.Err(); err != nil {
				delivered <- err
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
		delivered <- nil
		return nil
	}
	client, err := wharf.NewClient(b.pool, cfg)
	require.NoError(t, err)
	_, err = client.Enqueue(ctx, wharf.Message{Topic: "t", Key: "slow", Payload: []byte(`1`)})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	select {
	case err := <-delivered:
		require.NoError(t, err, "the publish was cut short although the lease was renewed")
	case <-time.After(2 * time.Minute):
		t.Fatal("the handler never finished")
	}
	require.Eventually(t, func() bool { return outboxCount(t, b) == 0 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, client.Stop(ctx))
}
