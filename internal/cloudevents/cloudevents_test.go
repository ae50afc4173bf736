package cloudevents_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

func TestNewConfig(t *testing.T) {
	t.Parallel()
	c, err := cloudevents.NewConfig("binary", "")
	if err != nil || c.Mode != cloudevents.Binary || c.Source != cloudevents.DefaultSource {
		t.Fatalf("NewConfig(binary) = %+v, %v", c, err)
	}
	if c, err := cloudevents.NewConfig("", ""); err != nil || c.On() {
		t.Fatalf("NewConfig('') = %+v, %v; want off", c, err)
	}
	for _, bad := range [][2]string{{"binry", ""}, {"Binary", ""}, {"", "/x"}, {"structured", "has space"}, {"binary", "%zz"}} {
		_, err := cloudevents.NewConfig(bad[0], bad[1])
		if err == nil {
			t.Errorf("NewConfig(%q, %q) accepted", bad[0], bad[1])
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("NewConfig(%q, %q): error on several lines: %v", bad[0], bad[1], err)
		}
	}
}

// The example of the HTTP and NATS bindings.
func TestPercentEncode(t *testing.T) {
	t.Parallel()
	if got, want := cloudevents.PercentEncode("Euro € 😀"), "Euro%20%E2%82%AC%20%F0%9F%98%80"; got != want {
		t.Fatalf("PercentEncode = %q, want %q", got, want)
	}
	if got := cloudevents.PercentEncode(`a"b%c`); got != "a%22b%25c" {
		t.Fatalf("PercentEncode = %q", got)
	}
}

// HTTP is the binding whose reading rules are the richest (case-insensitive
// names, percent-decoding, both modes, batches): encode with it and read back
// with the independent reader. The sinks' own tests do the same through
// their brokers for every binding.
func TestHTTPRoundTrip(t *testing.T) {
	t.Parallel()
	cases := cereader.Cases("orders", 10)
	for _, mode := range []string{"binary", "structured"} {
		c, err := cloudevents.NewConfig(mode, "urn:svc:orders")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases {
			enc, err := c.Encode(tc.Msg, cloudevents.HTTP)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			for k, v := range tc.Msg.Headers {
				if !enc.Replaces(k) {
					h.Set(k, v)
				}
			}
			for _, a := range enc.Headers {
				h.Set(a.Name, a.Value)
			}
			h.Set("Content-Type", enc.ContentType)
			ev, err := cereader.HTTP(h, enc.Body)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
		}
	}
	c, _ := cloudevents.NewConfig("structured", "")
	body, err := c.AppendBatch(nil, cereader.Messages(cases))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := cereader.JSONBatch(body)
	if err != nil || len(evs) != len(cases) {
		t.Fatalf("batch: %d events, %v", len(evs), err)
	}
	for i, ev := range evs {
		cereader.Check(t, ev, cases[i], cloudevents.DefaultSource, true)
	}
}

func TestRefusesWhatCannotBeAnAttribute(t *testing.T) {
	t.Parallel()
	c, _ := cloudevents.NewConfig("binary", "")
	for _, m := range []*wharf.Message{
		{ID: "x", Topic: "t", Key: "a\nb"},
		{ID: "x", Topic: "t\xff"},
		{ID: "x", Topic: "t", Headers: map[string]string{"content-type": "not a type"}},
	} {
		if _, err := c.Encode(m, cloudevents.Kafka); err == nil {
			t.Errorf("Encode(%+v) accepted", m)
		}
	}
}
