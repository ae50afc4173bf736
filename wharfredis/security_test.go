package wharfredis

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// A topic that would give a stream name with control characters, white
// space or invalid UTF-8 fails permanently before sending (and holds the
// rest of its key); printable names in any script go out. A template that
// can only give such names is refused at start.
func TestStreamNameGuard(t *testing.T) {
	t.Parallel()
	w, s := newWorld(t, sharedURL(), "")
	bad := []string{"line\nbreak", "tab\tbed", "two words", "nul\x00", "bad\xffutf8", "right-to-left\u202eoverride"}
	var msgs []*wharf.Message
	for i, topic := range bad {
		seq := int64(i + 1)
		msgs = append(msgs, &wharf.Message{ID: wharf.FormatID(seq, 3), Seq: seq, Topic: topic, Key: "k", Payload: []byte("x")})
	}
	behind := &wharf.Message{ID: wharf.FormatID(100, 3), Seq: 100, Topic: bad[0], Key: "k", Payload: []byte("behind it")}
	good := &wharf.Message{ID: wharf.FormatID(101, 3), Seq: 101, Topic: "commandes.créées", Key: "k", Payload: []byte("ok")}
	errs := publish(t, s, append(msgs, behind, good))
	for i := range bad {
		err := errs[i]
		if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "refuses stream names") {
			t.Errorf("topic %q: %v: want a permanent error saying why", bad[i], err)
		}
	}
	if !errors.Is(errs[len(bad)], wharf.ErrNotAttempted) {
		t.Errorf("the message behind the refused one of its key: %v, want ErrNotAttempted", errs[len(bad)])
	}
	if err := errs[len(bad)+1]; err != nil {
		t.Fatalf("topic %q: %v", good.Topic, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if got, err := w.read(ctx, good.Topic); err != nil || len(got) != 1 {
		t.Fatalf("stream %s holds %v (%v), want the one message", w.stream(good.Topic), got, err)
	}
	keys, err := w.admin.Keys(ctx, w.prefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys under the test's prefix: %q (%v), want only the good stream", keys, err)
	}
	if _, err := New(w.admin, Options{StreamTemplate: "wharf events:{{topic}}"}); err == nil || !strings.Contains(err.Error(), "white space") {
		t.Fatalf("New with a template holding a space: %v, want it refused", err)
	}
}

// The least-privilege ACL user of the documentation works: with a literal
// prefix in stream_template it publishes, transactions included; a topic
// cannot reach a key outside the prefix (with stream_template={{topic}} the
// server refuses it, NOPERM, and the message is retried); a user without
// MULTI/EXEC is refused at start with a message saying what to grant.
func TestLeastPrivilegeACL(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t)
	admin := requireRedis(t, srv.url())
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	acl := []any{"ACL", "SETUSER", "wharf", "on", ">s3cret-pw", "resetkeys", "~wharf:*", "resetchannels", "-@all", "+xadd", "+multi", "+exec", "+ping", "+client|setname"}
	if err := admin.Do(ctx, acl...).Err(); err != nil {
		t.Fatal(err)
	}
	// The application's own key, which no topic may touch.
	if err := admin.Set(ctx, "app:sessions", "secret", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	open := func(user, query string) (*Sink, error) {
		u, err := url.Parse("redis://" + user + ":s3cret-pw@" + srv.addr() + "?" + query)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(ctx, u)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = s.Close() })
		return s.(*Sink), nil
	}

	s, err := open("wharf", "stream_template="+url.QueryEscape("wharf:{{topic}}"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := newMsgs("orders", "a", "a", "b", "")
	requireAcked(t, publish(t, s, msgs))
	attack := newMsgs("app:sessions", "a")
	requireAcked(t, publish(t, s, attack)) // lands in wharf:app:sessions
	if typ, err := admin.Type(ctx, "app:sessions").Result(); err != nil || typ != "string" {
		t.Fatalf("app:sessions is a %s (%v), want the application's string untouched", typ, err)
	}
	if n, err := admin.XLen(ctx, "wharf:orders").Result(); err != nil || n != 4 {
		t.Fatalf("wharf:orders holds %d entries (%v), want 4", n, err)
	}

	bare, err := open("wharf", "")
	if err != nil {
		t.Fatal(err)
	}
	errs := publish(t, bare, newMsgs("app:events", "a", "a"))
	for i, err := range errs {
		if err == nil || wharf.IsPermanent(err) || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "~wharf:*") {
			t.Fatalf("message %d outside the prefix: %v: want a retryable NOPERM naming the ACL", i, err)
		}
	}
	if n, err := admin.Exists(ctx, "app:events").Result(); err != nil || n != 0 {
		t.Fatalf("app:events exists (%d, %v): want it never created", n, err)
	}

	noTx := append(append([]any{}, acl[:len(acl)-4]...), "+ping", "+client|setname")
	noTx[2] = "notx"
	if err := admin.Do(ctx, noTx...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := open("notx", ""); err == nil || !strings.Contains(err.Error(), "+multi +exec") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open as a user without MULTI/EXEC: %v, want a one-line error saying what to grant", err)
	}
}
