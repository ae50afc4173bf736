package wharfpubsub

import (
	"context"
	"strings"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// pubsubEvent reads a stored Pub/Sub message as the CloudEvents Pub/Sub
// binding tells a receiver to: structured when the Content-Type attribute
// starts with application/cloudevents (the data is then the JSON event),
// binary otherwise, with the attributes from the attributes prefixed "ce-"
// (any case) and datacontenttype from Content-Type.
func pubsubEvent(attrs map[string]string, data []byte) (cereader.Event, error) {
	ct, hasCT := "", false
	for k, v := range attrs {
		if strings.EqualFold(k, "Content-Type") {
			ct, hasCT = v, true
		}
	}
	if strings.HasPrefix(strings.ToLower(ct), "application/cloudevents") {
		return cereader.JSON(data)
	}
	ev := cereader.Event{Attrs: map[string]string{}, Data: data}
	for k, v := range attrs {
		if len(k) > 3 && strings.EqualFold(k[:3], "ce-") {
			ev.Attrs[strings.ToLower(k[3:])] = v
		}
	}
	if hasCT {
		ev.Attrs["datacontenttype"] = ct
	}
	return ev, nil
}

// Each mode's messages, as pstest stored them, decode as the CloudEvents
// Pub/Sub binding says, with every attribute Wharf sets; the wharf
// attributes, the ordering key and the other headers are still there.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			topicID := "ce-" + randomID()
			w := newWorld(t, false, topicID)
			s, err := New(w.client, Options{TopicTemplate: topicID, CloudEvents: mode, CloudEventsSource: "urn:svc:orders"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			cases := cereader.Cases("orders", int64(100*i+1))
			if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
				t.Fatalf("Publish: %v", errs)
			}
			stored := w.srv.Messages()
			if len(stored) != len(cases) {
				t.Fatalf("pstest holds %d messages, want %d", len(stored), len(cases))
			}
			for _, tc := range cases {
				found := false
				for _, m := range stored {
					if m.Attributes[AttrID] != tc.Msg.ID {
						continue
					}
					found = true
					ev, err := pubsubEvent(m.Attributes, m.Data)
					if err != nil {
						t.Fatalf("message %s: %v (attributes %v)", tc.Msg.ID, err, m.Attributes)
					}
					cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
					if m.Attributes[AttrTopic] != tc.Msg.Topic || m.Attributes[AttrKey] != tc.Msg.Key || m.OrderingKey != tc.Msg.Key {
						t.Errorf("message %s: wharf-topic %q wharf-key %q ordering key %q, want them as without CloudEvents", tc.Msg.ID, m.Attributes[AttrTopic], m.Attributes[AttrKey], m.OrderingKey)
					}
					for k, v := range tc.Msg.Headers {
						if strings.EqualFold(k, "content-type") {
							continue // datacontenttype, checked above
						}
						if m.Attributes[k] != v {
							t.Errorf("message %s: header %s = %q, want %q", tc.Msg.ID, k, m.Attributes[k], v)
						}
					}
					if mode == "structured" {
						if got := m.Attributes[AttrContentType]; got != "application/cloudevents+json; charset=UTF-8" {
							t.Errorf("message %s: Content-Type attribute %q", tc.Msg.ID, got)
						}
						for k := range m.Attributes {
							if strings.HasPrefix(strings.ToLower(k), "ce-") {
								t.Errorf("message %s: structured mode sent attribute %s", tc.Msg.ID, k)
							}
						}
					}
				}
				if !found {
					t.Fatalf("no stored message %s", tc.Msg.ID)
				}
			}
		})
	}
}
