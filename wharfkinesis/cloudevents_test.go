package wharfkinesis

import (
	"context"
	"strings"
	"testing"

	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// With ce=structured each record, as a consumer reads it from the stream,
// is the JSON event with every attribute Wharf sets; binary mode, which a
// record cannot carry, is refused.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	srv := awstest.StartKinesalite(t)
	c := client(t, srv, srv.Endpoint)
	stream := "ce" + randomID()
	createStream(t, c, stream)
	s, err := New(c, Options{StreamTemplate: stream, CloudEvents: "structured", CloudEventsSource: "urn:svc:orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cases := cereader.Cases("orders", 1)
	if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	events := map[string]cereader.Event{}
	for _, data := range readAll(t, c, stream) {
		ev, err := cereader.JSON(data)
		if err != nil {
			t.Fatalf("record %q: %v", data, err)
		}
		events[ev.Attrs["id"]] = ev
	}
	if len(events) != len(cases) {
		t.Fatalf("the stream holds %d events, want %d", len(events), len(cases))
	}
	for _, tc := range cases {
		ev, ok := events[tc.Msg.ID]
		if !ok {
			t.Fatalf("no record of message %s", tc.Msg.ID)
		}
		cereader.Check(t, ev, tc, "urn:svc:orders", true)
	}

	for _, opts := range []Options{
		{StreamTemplate: stream, CloudEvents: "binary"},
		{StreamTemplate: stream, CloudEvents: "structured", Format: FormatRaw},
		{StreamTemplate: stream, CloudEventsSource: "/s"},
	} {
		if _, err := New(c, opts); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("New(%+v) = %v, want a one-line error", opts, err)
		}
	}
	if _, err := New(c, Options{StreamTemplate: stream, CloudEvents: "binary"}); err == nil || !strings.Contains(err.Error(), "use ce=structured") {
		t.Errorf("New with binary mode: %v, want it to say to use ce=structured", err)
	}
}
