package wharfwebhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/wharfhq/wharf"
)

// In single mode a message header that would carry a credential, that HTTP
// reserves, or that the sink sets itself fails the message permanently,
// whatever its case, naming the header and batch mode; nothing is sent for it
// or for the later messages of its key. Batch mode carries the same headers
// in the body.
func TestRefusedMessageHeaders(t *testing.T) {
	t.Parallel()
	refused := []string{
		"Authorization", "authorization", "PROXY-AUTHORIZATION", "Cookie", "cookie",
		"Host", "hOsT", "Connection", "keep-alive", "Proxy-Connection", "Proxy-Authenticate",
		"TE", "Trailer", "transfer-encoding", "Upgrade", "Expect", "content-length", "Content-Length",
		"webhook-id", "Webhook-Signature", "WEBHOOK-TIMESTAMP", "webhook-anything",
		"wharf-topic", "Wharf-Key", "WHARF-TENANT",
	}
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/?wharf_allow_private=true")
	var msgs []*wharf.Message
	for i, h := range refused {
		key := fmt.Sprintf("k%d", i)
		m := msg(int64(2*i+1), "t", key, "{}")
		m.Headers = map[string]string{"X-Fine": "1", h: "v"}
		msgs = append(msgs, m, msg(int64(2*i+2), "t", key, "{}"))
	}
	good := msg(1000, "t", "good", "{}")
	good.Headers = map[string]string{"X-Fine": "1", "user-agent": "app/2", "Content-Type": "application/cloudevents+json; charset=utf-8", "Accept": "*/*"}
	msgs = append(msgs, good)
	errs := publish(t, s, msgs...)
	for i, h := range refused {
		err := errAt(errs, 2*i)
		if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), fmt.Sprintf("header %q", h)) || !strings.Contains(err.Error(), "wharf_mode=batch") || strings.Contains(err.Error(), "\n") {
			t.Errorf("header %s: %v, want a one-line permanent error naming it and batch mode", h, err)
		}
		if !errors.Is(errAt(errs, 2*i+1), wharf.ErrNotAttempted) {
			t.Errorf("header %s: the next message of the key: %v, want ErrNotAttempted", h, errAt(errs, 2*i+1))
		}
	}
	if err := errAt(errs, len(msgs)-1); err != nil {
		t.Fatalf("a message with ordinary headers: %v", err)
	}
	reqs := srv.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests reached the server, want only the good message", len(reqs))
	}
	h := reqs[0].header
	if h.Get("Content-Type") != "application/cloudevents+json; charset=utf-8" || h.Get("User-Agent") != "app/2" || h.Get("Accept") != "*/*" || h.Get("X-Fine") != "1" {
		t.Errorf("the good message's headers: %v", h)
	}

	// A content-type that is not a media type is refused too.
	bad := msg(2000, "t", "", "{}")
	bad.Headers = map[string]string{"content-type": "json please"}
	if err := errAt(publish(t, s, bad), 0); !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "not a media type") || strings.Contains(err.Error(), "json please") {
		t.Errorf("content-type %q: %v, want a permanent error that does not quote the value", "json please", err)
	}

	// Batch mode carries them all, names and values as enqueued.
	sb := openURL(t, srv.URL+"/batch?wharf_allow_private=true&wharf_mode=batch")
	var all []*wharf.Message
	for i, name := range refused {
		m := msg(int64(3000+i), "t", "", "{}")
		m.Headers = map[string]string{name: "v" + name}
		all = append(all, m)
	}
	if errs := publish(t, sb, all...); errs != nil {
		t.Fatalf("batch mode: %v", errs)
	}
	got := map[string]map[string]string{}
	for _, r := range srv.requests()[1:] {
		var els []wireElement
		if err := json.Unmarshal(r.body, &els); err != nil {
			t.Fatal(err)
		}
		for _, e := range els {
			got[e.ID] = e.Headers
		}
	}
	for _, m := range all {
		if !maps.Equal(got[m.ID], m.Headers) {
			t.Errorf("batch mode: message %d headers %v, want %v", m.Seq, got[m.ID], m.Headers)
		}
	}
}

// Static headers may carry credentials (that is what they are for) but not
// replace what the sink or HTTP sets.
func TestStaticHeaders(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"Webhook-Id", "webhook-other", "wharf-tenant", "Content-Type", "content-length", "User-Agent", "Host", "Proxy-Authorization", "Connection", "TE"} {
		_, err := parseURL(mustURL(t, "http://h/?wharf_header_"+h+"=s3cret"))
		if err == nil || !strings.Contains(err.Error(), "cannot be configured") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("wharf_header_%s: %v, want it refused without showing the value", h, err)
		}
	}
	srv := newServer(t, nil)
	s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_header_Authorization=Bearer%20abc&wharf_header_Cookie=session%3D1&wharf_header_X-Tenant=acme")
	m := msg(1, "t", "", "{}")
	m.Headers = map[string]string{"x-tenant": "from the message"}
	if errs := publish(t, s, m); errs != nil {
		t.Fatal(errs)
	}
	h := srv.requests()[0].header
	if h.Get("Authorization") != "Bearer abc" || h.Get("Cookie") != "session=1" || len(h.Values("X-Tenant")) != 1 || h.Get("X-Tenant") != "acme" {
		t.Errorf("headers %v: want the static ones, winning over the message's", h)
	}
}
