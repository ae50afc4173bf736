package wharfmigrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// flowRoleNames returns fresh names for the flow runner and reader roles,
// dropped when the test ends.
func flowRoleNames(t *testing.T, admin *pgxpool.Pool) (runner, reader string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	runner, reader = "wfr_"+suffix, "wfd_"+suffix
	t.Cleanup(func() {
		ctx := context.Background()
		for _, r := range []string{runner, reader} {
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+r)
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+r)
		}
	})
	return runner, reader
}

type roleOrder struct {
	ID      string   `json:"id"`
	Items   []string `json:"items"`
	Shipped []string `json:"shipped"`
}

type roleParcel struct {
	Item string `json:"item"`
}

// With the roles created, a checkout flow runs end to end with each role
// doing its own part: the producer starts the flows (Go client and SQL) and
// signals them, the flow runner runs every step (await, children on a rate
// key, join, an emitted outbox message) and deletes them after their
// retention, the relay delivers the emitted messages, and the reader lists
// and shows them and serves the metrics. Each is refused the others' work:
// the producer cannot read or change a flow row itself, nor claim or
// complete steps; the reader changes nothing; the relay cannot start flows.
func TestRolesFlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema, m := migrated(t)
	producer, relay := roleNames(t, admin)
	runner, reader := flowRoleNames(t, admin)
	opts := wharfmigrate.RoleOptions{
		Producer: producer, Relay: relay, FlowRunner: runner, FlowReader: reader,
		ProducerPassword: "pw-" + producer, RelayPassword: "pw-" + relay,
		FlowRunnerPassword: "pw-" + runner, FlowReaderPassword: "pw-" + reader,
	}
	require.NoError(t, m.CreateRoles(ctx, admin, opts))
	pp := poolAs(t, producer, opts.ProducerPassword)
	rp := poolAs(t, runner, opts.FlowRunnerPassword)
	dp := poolAs(t, reader, opts.FlowReaderPassword)
	lp := poolAs(t, relay, opts.RelayPassword)
	S := func(sql string) string { return strings.ReplaceAll(sql, "S.", schema+".") }

	shipping := wharfflow.New[roleParcel]("shipping", nil).
		Step("ship", func(_ context.Context, p *roleParcel, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	checkout := wharfflow.New[roleOrder]("checkout", nil).
		Step("reserve", func(context.Context, *roleOrder, wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "paid").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(_ context.Context, o *roleOrder, _ wharfflow.Input) wharfflow.Outcome {
			var ch []wharfflow.Child
			for _, item := range o.Items {
				ch = append(ch, shipping.Child(roleParcel{Item: item}, wharfflow.Options{RateKey: "carrier"}))
			}
			return wharfflow.Spawn("shipped", ch...)
		}).
		Step("shipped", func(_ context.Context, o *roleOrder, in wharfflow.Input) wharfflow.Outcome {
			for _, c := range in.Children {
				var item string
				_ = json.Unmarshal(c.Result, &item)
				o.Shipped = append(o.Shipped, item)
			}
			return wharfflow.Done(o).Emit(wharf.Message{Topic: "orders", Key: o.ID, Payload: []byte(`{"shipped":"` + o.ID + `"}`)})
		}).
		Step("expire", func(context.Context, *roleOrder, wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("unpaid"))
		})

	// Producer: starts in its transaction, and from SQL.
	pc, err := wharfflow.NewClient(pp, schema)
	require.NoError(t, err)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pp, func(tx pgx.Tx) error {
		ids, err = pc.StartTx(ctx, tx,
			checkout.Start(roleOrder{ID: "o-1", Items: []string{"book", "lamp"}}, wharfflow.StartOptions{Key: "o-1"}),
			checkout.Start(roleOrder{ID: "o-2", Items: []string{"pen"}}, wharfflow.StartOptions{Key: "o-2"}))
		return err
	}), "the producer starts flows")
	again, err := pc.Start(ctx, checkout.Start(roleOrder{ID: "o-1"}, wharfflow.StartOptions{Key: "o-1"}))
	require.NoError(t, err, "the producer's start dedup finds the active instance")
	require.Equal(t, ids[0], again[0])
	var sqlID int64
	require.NoError(t, pp.QueryRow(ctx, S(`SELECT S.start_flow('checkout', '{"id":"o-3","items":["cup"]}', 'o-3', 'reserve')`)).Scan(&sqlID),
		"the producer starts a flow from SQL")
	ids = append(ids, sqlID)
	for _, sql := range []string{
		`SELECT * FROM S.flow_instances`, `SELECT id FROM S.flow_instances`, `SELECT * FROM S.flow_signals`, `SELECT * FROM S.flow_steps`,
		`UPDATE S.flow_instances SET state = '{}'`, `UPDATE S.flow_instances SET run_at = now()`, `DELETE FROM S.flow_instances`,
		`INSERT INTO S.flow_instances (flow, step) VALUES ('checkout', 'paid')`,
		`INSERT INTO S.flow_signals (instance_id, name) VALUES (1, 'paid')`, `UPDATE S.flow_keys SET paused_until = 'infinity'`,
		`SELECT * FROM S.claim_flow_steps('me', ARRAY['checkout'], 10, '1 hour')`,
		`SELECT * FROM S.complete_flow_steps('me', '[]', '1 hour')`, `SELECT S.wake_flows(NULL)`,
		`SELECT S.cancel_flow(1)`, `SELECT S.retry_flow(1)`, `SELECT S.cleanup_flows('infinity', 10)`,
	} {
		requireDenied(t, pp, S(sql))
	}

	// Flow runner: runs every step, with a rate limit it writes itself.
	fr, err := wharfflow.NewRunner(rp, &wharfflow.Config{
		Schema: schema, Flows: []wharfflow.Definition{checkout, shipping}, Logger: discard(),
		RateLimits: map[string]wharfflow.RateLimit{"carrier": {PerSecond: 1000, Burst: 10}},
	})
	require.NoError(t, err)
	require.NoError(t, fr.Start(ctx), "the flow runner role starts a runner")
	t.Cleanup(func() { _ = fr.Stop(context.Background()) })

	// Producer: signals, from Go and from SQL.
	sig, err := pc.Send(ctx,
		wharfflow.Signal{Flow: "checkout", Key: "o-1", Name: "paid", DedupKey: "psp-1"},
		wharfflow.Signal{Flow: "checkout", Key: "o-1", Name: "paid", DedupKey: "psp-1"},
		wharfflow.Signal{Flow: "checkout", Key: "o-2", Name: "paid"})
	require.NoError(t, err, "the producer signals")
	require.Equal(t, sig[0], sig[1], "the producer's signal dedup finds the first signal")
	var sqlSig int64
	require.NoError(t, pp.QueryRow(ctx, S(`SELECT S.signal('checkout', 'o-3', 'paid', '{"cents":1}', 'psp-3')`)).Scan(&sqlSig),
		"the producer signals from SQL")

	rc, err := wharfflow.NewClient(dp, schema)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, id := range ids {
		// The reader polls the instance's row.
		got, err := rc.Wait(waitCtx, id, 20*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, "done", got.Status, "instance %d: %s", id, got.Error)
	}

	// Reader: lists, shows and serves the metrics, and changes nothing.
	list, err := rc.List(ctx, wharfflow.ListOptions{Flow: "shipping"})
	require.NoError(t, err, "the reader lists")
	require.Len(t, list, 4)
	d, err := rc.Get(ctx, ids[0])
	require.NoError(t, err, "the reader shows an instance")
	require.Equal(t, []string{"reserve", "paid", "shipped"}, stepNames(d.Steps))
	require.Len(t, d.Signals, 1)
	require.NotNil(t, d.Signals[0].ConsumedAt)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(wharfflow.NewMetrics(dp, schema))
	_, err = reg.Gather()
	require.NoError(t, err, "the reader serves the flow metrics")
	for _, sql := range []string{
		`UPDATE S.flow_instances SET state = '{}'`, `DELETE FROM S.flow_steps`, `INSERT INTO S.flow_keys (key) VALUES ('k')`,
		`UPDATE S.flow_signals SET consumed_at = NULL`, `SELECT S.start_flow('checkout')`, `SELECT S.signal('checkout', 'o-1', 'paid')`,
		`SELECT S.cancel_flow(1)`, `SELECT * FROM S.complete_flow_steps('me', '[]', '1 hour')`, `SELECT S.wake_flows(ARRAY[1::bigint])`,
		`SELECT payload FROM S.outbox`, `SELECT * FROM S.dead_letters`,
	} {
		requireDenied(t, dp, S(sql))
	}

	// Relay: delivers the messages the outcomes emitted, and cannot start,
	// signal or read flows.
	got := drainAs(t, lp, schema)
	require.Len(t, got, 3, "one message per checkout")
	for _, sql := range []string{`SELECT S.start_flow('checkout')`, `SELECT * FROM S.start_flows('[{"flow":"checkout"}]')`,
		`SELECT * FROM S.signal_flows('[]')`, `SELECT * FROM S.flow_instances`, `UPDATE S.flow_instances SET run_at = now()`} {
		requireDenied(t, lp, S(sql))
	}

	// Flow runner: may not do the relay's work, nor read messages.
	for _, sql := range []string{`SELECT payload FROM S.outbox`, `DELETE FROM S.outbox`, `UPDATE S.lanes SET owner = 'me'`,
		`SELECT * FROM S.dead_letters`, `DELETE FROM S.relays`, `CREATE TABLE S.x (i int)`, `DROP TABLE S.flow_steps`} {
		requireDenied(t, rp, S(sql))
	}
	// ... and deletes finished instances, with their children, signals and
	// history, after their retention.
	n, err := wharfflow.Cleanup(ctx, rp, schema, time.Now().Add(time.Hour), 100)
	require.NoError(t, err, "the flow runner deletes finished instances")
	require.Equal(t, 3, n)
	var left int
	require.NoError(t, admin.QueryRow(ctx, S(`SELECT (SELECT count(*) FROM S.flow_instances) + (SELECT count(*) FROM S.flow_signals) + (SELECT count(*) FROM S.flow_steps)`)).Scan(&left))
	require.Zero(t, left)

	// The flow runner role may also cancel (wharf flow cancel uses its
	// table rights); the reader and the producer may not.
	var late int64
	require.NoError(t, pp.QueryRow(ctx, S(`SELECT S.start_flow('checkout', '{"id":"o-9"}', 'o-9', 'reserve')`)).Scan(&late))
	requireDenied(t, pp, S(`SELECT S.cancel_flow(`)+strconv.FormatInt(late, 10)+`)`)
	requireDenied(t, dp, S(`SELECT S.cancel_flow(`)+strconv.FormatInt(late, 10)+`)`)
	runnerClient, err := wharfflow.NewClient(rp, schema)
	require.NoError(t, err)
	cancelled, err := runnerClient.Cancel(ctx, late)
	require.NoError(t, err)
	require.Equal(t, 1, cancelled)
	got2, err := rc.Get(ctx, late)
	require.NoError(t, err)
	require.Equal(t, "cancelled", got2.Status)
}

func stepNames(steps []wharfflow.StepRecord) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Step)
	}
	return out
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
