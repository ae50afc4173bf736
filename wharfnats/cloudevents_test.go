package wharfnats

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// Each mode's messages, read back from the stream, decode as the CloudEvents
// NATS binding says, with every attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			w, s := newWorldWith(t, sharedURL, "ce="+mode+"&ce_source=urn:svc:orders")
			cases := cereader.Cases("orders", int64(100*i+1))
			if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
				t.Fatalf("Publish: %v", errs)
			}
			nc := requireServer(t, w.url)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
			defer cancel()
			st, err := js.Stream(ctx, w.stream)
			if err != nil {
				t.Fatal(err)
			}
			for j, tc := range cases {
				m, err := st.GetMsg(ctx, uint64(j+1))
				if err != nil {
					t.Fatalf("get #%d: %v", j+1, err)
				}
				ev, err := cereader.NATS(m.Header, m.Data)
				if err != nil {
					t.Fatalf("message #%d: %v (headers %v)", j+1, err, m.Header)
				}
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if got := m.Header.Get(jetstream.MsgIDHeader); got != tc.Msg.ID {
					t.Errorf("Nats-Msg-Id %q, want %q", got, tc.Msg.ID)
				}
				if mode == "binary" && tc.Msg.Key == "clé 1" {
					if got := m.Header["ce-subject"]; len(got) != 1 || got[0] != "cl%C3%A9%201" {
						t.Errorf("ce-subject header %q, want it percent-encoded as cl%%C3%%A9%%201", got)
					}
				}
			}
		})
	}
}
