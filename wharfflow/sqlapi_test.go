package wharfflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/wharfflow"
)

// readmeCheckout is the README's checkout flow (wharfflow/example_checkout_test.go),
// reduced to what its SQL examples reach.
func readmeCheckout() (*wharfflow.Flow[Order], *wharfflow.Flow[Parcel]) {
	shipping := wharfflow.New[Parcel]("shipping", nil).
		Step("ship", func(ctx context.Context, p *Parcel, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	checkout := wharfflow.New[Order]("checkout", nil).
		Step("reserve", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment-captured").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			var parcels []wharfflow.Child
			for _, item := range o.Items {
				parcels = append(parcels, shipping.Child(Parcel{Order: o.ID, Item: item}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("shipped", parcels...)
		}).
		Step("shipped", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o)
		}).
		Step("expire", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("no payment within an hour"))
		})
	return checkout, shipping
}

// The README's SQL examples, as written there (schema wharf), run against
// its checkout flow: the start begins at the flow's first step and awaits
// the payment; the signal resumes it, and the order ships.
func TestReadmeSQLExamples(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	find := func(fn string) string {
		t.Helper()
		m := regexp.MustCompile("`(SELECT wharf\\." + fn + "\\([^`]*\\))`").FindSubmatch(readme)
		require.NotNil(t, m, "the README shows SELECT wharf.%s(...)", fn)
		return strings.Replace(string(m[1]), "wharf.", b.schema+".", 1)
	}
	start, signal := find("start_flow"), find("signal")
	checkout, shipping := readmeCheckout()
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{checkout, shipping}})
	var id int64
	require.Eventually(t, func() bool {
		// The runner registers the flow's steps when it starts.
		return b.pool.QueryRow(ctx, start).Scan(&id) == nil
	}, time.Minute, 10*time.Millisecond)
	b.waitStatus(t, id, "awaiting")
	require.Equal(t, []string{"reserve/0/await"}, b.history(t, id), "started at the flow's first step")
	var sig *int64
	require.NoError(t, b.pool.QueryRow(ctx, signal).Scan(&sig))
	require.NotNil(t, sig, "the signal found the instance")
	b.waitStatus(t, id, "done")
}

// A start from SQL without a step begins at the flow's first step, as the
// runners registered it; for a flow no runner registered, or a step the
// flow lacks, it fails, saying what to do.
func TestSQLStartNamesOrDefaultsTheFirstStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	start := func(args string) (int64, error) {
		var id int64
		err := b.pool.QueryRow(ctx, "SELECT "+b.schema+".start_flow("+args+")").Scan(&id)
		return id, err
	}
	_, err := start(`'checkout', '{"id":"o-1"}', 'o-1'`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	require.Equal(t, "start 0: flow checkout is unknown: no runner has registered it, so its first step is unknown", pgErr.Message)
	require.Contains(t, pgErr.Hint, "start a runner that runs it, or name the step")
	// Naming the step needs no runner.
	named, err := start(`'checkout', '{"id":"o-0"}', 'o-0', 'reserve'`)
	require.NoError(t, err)

	checkout, shipping := readmeCheckout()
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{checkout, shipping}})
	b.waitStatus(t, named, "awaiting")
	id, err := start(`'checkout', '{"id":"o-1"}', 'o-1'`)
	require.NoError(t, err)
	b.waitStatus(t, id, "awaiting")
	require.Equal(t, []string{"reserve/0/await"}, b.history(t, id))

	_, err = start(`'checkout', '{"id":"o-2"}', 'o-2', 'start'`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "start 0: flow checkout has no step start (its steps: reserve, expire, paid, shipped)", pgErr.Message)
	require.Equal(t, "Leave the step out to start at the first step, reserve.", pgErr.Hint)
}

// A failed instance gives up its correlation key: a new start with the key
// starts a new instance (it does not silently return the failed one), and
// the failed one can then not be retried while the new one holds the key.
func TestFailedInstanceGivesUpItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var attempts atomic.Int32
	f := wharfflow.New[counter]("fragile", nil).Step("only", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		if attempts.Add(1) == 1 {
			return wharfflow.Fail(errors.New("broken"))
		}
		return wharfflow.Await("never", "never")
	}).Step("never", func(ctx context.Context, s *counter, in wharfflow.Input) wharfflow.Outcome {
		return wharfflow.Done(nil)
	})
	b.startRunner(t, wharfflow.Config{Flows: []wharfflow.Definition{f}})
	first, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Key: "k"}))
	require.NoError(t, err)
	b.waitStatus(t, first[0], "failed")
	second, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Key: "k"}))
	require.NoError(t, err)
	require.NotEqual(t, first[0], second[0], "a new instance, not the failed one")
	b.waitStatus(t, second[0], "awaiting")
	again, err := b.client.Start(ctx, f.Start(counter{}, wharfflow.StartOptions{Key: "k"}))
	require.NoError(t, err)
	require.Equal(t, second, again, "the active one holds the key")
	err = b.client.Retry(ctx, first[0])
	require.EqualError(t, err, fmt.Sprintf("wharfflow: retry: instance %d cannot be retried: instance %d of its flow has taken its key since (Cancel that instance first, or leave this one failed.)", first[0], second[0]))
	_, err = b.client.Cancel(ctx, second[0])
	require.NoError(t, err)
	require.NoError(t, b.client.Retry(ctx, first[0]))
	b.waitStatus(t, first[0], "awaiting")
}

// wharf.signal from SQL returns NULL when no active instance has the flow
// and key (a mistyped key, or an instance that ended); with p_strict it
// raises instead, naming what did not match, and records nothing.
func TestSignalFromSQLStrict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var id *int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT "+b.schema+".signal('ordr', 'c-1', 'payment', '{}')").Scan(&id))
	require.Nil(t, id)
	err := b.pool.QueryRow(ctx, "SELECT "+b.schema+".signal('ordr', 'c-1', 'payment', '{}', p_strict => true)").Scan(&id)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "P0002", pgErr.Code)
	require.Equal(t, `signal payment: flow ordr has no active instance with key "c-1"`, pgErr.Message)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".flow_signals").Scan(&n))
	require.Zero(t, n)
}
