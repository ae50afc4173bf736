package wharfwebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// holdServer holds every request until release is closed or the client goes
// away, counting the requests that arrived.
type holdServer struct {
	*httptest.Server
	arrived  atomic.Int64
	first    chan struct{}
	once     sync.Once
	release  chan struct{}
	released sync.Once
}

func newHoldServer(t *testing.T) *holdServer {
	t.Helper()
	h := &holdServer{first: make(chan struct{}), release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client leaving
		h.arrived.Add(1)
		h.once.Do(func() { close(h.first) })
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() {
		h.unblock()
		h.Close()
	})
	return h
}

func (h *holdServer) unblock() { h.released.Do(func() { close(h.release) }) }

// notSentErr reports whether err is the result of a message left unsent
// because ctx ended: retryable, costing no attempt, and saying why.
func notSentErr(err, cause error) bool {
	return err != nil && !wharf.IsPermanent(err) && errors.Is(err, wharf.ErrNotAttempted) && errors.Is(err, cause)
}

// Once ctx is done Publish starts no request and returns at once: the
// request in flight ends with a retryable error, the messages not sent with
// one that costs no attempt.
func TestPublishStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, query string
		key         func(i int) string
	}{
		{"single unkeyed", "", func(int) string { return "" }},
		{"single keyed", "", func(i int) string { return fmt.Sprintf("k%d", i%3) }},
		{"batch", "&wharf_mode=batch&wharf_batch_size=2", func(i int) string { return fmt.Sprintf("k%d", i%3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newHoldServer(t)
			s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_concurrency=1"+tc.query)
			var msgs []*wharf.Message
			for i := range 12 {
				msgs = append(msgs, msg(int64(i+1), "t", tc.key(i), "{}"))
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan []error)
			go func() { done <- s.Publish(ctx, msgs) }()
			select {
			case <-srv.first:
			case <-time.After(10 * time.Second):
				t.Fatal("no request arrived")
			}
			cancel()
			var errs []error
			select {
			case errs = <-done:
			case <-time.After(2 * time.Second):
				t.Fatal("Publish did not return within 2s of ctx ending")
			}
			time.Sleep(100 * time.Millisecond) // a request started late would arrive by now
			if n := srv.arrived.Load(); n != 1 {
				t.Fatalf("%d requests arrived, want 1: requests started after ctx ended", n)
			}
			if len(errs) != len(msgs) {
				t.Fatalf("%d results for %d messages", len(errs), len(msgs))
			}
			inFlight := 0
			for i, err := range errs {
				switch {
				case notSentErr(err, context.Canceled):
				case err != nil && !wharf.IsPermanent(err) && errors.Is(err, context.Canceled) && !errors.Is(err, wharf.ErrNotAttempted):
					inFlight++
				case errors.Is(err, wharf.ErrNotAttempted) && !wharf.IsPermanent(err):
					// a later message of a key whose earlier one was cut short
				default:
					t.Errorf("message %d: %v, want a retryable error", i+1, err)
				}
			}
			if want := 1; tc.name == "batch" {
				want = 2 // the POST in flight carried two messages
				if inFlight != want {
					t.Errorf("%d messages ended in flight, want %d", inFlight, want)
				}
			} else if inFlight != want {
				t.Errorf("%d messages ended in flight, want %d", inFlight, want)
			}
		})
	}
}

// A Publish whose ctx is already done sends nothing.
func TestPublishWithDoneContext(t *testing.T) {
	t.Parallel()
	srv := newHoldServer(t)
	for _, mode := range []string{"single", "batch"} {
		s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_mode="+mode)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		errs := s.Publish(ctx, []*wharf.Message{msg(1, "t", "a", "{}"), msg(2, "t", "", "{}")})
		if len(errs) != 2 || !notSentErr(errs[0], context.Canceled) || !notSentErr(errs[1], context.Canceled) {
			t.Errorf("%s: %v, want two retryable not-sent errors", mode, errs)
		}
	}
	if n := srv.arrived.Load(); n != 0 {
		t.Fatalf("%d requests arrived", n)
	}
}

// A Publish waiting for a slot of wharf_concurrency, held by another
// Publish, returns when its ctx ends.
func TestPublishWaitingForSlotHonoursContext(t *testing.T) {
	t.Parallel()
	srv := newHoldServer(t)
	s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_concurrency=1")
	held := make(chan []error)
	go func() { held <- s.Publish(context.Background(), []*wharf.Message{msg(1, "t", "", "{}")}) }()
	<-srv.first
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, []*wharf.Message{msg(2, "t", "a", "{}"), msg(3, "t", "a", "{}"), msg(4, "t", "", "{}")})
	// A hang guard: the errors below say the deadline ended the wait.
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Publish took %s with a 200ms ctx", took)
	}
	for i, err := range errs {
		if !errors.Is(err, wharf.ErrNotAttempted) || wharf.IsPermanent(err) {
			t.Errorf("message %d: %v, want not attempted", i+2, err)
		}
	}
	if !notSentErr(errs[0], context.DeadlineExceeded) || !notSentErr(errs[2], context.DeadlineExceeded) {
		t.Errorf("%v, want not-sent errors saying the deadline passed", errs)
	}
	srv.unblock()
	if errs := <-held; errs != nil {
		t.Fatalf("the Publish holding the slot: %v", errs)
	}
	if n := srv.arrived.Load(); n != 1 {
		t.Fatalf("%d requests arrived, want 1", n)
	}
}
