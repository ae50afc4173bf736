package wharfmqtt

import (
	"context"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// Each mode's PUBLISHes, as a subscriber got them, decode as the CloudEvents
// MQTT binding says (MQTT 5: user properties and Content Type), with every
// attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, sharedAddr())
			s := w.openSink(t, "ce="+mode, "ce_source=urn:svc:orders")
			cases := cereader.Cases("orders", int64(100*i+1))
			if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
				t.Fatalf("Publish: %v", errs)
			}
			got := w.sub.wait(len(cases), adminTimeout)
			if len(got) != len(cases) {
				t.Fatalf("got %d messages, want %d", len(got), len(cases))
			}
			byID := map[string]received{}
			for _, r := range got {
				if mode == "binary" {
					byID[r.props["id"]] = r
				} else {
					byID[r.props[PropertyMessageID]] = r
				}
			}
			for _, tc := range cases {
				r, ok := byID[tc.Msg.ID]
				if !ok {
					t.Fatalf("no message %s among %v", tc.Msg.ID, got)
				}
				ev, err := cereader.MQTT(r.props, r.contentType, r.payload)
				if err != nil {
					t.Fatalf("message %s: %v (properties %v, content type %q)", tc.Msg.ID, err, r.props, r.contentType)
				}
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if mode == "binary" {
					// The binding reads every user property as an attribute:
					// there must be no others.
					for k := range r.props {
						switch k {
						case "specversion", "id", "source", "type", "subject", "time", "traceparent", "tracestate":
						default:
							t.Errorf("message %s: user property %q is not a CloudEvents attribute", tc.Msg.ID, k)
						}
					}
				} else if r.props[PropertyKey] != tc.Msg.Key {
					t.Errorf("message %s: %s %q, want %q", tc.Msg.ID, PropertyKey, r.props[PropertyKey], tc.Msg.Key)
				}
			}
		})
	}
}
