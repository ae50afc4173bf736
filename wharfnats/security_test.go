package wharfnats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
)

func TestIsSystemSubject(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"$JS.API.STREAM.PURGE.X", "$KV.bucket.key", "$O.store.x", "$SYS.REQ.SERVER.PING", "$G", "$", "_INBOX.abc", "_INBOX"} {
		if !isSystemSubject(s) {
			t.Errorf("%q is not refused", s)
		}
	}
	for _, s := range []string{"orders", "orders.$JS.API", "a.b._INBOX", "_INBOXES.x", "_inbox.x", "JS.API.x", "x$"} {
		if isSystemSubject(s) {
			t.Errorf("%q is refused", s)
		}
	}
}

// A topic that names a JetStream API subject fails permanently, naming the
// subject and the option, and does not reach the server: the stream is not
// purged. With allow_system_subjects=true the same message purges it, which
// is what the check prevents.
func TestSystemSubjectIsRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w, js := newStream(t, sharedURL, nil)
			// The default template: the topic is the subject.
			s := sinkOn(t, w, Options{SubjectTemplate: TopicPlaceholder, StrictOrder: mode.strict})
			kept := newMsg(1, w.prefix+".t", "k", "kept")
			if errs := publish(t, s, kept); errs[0] != nil {
				t.Fatal(errs[0])
			}
			purge := "$JS.API.STREAM.PURGE." + w.stream
			msgs := []*wharf.Message{
				newMsg(2, purge, "k", ""),
				newMsg(3, w.prefix+".t", "k", "another topic: another ordering key"),
				newMsg(4, "$KV.bucket.key", "", "v"),
				newMsg(5, "$SYS.REQ.SERVER.PING", "", ""),
				newMsg(6, "_INBOX.x", "", ""),
			}
			errs := publish(t, s, msgs...)
			for i, err := range errs {
				if i == 1 {
					if err != nil {
						t.Errorf("the message of another topic: %v", err)
					}
					continue
				}
				var perm *wharf.PermanentError
				if !errors.As(err, &perm) {
					t.Fatalf("topic %q: %v, want a permanent error", msgs[i].Topic, err)
				}
				for _, want := range []string{`"` + msgs[i].Topic + `"`, "allow_system_subjects=true"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			}
			if got, want := stored(t, js, w.stream), idsOf(kept, msgs[1]); !slices.Equal(got, want) {
				t.Fatalf("the stream holds %v, want %v: the purge went through", got, want)
			}

			// The control: the same publish, allowed, purges the stream.
			open := sinkOn(t, w, Options{SubjectTemplate: TopicPlaceholder, AllowSystemSubjects: true, AckTimeout: time.Second})
			publish(t, open, newMsg(7, purge, "", "")) // answered by a purge response, not a PubAck
			if got := stored(t, js, w.stream); len(got) != 0 {
				t.Fatalf("with allow_system_subjects the stream still holds %v: the control did not purge", got)
			}
		})
	}
}

// A message with a JetStream control header (any case) fails permanently,
// naming the header, and does not reach the server: Nats-Rollup does not
// remove the stream's earlier messages. The control publishes the rollup
// directly and sees them go.
func TestControlHeaderIsRefused(t *testing.T) {
	t.Parallel()
	w, js := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.AllowRollup = true })
	s := sinkOn(t, w, Options{Stream: w.stream})
	before := []*wharf.Message{newMsg(1, "t", "k", "one"), newMsg(2, "t", "k", "two")}
	for i, err := range publish(t, s, before...) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	headers := []string{"Nats-Rollup", "nats-rollup", "NATS-ROLLUP", "Nats-Expected-Last-Sequence", "Nats-Expected-Stream", "Nats-TTL", "Nats-Msg-Id", "Nats-Anything"}
	for i, h := range headers {
		m := newMsg(int64(10+i), "t", "k", "rolls up")
		m.Headers = map[string]string{"trace-id": "x", h: "all"}
		errs := publish(t, s, m)
		var perm *wharf.PermanentError
		if !errors.As(errs[0], &perm) || !strings.Contains(errs[0].Error(), fmt.Sprintf("%q", h)) {
			t.Errorf("header %s: %v, want a permanent error naming it", h, errs[0])
		}
	}
	if got, want := stored(t, js, w.stream), idsOf(before...); !slices.Equal(got, want) {
		t.Fatalf("the stream holds %v, want %v", got, want)
	}

	// The control: the stream does roll up when the header reaches it.
	roll := nats.NewMsg(s.Subject("t"))
	roll.Header.Set("Nats-Rollup", "all")
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := js.PublishMsg(ctx, roll); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, js, w.stream); len(got) != 1 {
		t.Fatalf("after a direct rollup the stream holds %d messages, want 1: the control did not roll up", len(got))
	}
}

// A template whose every subject is a system subject fails at New and Open,
// unless allowed.
func TestSystemSubjectTemplateRefusedAtStart(t *testing.T) {
	t.Parallel()
	nc := requireServer(t, sharedURL)
	for _, tmpl := range []string{"$JS.API.{{topic}}", "${{topic}}", "$KV.orders.{{topic}}", "_INBOX.{{topic}}", "_INBOX", "$SYS"} {
		if _, err := New(nc, Options{SubjectTemplate: tmpl}); err == nil || !strings.Contains(err.Error(), "AllowSystemSubjects") {
			t.Errorf("New with SubjectTemplate %q: %v, want an error naming Options.AllowSystemSubjects", tmpl, err)
		}
		if _, err := New(nc, Options{SubjectTemplate: tmpl, AllowSystemSubjects: true}); err != nil {
			t.Errorf("New with SubjectTemplate %q, allowed: %v", tmpl, err)
		}
	}
	for _, tmpl := range []string{"{{topic}}", "_INBOX{{topic}}", "wharf.$JS.{{topic}}", "_INBOXES.{{topic}}"} {
		if _, err := New(nc, Options{SubjectTemplate: tmpl}); err != nil {
			t.Errorf("New with SubjectTemplate %q: %v", tmpl, err)
		}
	}
	u, _ := url.Parse(sharedURL + "?subject_template=" + url.QueryEscape("$KV.b.{{topic}}") + "&allow_system_subjects=true")
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	s, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("Open with allow_system_subjects=true: %v", err)
	}
	_ = s.Close()
}

// The least-privilege user docs/sinks/nats.md recommends is enough for the
// sink (Open checking the stream, publishing, PubAcks), and the server then
// refuses system subjects even with allow_system_subjects=true.
func TestLeastPrivilegeUser(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	// The configuration of docs/sinks/nats.md, plus an administrator for
	// the test.
	if err := os.WriteFile(conf, []byte(`
jetstream {}
accounts {
  APP {
    jetstream: enabled
    users: [
      { user: admin, password: adminpw }
      { user: wharf, password: $WHARF_NATS_PASSWORD,
        permissions: {
          publish:   { allow: ["wharf.>", "$JS.API.STREAM.INFO.WHARF"] }
          subscribe: { allow: ["_INBOX.>"] }
        }
      }
    ]
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startPrivateServer(t, conf, "admin:adminpw", "WHARF_NATS_PASSWORD=wharfpw")
	admin := requireServer(t, "nats://admin:adminpw@127.0.0.1:"+fmt.Sprint(srv.port))
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WHARF", Subjects: []string{"wharf.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	base := "nats://wharf:wharfpw@127.0.0.1:" + fmt.Sprint(srv.port)
	open := func(query string) wharf.Sink {
		t.Helper()
		u, err := url.Parse(base + "?ack_timeout=1s&" + query)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(ctx, u)
		if err != nil {
			t.Fatalf("Open as the least-privilege user with %s: %v", query, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	s := open("stream=WHARF&subject_template=" + url.QueryEscape("wharf.{{topic}}"))
	ok := []*wharf.Message{newMsg(1, "paid", "42", "a"), newMsg(2, "paid", "42", "b")}
	for i, err := range publish(t, s, ok...) {
		if err != nil {
			t.Fatalf("message %d as the least-privilege user: %v", i, err)
		}
	}

	// Even a sink allowed to, cannot purge: the server refuses the subject.
	loose := open("allow_system_subjects=true")
	purge := newMsg(3, "$JS.API.STREAM.PURGE.WHARF", "", "")
	if errs := publish(t, loose, purge); errs[0] == nil {
		t.Fatal("the purge was acknowledged")
	}
	if got, want := stored(t, js, "WHARF"), idsOf(ok...); !slices.Equal(got, want) {
		t.Fatalf("the stream holds %v, want %v", got, want)
	}
}

// The Wharf-Key header carries the message key and nothing else: a message's
// own header of that name (any case) does not reach the stream.
func TestKeyHeaderCannotBeForged(t *testing.T) {
	t.Parallel()
	w, js := newStream(t, sharedURL, nil)
	s := sinkOn(t, w, Options{Stream: w.stream})
	unkeyed := newMsg(1, "t", "", "x")
	unkeyed.Headers = map[string]string{"wharf-key": "forged", "trace-id": "a"}
	keyed := newMsg(2, "t", "real", "y")
	keyed.Headers = map[string]string{"Wharf-Key": "forged"}
	for i, err := range publish(t, s, unkeyed, keyed) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	st, err := js.Stream(ctx, w.stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint64][]string{1: nil, 2: {"real"}} {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for k, vs := range m.Header {
			if strings.EqualFold(k, HeaderKey) {
				got = append(got, vs...)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("message %d: key headers %v, want %v", seq, got, want)
		}
	}
}
