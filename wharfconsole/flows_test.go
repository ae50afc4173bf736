package wharfconsole_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// flowFixture runs real flows on a test schema: payouts that fail until
// pay is set, checkouts that await a payment signal and ship their items in
// child instances.
type flowFixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	client *wharfflow.Client
	pay    atomic.Bool
	payout *wharfflow.Flow[payoutState]
	order  *wharfflow.Flow[orderState]
}

type payoutState struct {
	Cents int    `json:"cents"`
	Note  string `json:"note"`
}

type orderState struct {
	ID    string   `json:"id"`
	Items []string `json:"items"`
}

type parcelState struct {
	Item string `json:"item"`
}

// badNote is a value that would run script if a page put it in as markup.
const badNote = `<img src=z onerror=alert(3)>`

func newFlowFixture(t *testing.T, pool *pgxpool.Pool, schema string) *flowFixture {
	t.Helper()
	fc, err := wharfflow.NewClient(pool, schema)
	require.NoError(t, err)
	fx := &flowFixture{t: t, pool: pool, schema: schema, client: fc}
	fx.payout = wharfflow.New[payoutState]("payout", nil).
		Step("send", func(_ context.Context, s *payoutState, _ wharfflow.Input) wharfflow.Outcome {
			if !fx.pay.Load() {
				return wharfflow.Fail(errors.New("bank refused: <b>insufficient funds</b>"))
			}
			return wharfflow.Done(map[string]int{"paid": s.Cents})
		})
	parcel := wharfflow.New[parcelState]("parcel", nil).
		Step("ship", func(_ context.Context, p *parcelState, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	fx.order = wharfflow.New[orderState]("checkout", nil).
		Step("reserve", func(_ context.Context, _ *orderState, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment-captured").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(_ context.Context, o *orderState, _ wharfflow.Input) wharfflow.Outcome {
			var cs []wharfflow.Child
			for _, it := range o.Items {
				cs = append(cs, parcel.Child(parcelState{Item: it}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("shipped", cs...)
		}).
		Step("shipped", func(_ context.Context, o *orderState, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o.ID)
		}).
		Step("expire", func(_ context.Context, _ *orderState, _ wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("no payment within an hour"))
		})
	r, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Logger: testLogger(),
		Flows: []wharfflow.Definition{fx.payout, parcel, fx.order}})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return fx
}

func (fx *flowFixture) start(s wharfflow.Start) int64 {
	fx.t.Helper()
	ids, err := fx.client.Start(context.Background(), s)
	require.NoError(fx.t, err)
	return ids[0]
}

// status is an instance's status, read from the table.
func (fx *flowFixture) status(id int64) string {
	fx.t.Helper()
	var s string
	require.NoError(fx.t, fx.pool.QueryRow(context.Background(), "SELECT status FROM "+fx.schema+".flow_instances WHERE id = $1", id).Scan(&s))
	return s
}

// waitStatus waits until instance id has status (a minute as hang guard).
func (fx *flowFixture) waitStatus(id int64, status string) {
	fx.t.Helper()
	require.Eventually(fx.t, func() bool { return fx.status(id) == status }, time.Minute, 10*time.Millisecond,
		"instance %d never reached %s", id, status)
}

type flowRow struct {
	ID      int64  `json:"id"`
	Flow    string `json:"flow"`
	Key     string `json:"key"`
	Status  string `json:"status"`
	Step    string `json:"step"`
	Attempt int    `json:"attempt"`
	Error   string `json:"error"`
	// AwaitSignals: of an awaiting instance, Step runs once one comes.
	AwaitSignals []string `json:"await_signals"`
}

type flowList struct {
	Instances  []flowRow `json:"instances"`
	Limit      int       `json:"limit"`
	NextBefore int64     `json:"next_before"`
}

func listFlows(t *testing.T, a *apiClient, q string) flowList {
	t.Helper()
	code, _, body := a.do("GET", "/api/flows/instances?"+q, "")
	require.Equal(t, http.StatusOK, code, body)
	var l flowList
	require.NoError(t, json.Unmarshal([]byte(body), &l))
	return l
}

// msg is the error an API answer carries (the body itself when it has none).
func msg(body string) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) == nil && e.Error != "" {
		return e.Error
	}
	return body
}

func ids(rows []flowRow) []int64 {
	out := []int64{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// The read side of the Flows pages against real flows: counts per flow and
// status, the list filtered by flow, status and correlation key, newest
// first and paged, and an instance with its state, steps, signals, children
// and parent; bad input answered 400 and an unknown instance 404, each with
// a line that says what to send.
func TestFlowsAPIReads(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	fx := newFlowFixture(t, pool, schema)
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client)))
	defer srv.Close()
	a := newAPIClient(t, srv.URL, "tok")

	failed := fx.start(fx.payout.Start(payoutState{Cents: 500, Note: badNote}, wharfflow.StartOptions{Key: "p-1"}))
	fx.waitStatus(failed, "failed")
	shipped := fx.start(fx.order.Start(orderState{ID: "o-1", Items: []string{"book", "lamp"}}, wharfflow.StartOptions{Key: "o-1"}))
	awaiting := fx.start(fx.order.Start(orderState{ID: "o-2", Items: []string{"pen"}}, wharfflow.StartOptions{Key: "o-2"}))
	later := fx.start(fx.payout.Start(payoutState{Cents: 7}, wharfflow.StartOptions{Key: "p-2", RunAt: time.Now().Add(time.Hour)}))
	fx.waitStatus(shipped, "awaiting")
	fx.waitStatus(awaiting, "awaiting")
	_, err = fx.client.Send(context.Background(), wharfflow.Signal{Instance: shipped, Name: "payment-captured", Payload: map[string]int{"cents": 4200}, DedupKey: "psp-1"})
	require.NoError(t, err)
	fx.waitStatus(shipped, "done")

	// Counts: flow × status, the scheduled payout counted as ready and later.
	code, _, body := a.do("GET", "/api/flows", "")
	require.Equal(t, http.StatusOK, code, body)
	var sum struct {
		Available bool     `json:"available"`
		Statuses  []string `json:"statuses"`
		Flows     []struct {
			Flow   string           `json:"flow"`
			Counts map[string]int64 `json:"counts"`
			Later  int64            `json:"later"`
			Total  int64            `json:"total"`
		} `json:"flows"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &sum))
	require.True(t, sum.Available)
	require.Equal(t, wharfflow.Statuses(), sum.Statuses)
	require.Len(t, sum.Flows, 3)
	require.Equal(t, "checkout", sum.Flows[0].Flow)
	require.Equal(t, map[string]int64{"done": 1, "awaiting": 1}, sum.Flows[0].Counts)
	require.Equal(t, "parcel", sum.Flows[1].Flow)
	require.Equal(t, map[string]int64{"done": 2}, sum.Flows[1].Counts)
	require.Equal(t, "payout", sum.Flows[2].Flow)
	require.Equal(t, map[string]int64{"failed": 1, "ready": 1}, sum.Flows[2].Counts)
	require.Equal(t, int64(1), sum.Flows[2].Later)
	require.Equal(t, int64(2), sum.Flows[2].Total)

	// The list: newest first, filtered, paged.
	all := listFlows(t, a, "")
	require.Len(t, all.Instances, 6)
	for i := 1; i < len(all.Instances); i++ {
		require.Greater(t, all.Instances[i-1].ID, all.Instances[i].ID, "newest first")
	}
	require.Zero(t, all.NextBefore, "one page holds them all")
	require.Equal(t, []int64{later, failed}, ids(listFlows(t, a, "flow=payout").Instances))
	require.Equal(t, []int64{awaiting}, ids(listFlows(t, a, "flow=checkout&status=awaiting").Instances))
	aw := listFlows(t, a, "flow=checkout&status=awaiting").Instances[0]
	require.NotEmpty(t, aw.AwaitSignals, "an awaiting row says what it awaits (its step runs after)")
	require.Equal(t, []int64{shipped}, ids(listFlows(t, a, "key=o-1").Instances))
	require.Empty(t, listFlows(t, a, "flow=payout&key=o-1").Instances)
	f := listFlows(t, a, "status=failed")
	require.Equal(t, []int64{failed}, ids(f.Instances))
	require.Equal(t, "bank refused: <b>insufficient funds</b>", f.Instances[0].Error)
	require.Equal(t, "send", f.Instances[0].Step)
	p1 := listFlows(t, a, "limit=4")
	require.Len(t, p1.Instances, 4)
	require.Equal(t, p1.Instances[3].ID, p1.NextBefore)
	p2 := listFlows(t, a, "limit=4&before="+strconv.FormatInt(p1.NextBefore, 10))
	require.Equal(t, all.Instances[4:], p2.Instances, "the second page goes on where the first ended")
	require.Zero(t, p2.NextBefore)

	// Bad input: 400 with what to send.
	for _, tc := range []struct{ q, want string }{
		{"status=stuck", `status "stuck": use one of ready, running, awaiting, joining, done, failed, cancelled`},
		{"before=x", `before "x": want an instance id`},
		{"before=-3", `before "-3"`},
		{"limit=0", "from 1 to 1000"},
	} {
		code, _, body = a.do("GET", "/api/flows/instances?"+tc.q, "")
		require.Equal(t, http.StatusBadRequest, code, tc.q)
		require.Contains(t, msg(body), tc.want, tc.q)
	}

	// An instance: state, steps, consumed signal, children, result.
	var det struct {
		Instance struct {
			wharfflow.Details
		} `json:"instance"`
		Parent       *flowRow  `json:"parent"`
		Children     []flowRow `json:"children"`
		ChildrenMore bool      `json:"children_more"`
		StepsTotal   int       `json:"steps_total"`
		SignalsTotal int       `json:"signals_total"`
	}
	getInstance := func(id int64) {
		t.Helper()
		code, _, body := a.do("GET", fmt.Sprintf("/api/flows/instances/%d", id), "")
		require.Equal(t, http.StatusOK, code, body)
		det.Parent, det.Children = nil, nil
		require.NoError(t, json.Unmarshal([]byte(body), &det))
	}
	getInstance(shipped)
	d := det.Instance
	require.Equal(t, "checkout", d.Flow)
	require.Equal(t, "o-1", d.Key)
	require.Equal(t, "done", d.Status)
	require.JSONEq(t, `{"id":"o-1","items":["book","lamp"]}`, string(d.State))
	require.JSONEq(t, `"o-1"`, string(d.Result))
	var steps []string
	for _, s := range d.Steps {
		steps = append(steps, s.Step+"/"+s.Outcome)
	}
	require.Equal(t, []string{"reserve/await", "paid/spawn", "shipped/done"}, steps)
	require.Equal(t, 3, det.StepsTotal)
	require.Equal(t, 1, det.SignalsTotal)
	require.Len(t, d.Signals, 1)
	require.Equal(t, "payment-captured", d.Signals[0].Name)
	require.Equal(t, "psp-1", d.Signals[0].DedupKey)
	require.JSONEq(t, `{"cents":4200}`, string(d.Signals[0].Payload))
	require.NotNil(t, d.Signals[0].ConsumedAt)
	require.Equal(t, "paid", d.Signals[0].ConsumedStep)
	require.Len(t, det.Children, 2)
	require.False(t, det.ChildrenMore)
	require.Nil(t, det.Parent)
	child := det.Children[0]
	require.Equal(t, "parcel", child.Flow)
	require.Equal(t, "done", child.Status)

	// A child names its parent.
	getInstance(child.ID)
	require.NotNil(t, det.Parent)
	require.Equal(t, shipped, det.Parent.ID)
	require.Equal(t, "checkout", det.Parent.Flow)
	require.Empty(t, det.Children)

	// Awaiting: its signals, deadline and timeout step; a pending signal.
	_, err = fx.client.Send(context.Background(), wharfflow.Signal{Instance: awaiting, Name: "address-changed", Payload: "<b>x</b>"})
	require.NoError(t, err)
	getInstance(awaiting)
	d = det.Instance
	require.Equal(t, "awaiting", d.Status)
	require.Equal(t, []string{"payment-captured"}, d.AwaitSignals)
	require.Equal(t, "expire", d.TimeoutStep)
	require.NotNil(t, d.RunAt)
	require.WithinDuration(t, time.Now().Add(time.Hour), *d.RunAt, 5*time.Minute, "the deadline is the await's")
	require.Len(t, d.Signals, 1)
	require.Nil(t, d.Signals[0].ConsumedAt, "a signal the step does not await stays pending")

	// The scheduled payout: its time.
	getInstance(later)
	require.Equal(t, "ready", det.Instance.Status)
	require.WithinDuration(t, time.Now().Add(time.Hour), det.Instance.NotBefore, 5*time.Minute)

	// The failed payout: its error and state, the markup kept as text.
	getInstance(failed)
	require.Equal(t, "failed", det.Instance.Status)
	require.Equal(t, "bank refused: <b>insufficient funds</b>", det.Instance.Error)
	require.JSONEq(t, `{"cents":500,"note":`+strconv.Quote(badNote)+`}`, string(det.Instance.State))

	// Unknown and bad ids.
	code, _, body = a.do("GET", "/api/flows/instances/987654", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, msg(body), "no flow instance 987654 in schema "+schema)
	code, _, body = a.do("GET", "/api/flows/instances/abc", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, msg(body), `instance id "abc": want a positive number`)
	code, _, _ = a.do("GET", "/api/flows/instances/0", "")
	require.Equal(t, http.StatusBadRequest, code)
}

// The changes: retry a failed instance from its failed step (the runner
// then finishes it), cancel one with its children, send a signal that
// resumes an await; each checked in the database. An unknown instance is
// 404, one whose status refuses the change 409, a malformed body 400.
func TestFlowsAPIChanges(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	fx := newFlowFixture(t, pool, schema)
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client)))
	defer srv.Close()
	a := newAPIClient(t, srv.URL, "tok")
	ctx := context.Background()

	failed := fx.start(fx.payout.Start(payoutState{Cents: 500}, wharfflow.StartOptions{Key: "p-1"}))
	toCancel := fx.start(fx.order.Start(orderState{ID: "o-1"}, wharfflow.StartOptions{Key: "o-1"}))
	toSignal := fx.start(fx.order.Start(orderState{ID: "o-2", Items: []string{"pen"}}, wharfflow.StartOptions{Key: "o-2"}))
	fx.waitStatus(failed, "failed")
	fx.waitStatus(toCancel, "awaiting")
	fx.waitStatus(toSignal, "awaiting")

	// Retry: refused for an instance that has not failed and an unknown one.
	code, _, body := a.do("POST", "/api/flows/retry", fmt.Sprintf(`{"id":%d}`, toCancel))
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, msg(body), fmt.Sprintf("instance %d is awaiting, not failed: only a failed instance can be retried", toCancel))
	code, _, body = a.do("POST", "/api/flows/retry", `{"id":987654}`)
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, msg(body), "no flow instance 987654")
	fx.pay.Store(true)
	code, _, body = a.do("POST", "/api/flows/retry", fmt.Sprintf(`{"id":%d}`, failed))
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"retried":1}`, body)
	fx.waitStatus(failed, "done")
	d, err := fx.client.Get(ctx, failed)
	require.NoError(t, err)
	require.Len(t, d.Steps, 2)
	require.Equal(t, "send", d.Steps[1].Step, "the retry ran the failed step again")
	require.Equal(t, 0, d.Steps[1].Attempt)
	require.JSONEq(t, `{"paid":500}`, string(d.Result))

	// Signal: resumes the await, which spawns a child.
	code, _, body = a.do("POST", "/api/flows/signal", fmt.Sprintf(`{"id":%d,"name":"payment-captured","payload":{"cents":99},"dedup_key":"evt-1"}`, toSignal))
	require.Equal(t, http.StatusOK, code, body)
	var sig struct{ Signal int64 }
	require.NoError(t, json.Unmarshal([]byte(body), &sig))
	require.Positive(t, sig.Signal)
	fx.waitStatus(toSignal, "done")
	d, err = fx.client.Get(ctx, toSignal)
	require.NoError(t, err)
	require.Len(t, d.Signals, 1)
	require.Equal(t, sig.Signal, d.Signals[0].ID)
	require.JSONEq(t, `{"cents":99}`, string(d.Signals[0].Payload))
	require.Equal(t, "evt-1", d.Signals[0].DedupKey)
	code, _, body = a.do("POST", "/api/flows/signal", fmt.Sprintf(`{"id":%d,"name":"payment-captured"}`, toSignal))
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, msg(body), "has ended (done): signals go to instances that have not ended")
	code, _, body = a.do("POST", "/api/flows/signal", fmt.Sprintf(`{"id":%d,"name":"  "}`, toCancel))
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, msg(body), "the signal needs a name")
	code, _, body = a.do("POST", "/api/flows/signal", fmt.Sprintf(`{"id":%d,"name":"x","payload":{bad}}`, toCancel))
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, msg(body), "request body")
	code, _, body = a.do("POST", "/api/flows/signal", `{"id":987654,"name":"x"}`)
	require.Equal(t, http.StatusNotFound, code, body)

	// Cancel: once, then refused.
	code, _, body = a.do("POST", "/api/flows/cancel", fmt.Sprintf(`{"id":%d}`, toCancel))
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"cancelled":1}`, body)
	require.Equal(t, "cancelled", fx.status(toCancel))
	code, _, body = a.do("POST", "/api/flows/cancel", fmt.Sprintf(`{"id":%d}`, toCancel))
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, msg(body), "has already ended (cancelled)")

	// Malformed bodies.
	for _, b := range []string{`{}`, `{"id":0}`, `{"id":"7"}`, `{"instance":7}`, `[`, `{"id":7,"ids":[7]}`} {
		code, _, body = a.do("POST", "/api/flows/retry", b)
		require.Equal(t, http.StatusBadRequest, code, b)
		require.Contains(t, msg(body), `send {"id": <instance id>} or {"ids": [<instance id>, ...]}`, b)
	}
	code, _, body = a.do("POST", "/api/flows/cancel", `{"ids":[7]}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, msg(body), "only a retry takes several instances")
	code, _, body = a.do("POST", "/api/flows/retry", `{"ids":[7,-1]}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, msg(body), "id -1: instance ids are positive numbers")

	// Retry several: the failed ones run again, the others are named.
	fx.pay.Store(false)
	more := []int64{
		fx.start(fx.payout.Start(payoutState{Cents: 2}, wharfflow.StartOptions{})),
		fx.start(fx.payout.Start(payoutState{Cents: 3}, wharfflow.StartOptions{})),
	}
	for _, id := range more {
		fx.waitStatus(id, "failed")
	}
	fx.pay.Store(true)
	code, _, body = a.do("POST", "/api/flows/retry", fmt.Sprintf(`{"ids":[%d,%d,%d,987654]}`, more[0], toCancel, more[1]))
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, fmt.Sprintf(`{"retried":2,"skipped":[%d,987654]}`, toCancel), body)
	for _, id := range more {
		fx.waitStatus(id, "done")
	}
	code, _, _ = a.do("GET", "/api/flows/retry", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
}

// The flow changes pass the console's gate like the dead-letter ones: the
// token, the same-origin check, JSON only, and nothing on a read-only
// console (which still reads).
func TestFlowsAPIAuthorisation(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	fx := newFlowFixture(t, pool, schema)
	mux := http.NewServeMux()
	mux.Handle("/rw/", http.StripPrefix("/rw", wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client))))
	mux.Handle("/ro/", http.StripPrefix("/ro", wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithReadOnly(true), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	failed := fx.start(fx.payout.Start(payoutState{Cents: 1}, wharfflow.StartOptions{}))
	awaiting := fx.start(fx.order.Start(orderState{ID: "o-1"}, wharfflow.StartOptions{}))
	fx.waitStatus(failed, "failed")
	fx.waitStatus(awaiting, "awaiting")
	fx.pay.Store(true) // a retry that got through would finish the payout
	retry := fmt.Sprintf(`{"id":%d}`, failed)
	cancel := fmt.Sprintf(`{"id":%d}`, awaiting)
	signal := fmt.Sprintf(`{"id":%d,"name":"payment-captured"}`, awaiting)

	anon := newAPIClient(t, srv.URL, "")
	wrong := newAPIClient(t, srv.URL, "tok-2")
	a := newAPIClient(t, srv.URL, "tok")
	for _, p := range []string{"/rw/api/flows", "/rw/api/flows/instances", fmt.Sprintf("/rw/api/flows/instances/%d", failed)} {
		code, _, _ := anon.do("GET", p, "")
		require.Equal(t, http.StatusUnauthorized, code, p)
	}
	refused := func(who *apiClient, path, body string, status int, want string, hdr ...string) {
		t.Helper()
		code, _, got := who.do("POST", path, body, hdr...)
		require.Equal(t, status, code, "%s %s: %s", path, body, got)
		require.Contains(t, msg(got), want)
	}
	for _, ch := range []struct{ path, body string }{{"retry", retry}, {"cancel", cancel}, {"signal", signal}} {
		p := "/rw/api/flows/" + ch.path
		refused(anon, p, ch.body, http.StatusUnauthorized, "needs its token")
		refused(wrong, p, ch.body, http.StatusUnauthorized, "needs its token")
		refused(a, p, ch.body, http.StatusForbidden, "cross-origin", "Sec-Fetch-Site", "cross-site")
		refused(a, p, ch.body, http.StatusForbidden, "cross-origin", "Origin", "https://evil.example")
		refused(a, p, ch.body, http.StatusUnsupportedMediaType, "Content-Type: application/json", "Content-Type", "text/plain")
		refused(a, "/ro/api/flows/"+ch.path, ch.body, http.StatusForbidden, "read-only")
	}
	require.Equal(t, "failed", fx.status(failed), "no refused retry went through")
	require.Equal(t, "awaiting", fx.status(awaiting), "no refused cancel or signal went through")
	d, err := fx.client.Get(context.Background(), awaiting)
	require.NoError(t, err)
	require.Empty(t, d.Signals)

	// Read-only still reads.
	code, _, body := a.do("GET", fmt.Sprintf("/ro/api/flows/instances/%d", failed), "")
	require.Equal(t, http.StatusOK, code, body)
	code, _, body = a.do("GET", "/ro/api/config", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, msg(body), `"read_only":true`)

	// The same change from the console's own origin goes through.
	refused(a, "/rw/api/flows/retry", retry, http.StatusOK, "retried", "Sec-Fetch-Site", "same-origin")
	fx.waitStatus(failed, "done")
}

// On a schema without the flow tables (migrated before migration 7), a
// console without WithFlows or with a flows client of another schema, the
// Flows page says so; nothing answers 500.
// (The outbox pages of a schema that old ask for wharf migrate up: the
// outbox needs version 7 too.)
func TestFlowsAPIWithoutFlowTables(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.DownTo(context.Background(), pool, 6)
	require.NoError(t, err)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	fc, err := wharfflow.NewClient(pool, schema)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/old/", http.StripPrefix("/old", wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fc))))
	pool2, schema2 := newSchema(t)
	c2, err := wharf.NewClient(pool2, &wharf.Config{Schema: schema2, Logger: testLogger()})
	require.NoError(t, err)
	mux.Handle("/none/", http.StripPrefix("/none", wharfconsole.Handler(c2, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()))))
	mux.Handle("/other/", http.StripPrefix("/other", wharfconsole.Handler(c2, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fc))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	a := newAPIClient(t, srv.URL, "tok")

	for prefix, want := range map[string]string{
		"/old":   "flows are not set up in schema " + schema + ": their tables come with migration 7 (wharf migrate up)",
		"/none":  "this console was started without flows",
		"/other": "the console's flows client is for schema " + schema + ", the console for " + schema2,
	} {
		code, _, body := a.do("GET", prefix+"/api/flows", "")
		require.Equal(t, http.StatusOK, code, body)
		var s struct {
			Available bool   `json:"available"`
			Message   string `json:"message"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &s))
		require.False(t, s.Available)
		require.Contains(t, s.Message, want)
		for _, req := range [][2]string{{"GET", "/api/flows/instances"}, {"GET", "/api/flows/instances/1"}, {"POST", "/api/flows/retry"}, {"POST", "/api/flows/signal"}} {
			body := ""
			if req[0] == "POST" {
				body = `{"id":1,"name":"x"}`
			}
			code, _, got := a.do(req[0], prefix+req[1], body)
			require.Equal(t, http.StatusNotFound, code, "%s %s%s: %s", req[0], prefix, req[1], got)
			require.Contains(t, msg(got), want)
		}
	}
	// The outbox pages of the console without flows work.
	code, _, body := a.do("GET", "/none/api/status", "")
	require.Equal(t, http.StatusOK, code, body)
}

// An instance that ran more steps than the page lists comes with the last
// 500 and the total.
func TestFlowsAPIListsTheLatestSteps(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	type counter struct{ N int }
	loop := wharfflow.New[counter]("loop", nil).
		Step("tick", func(_ context.Context, s *counter, _ wharfflow.Input) wharfflow.Outcome {
			if s.N++; s.N < 520 {
				return wharfflow.Next("tick")
			}
			return wharfflow.Done(s.N)
		})
	fx := &flowFixture{t: t, pool: pool, schema: schema}
	fx.client, err = wharfflow.NewClient(pool, schema)
	require.NoError(t, err)
	r, err := wharfflow.NewRunner(pool, &wharfflow.Config{Schema: schema, Logger: testLogger(), Flows: []wharfflow.Definition{loop}})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	}()
	id := fx.start(loop.Start(counter{}, wharfflow.StartOptions{}))
	fx.waitStatus(id, "done")
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client)))
	defer srv.Close()
	code, _, body := newAPIClient(t, srv.URL, "").do("GET", fmt.Sprintf("/api/flows/instances/%d", id), "")
	require.Equal(t, http.StatusOK, code, body)
	var det struct {
		Instance   wharfflow.Details `json:"instance"`
		StepsTotal int               `json:"steps_total"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &det))
	require.Equal(t, 520, det.StepsTotal)
	require.Len(t, det.Instance.Steps, 500)
	require.Equal(t, "done", det.Instance.Steps[499].Outcome, "the latest step is listed")
}

// A console whose database role may not read the flow tables says so on
// the Flows page; one that may read but not change them answers a change
// 403 naming the privilege. Nothing changes.
func TestFlowsAPIWithARoleWithoutFlowPrivileges(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	fx := newFlowFixture(t, pool, schema)
	failed := fx.start(fx.payout.Start(payoutState{Cents: 1}, wharfflow.StartOptions{}))
	fx.waitStatus(failed, "failed")

	role := "wcon_reader_" + schema[len("wcon_"):]
	_, err := pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	_, err = pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SET ROLE "+role)
		return err
	}
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer rolePool.Close()
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	fc, err := wharfflow.NewClient(rolePool, schema)
	require.NoError(t, err)
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fc)))
	defer srv.Close()
	a := newAPIClient(t, srv.URL, "tok")

	code, _, body := a.do("GET", "/api/flows", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"available":false`)
	var s struct{ Message string }
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	require.Contains(t, s.Message, "the console's database role "+role+" may not read the flow tables of schema "+schema)
	code, _, body = a.do("POST", "/api/flows/retry", fmt.Sprintf(`{"id":%d}`, failed))
	require.Equal(t, http.StatusNotFound, code, body)

	// Reading but not changing.
	_, err = pool.Exec(ctx, "GRANT SELECT ON "+schema+".flow_instances, "+schema+".flow_steps, "+schema+".flow_signals TO "+role)
	require.NoError(t, err)
	code, _, body = a.do("GET", fmt.Sprintf("/api/flows/instances/%d", failed), "")
	require.Equal(t, http.StatusOK, code, body)
	code, _, body = a.do("POST", "/api/flows/retry", fmt.Sprintf(`{"id":%d}`, failed))
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, msg(body), "the console's database role may not do this: permission denied")
	require.Equal(t, "failed", fx.status(failed))
}
