package wharfwebhook

import (
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// Each mode's requests, as an HTTP server received them, decode as the
// CloudEvents HTTP binding says (binary, structured, and the batched format
// in batch mode), with every attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured", "structured&wharf_mode=batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, nil)
			s := openURL(t, srv.URL+"/in/{{topic}}?wharf_allow_private=true&wharf_ce_source=urn:svc:orders&wharf_ce="+mode)
			cases := cereader.Cases("orders", int64(100*i+1))
			if errs := publish(t, s, cereader.Messages(cases)...); errs != nil {
				t.Fatal(errs)
			}
			reqs := srv.requests()
			if mode != "binary" && mode != "structured" {
				if len(reqs) != 1 {
					t.Fatalf("%d requests, want one batch", len(reqs))
				}
				if ct := reqs[0].header.Get("Content-Type"); ct != "application/cloudevents-batch+json; charset=UTF-8" {
					t.Errorf("batch Content-Type %q", ct)
				}
				evs, err := cereader.JSONBatch(reqs[0].body)
				if err != nil {
					t.Fatal(err)
				}
				if len(evs) != len(cases) {
					t.Fatalf("batch of %d events, want %d", len(evs), len(cases))
				}
				for j, ev := range evs {
					cereader.Check(t, ev, cases[j], "urn:svc:orders", true)
				}
				return
			}
			if len(reqs) != len(cases) {
				t.Fatalf("%d requests, want %d", len(reqs), len(cases))
			}
			byID := map[string]request{}
			for _, r := range reqs {
				byID[r.header.Get("webhook-id")] = r
			}
			for _, tc := range cases {
				r, ok := byID[tc.Msg.ID]
				if !ok {
					t.Fatalf("no request with webhook-id %s", tc.Msg.ID)
				}
				ev, err := cereader.HTTP(r.header, r.body)
				if err != nil {
					t.Fatalf("message %s: %v (headers %v)", tc.Msg.ID, err, r.header)
				}
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if r.header.Get(HeaderKey) != tc.Msg.Key {
					t.Errorf("message %s: %s %q, want %q", tc.Msg.ID, HeaderKey, r.header.Get(HeaderKey), tc.Msg.Key)
				}
			}
		})
	}
}
