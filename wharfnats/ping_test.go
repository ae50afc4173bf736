package wharfnats

import (
	"context"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

var _ wharf.Pinger = (*Sink)(nil)

// Ping follows the connection: fine while the server runs, failing while it
// is stopped (the client is reconnecting), fine again once it is back.
func TestPingFollowsTheServer(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t, "", "")
	ws, err := Open(context.Background(), mustParse(t, srv.url()))
	if err != nil {
		t.Fatal(err)
	}
	s := ws.(*Sink)
	defer s.Close()
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping with the server up: %v", err)
	}
	srv.stop(t)
	waitPing(t, s, false)
	srv.start(t)
	waitPing(t, s, true)
}

func waitPing(t *testing.T, s *Sink, ok bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.Ping(context.Background())
		if (err == nil) == ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ping: want ok=%v, got %v", ok, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
