package wharfconsole_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
)

// The pending list marks a message queued behind a scheduled message of its
// key as "held", naming the message it waits behind and until when; the
// key's first message is "scheduled" and another key's message "due".
func TestPendingAPISaysWhatAHeldMessageWaitsFor(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger())))
	defer srv.Close()

	later := time.Now().Add(time.Hour)
	head := enqueueOne(t, c, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`), DeliverAt: later})
	held := enqueueOne(t, c, wharf.Message{Topic: "t", Key: "k", Payload: []byte(`2`)})
	due := enqueueOne(t, c, wharf.Message{Topic: "t", Key: "other", Payload: []byte(`3`)})

	code, _, body := newAPIClient(t, srv.URL, "tok").do("GET", "/api/pending", "")
	require.Equal(t, http.StatusOK, code, body)
	var r struct {
		Messages []struct {
			ID         string `json:"id"`
			State      string `json:"state"`
			HeldBehind *struct {
				ID     string    `json:"id"`
				Seq    int64     `json:"seq"`
				Reason string    `json:"reason"`
				Until  time.Time `json:"until"`
			} `json:"held_behind"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	require.Len(t, r.Messages, 3)
	require.Equal(t, head, r.Messages[0].ID)
	require.Equal(t, "scheduled", r.Messages[0].State)
	require.Nil(t, r.Messages[0].HeldBehind)
	require.Equal(t, held, r.Messages[1].ID)
	require.Equal(t, "held", r.Messages[1].State)
	require.NotNil(t, r.Messages[1].HeldBehind)
	require.Equal(t, head, r.Messages[1].HeldBehind.ID)
	require.Equal(t, "scheduled", r.Messages[1].HeldBehind.Reason)
	require.WithinDuration(t, later, r.Messages[1].HeldBehind.Until, time.Millisecond)
	require.Equal(t, due, r.Messages[2].ID)
	require.Equal(t, "due", r.Messages[2].State)
}

// The status carries the outbox table's insert and delete counters (for the
// enqueue and leave rates) and the history of earlier requests, so a page
// opened now starts with the last minutes.
func TestStatusAPIKeepsAHistoryAndTheRowCounters(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(wharfconsole.Handler(c, wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger())))
	defer srv.Close()
	a := newAPIClient(t, srv.URL, "tok")
	type point struct {
		Time     time.Time `json:"time"`
		Messages int64     `json:"messages"`
		Inserted int64     `json:"inserted"`
	}
	var st struct {
		Inserted int64   `json:"inserted"`
		Deleted  int64   `json:"deleted"`
		History  []point `json:"history"`
	}
	get := func() {
		code, _, body := a.do("GET", "/api/status", "")
		require.Equal(t, http.StatusOK, code, body)
		st.History = nil
		require.NoError(t, json.Unmarshal([]byte(body), &st))
	}
	get()
	require.Empty(t, st.History, "the first request has no history before it")

	for i := 0; i < 3; i++ {
		enqueueOne(t, c, wharf.Message{Topic: "t", Payload: []byte(`1`)})
	}
	// The statistics counters reach pg_stat_user_tables a moment after the
	// commits: wait for them.
	require.Eventually(t, func() bool { get(); return st.Inserted >= 3 }, 60*time.Second, 100*time.Millisecond)
	require.NotEmpty(t, st.History)
	require.Equal(t, int64(0), st.History[0].Messages, "the first point saw the empty outbox")
	for i := 1; i < len(st.History); i++ {
		require.GreaterOrEqual(t, st.History[i].Time.Sub(st.History[i-1].Time), time.Second, "at most a point a second")
	}
}
