package wharfwebhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// newRelayClient returns a client of a freshly migrated schema of the test
// database, with a relay configuration fast enough for tests and sink,
// changed by configure when it is not nil.
func newRelayClient(t *testing.T, sink wharf.Sink, configure func(*wharf.Config)) *wharf.Client {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "ww_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	m, err := wharfmigrate.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	})
	cfg := &wharf.Config{
		Schema:            schema,
		Sink:              sink,
		Logger:            slog.New(slog.DiscardHandler),
		LeaseTTL:          3 * time.Second,
		RebalanceInterval: 200 * time.Millisecond,
		PollInterval:      50 * time.Millisecond,
		// The default MaxAttempts (12); with a backoff from 100ms to 1s its
		// retries span more than 4s (equal jitter: at least half of each).
		RetryBackoff:    100 * time.Millisecond,
		MaxRetryBackoff: time.Second,
	}
	if configure != nil {
		configure(cfg)
	}
	c, err := wharf.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// With Config.OrderAcrossTopics a key's messages of several topics are one
// ordering key: the sink sends them in seq order across topics, in both
// modes, even when a failure makes the relay retry; by default each (topic,
// key) is its own.
func TestOrderAcrossTopicsThroughRelay(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[string]bool{}
			var order []int64 // first arrivals, in order
			failed := false
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request, body []byte) bool {
				var got []wireElement
				if mode == "batch" {
					_ = json.Unmarshal(body, &got)
				} else {
					got = []wireElement{{ID: r.Header.Get("webhook-id"), Seq: seqOf(r.Header)}}
				}
				mu.Lock()
				defer mu.Unlock()
				for _, e := range got {
					// Fail the first POST holding the fifth message once, so
					// that the relay retries it and the messages after it.
					if e.Seq == 5 && !failed {
						failed = true
						w.WriteHeader(http.StatusServiceUnavailable)
						return true
					}
				}
				for _, e := range got {
					if !seen[e.ID] {
						seen[e.ID] = true
						order = append(order, e.Seq)
					}
				}
				return false
			})
			q := "&wharf_mode=single"
			if mode == "batch" {
				q = "&wharf_mode=batch&wharf_batch_size=3"
			}
			sink := openURL(t, srv.URL+"/{{topic}}?wharf_allow_private=true"+q)
			c := newRelayClient(t, sink, func(cfg *wharf.Config) {
				cfg.OrderAcrossTopics = true
				cfg.RetryBackoff = 20 * time.Millisecond
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var msgs []wharf.Message
			for i := range 24 {
				msgs = append(msgs, wharf.Message{Topic: []string{"orders.created", "orders.paid", "orders.shipped"}[i/2%3], Key: "order-1", Payload: []byte(`{}`)})
			}
			ids, err := c.Enqueue(ctx, msgs...)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if !failed {
				t.Fatal("the destination never failed a request")
			}
			if len(order) != len(ids) {
				t.Fatalf("%d of %d messages arrived", len(order), len(ids))
			}
			for i := 1; i < len(order); i++ {
				if order[i] <= order[i-1] {
					t.Fatalf("arrival order %v: message %d after %d, across topics of one key", order, order[i], order[i-1])
				}
			}
		})
	}
}

// By default the ordering key is (topic, key): a failure of a key in one
// topic does not hold the same key in another topic.
func TestFailureBlocksItsOrderingKeyOnly(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Header.Get("wharf-topic") == "a" {
			w.WriteHeader(http.StatusBadRequest)
			return true
		}
		return false
	})
	for _, mode := range []string{"single", "batch"} {
		s := openURL(t, srv.URL+"/?wharf_allow_private=true&wharf_mode="+mode)
		errs := publish(t, s, msg(1, "a", "k", "{}"), msg(2, "b", "k", "{}"), msg(3, "a", "k", "{}"), msg(4, "b", "k", "{}"))
		// Batch mode sends a key's messages of one topic in one POST.
		if second := errAt(errs, 2); !wharf.IsPermanent(errAt(errs, 0)) || (mode == "single") != errors.Is(second, wharf.ErrNotAttempted) || (mode == "batch") != wharf.IsPermanent(second) {
			t.Errorf("%s: topic a: %v, want the first failed and the second not attempted (single) or failed with it (batch)", mode, errs)
		}
		if errAt(errs, 1) != nil || errAt(errs, 3) != nil {
			t.Errorf("%s: topic b, same key: %v, want both delivered", mode, errs)
		}
	}
}
