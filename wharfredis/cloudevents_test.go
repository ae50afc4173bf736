package wharfredis

import (
	"context"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// Each mode's entries, read back from the stream, decode by the field
// layout the package documents (Redis has no CloudEvents binding), with
// every attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			w, s := newWorld(t, sharedURL(), "ce="+mode+"&ce_source=urn:svc:orders")
			cases := cereader.Cases("orders", int64(100*i+1))
			requireAcked(t, publish(t, s, cereader.Messages(cases)))
			ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
			defer cancel()
			entries, err := w.admin.XRange(ctx, w.stream("orders"), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != len(cases) {
				t.Fatalf("stream holds %d entries, want %d", len(entries), len(cases))
			}
			for j, e := range entries {
				fields := map[string]string{}
				for k, v := range e.Values {
					fields[k], _ = v.(string)
				}
				ev, err := cereader.Redis(fields)
				if err != nil {
					t.Fatalf("entry %d: %v (fields %v)", j, err, fields)
				}
				tc := cases[j]
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if fields[FieldID] != tc.Msg.ID || fields[FieldKey] != tc.Msg.Key {
					t.Errorf("entry %d: id %q key %q, want %q %q", j, fields[FieldID], fields[FieldKey], tc.Msg.ID, tc.Msg.Key)
				}
				if _, ok := fields[HeaderPrefix+"Content-Type"]; ok {
					t.Errorf("entry %d: the message's content-type header was written besides the event's", j)
				}
			}
		})
	}
}
