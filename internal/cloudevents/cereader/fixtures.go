package cereader

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// Case is a message a sink test sends as a CloudEvent, with the
// datacontenttype it must carry.
type Case struct {
	Msg             *wharf.Message
	DataContentType string
}

// enqueued is a fixed enqueue time with microseconds, as the database gives.
var enqueued = time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.UTC)

// Cases returns three messages of topic covering the attribute rules: a
// keyed JSON payload with a trace context and a key that needs
// percent-encoding in HTTP and NATS headers, an unkeyed binary payload, and
// a keyed text payload with its own content-type header. ids are made from
// seq..seq+2 so that every test's messages differ.
func Cases(topic string, seq int64) []Case {
	return []Case{
		{Msg: &wharf.Message{
			ID: wharf.FormatID(seq, 0x1234), Seq: seq, Topic: topic, Key: "clé 1", Payload: []byte(`{"n":1}`),
			Headers: map[string]string{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"tracestate":  "rojo=00f067aa0ba902b7",
				"app":         "x",
			},
			CreatedAt: enqueued,
		}, DataContentType: "application/json"},
		{Msg: &wharf.Message{
			ID: wharf.FormatID(seq+1, 0x1234), Seq: seq + 1, Topic: topic, Payload: []byte{0, 1, 2, 0xff},
			CreatedAt: enqueued.Add(time.Second),
		}, DataContentType: "application/octet-stream"},
		{Msg: &wharf.Message{
			ID: wharf.FormatID(seq+2, 0x1234), Seq: seq + 2, Topic: topic, Key: "k2", Payload: []byte("hello"),
			Headers:   map[string]string{"Content-Type": "text/plain; charset=utf-8"},
			CreatedAt: enqueued.Add(2 * time.Second),
		}, DataContentType: "text/plain; charset=utf-8"},
	}
}

// Messages returns the cases' messages.
func Messages(cases []Case) []*wharf.Message {
	out := make([]*wharf.Message, len(cases))
	for i, c := range cases {
		out[i] = c.Msg
	}
	return out
}

// Check fails t unless e is c's message as a CloudEvent from source in the
// given mode: every attribute Wharf sets has the documented value, subject
// is absent for a message without a key, and the data is the payload.
func Check(t testing.TB, e Event, c Case, source string, structured bool) {
	t.Helper()
	m := c.Msg
	if e.Structured != structured {
		t.Errorf("message %s: structured=%v, want %v", m.ID, e.Structured, structured)
	}
	want := map[string]string{
		"specversion":     "1.0",
		"id":              m.ID,
		"source":          source,
		"type":            m.Topic,
		"time":            m.CreatedAt.UTC().Format(time.RFC3339Nano),
		"datacontenttype": c.DataContentType,
	}
	if m.Key != "" {
		want["subject"] = m.Key
	}
	for k, v := range m.Headers {
		if k == "traceparent" || k == "tracestate" {
			want[k] = v
		}
	}
	for k, v := range want {
		if got, ok := e.Attrs[k]; !ok || got != v {
			t.Errorf("message %s: attribute %s = %q (present %v), want %q", m.ID, k, got, ok, v)
		}
	}
	for _, k := range []string{"subject", "traceparent", "tracestate"} {
		if _, ok := want[k]; !ok {
			if v, ok := e.Attrs[k]; ok {
				t.Errorf("message %s: attribute %s = %q, want it absent", m.ID, k, v)
			}
		}
	}
	if tm, err := time.Parse(time.RFC3339Nano, e.Attrs["time"]); err != nil || !tm.Equal(m.CreatedAt) {
		t.Errorf("message %s: time %q is not the enqueue time %s", m.ID, e.Attrs["time"], m.CreatedAt)
	}
	if !bytes.Equal(e.Data, m.Payload) {
		t.Errorf("message %s: data %q, want the payload %q", m.ID, e.Data, m.Payload)
	}
}

// Describe is a one-line summary of e for failure messages.
func Describe(e Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "structured=%v", e.Structured)
	for k, v := range e.Attrs {
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	return b.String()
}
