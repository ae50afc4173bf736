package wharfredis

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

var _ wharf.Pinger = (*Sink)(nil)

// Ping follows the server: fine while it runs, failing while it is stopped,
// fine again once it is back.
func TestPingFollowsTheServer(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t)
	u, err := url.Parse(srv.url() + "?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	s := ws.(*Sink)
	defer s.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return s.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("ping with the server up: %v", err)
	}
	srv.stop(t)
	if err := ping(); err == nil {
		t.Fatal("ping succeeded while the server was stopped")
	}
	srv.start(t)
	deadline := time.Now().Add(15 * time.Second)
	for err := ping(); err != nil; err = ping() {
		if time.Now().After(deadline) {
			t.Fatalf("ping after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
