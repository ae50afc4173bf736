package wharfwebhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// statusServer answers each single-mode request with the status equal to its
// message's position (msg(404, ...) gets 404).
func statusServer(t *testing.T) *server {
	return newServer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		w.WriteHeader(int(seqOf(r.Header)))
		_, _ = io.WriteString(w, "nope")
		return true
	})
}

// 401, 403, 404, 408, 409, 421, 423, 425, 429 and 5xx are retried; 400, 410,
// 413, 415, 422 and the other 4xx dead-letter at once.
func TestStatusClassification(t *testing.T) {
	t.Parallel()
	srv := statusServer(t)
	s := openURL(t, srv.URL+"/?wharf_allow_private=true")
	retried := []int64{401, 403, 404, 408, 409, 421, 423, 425, 429, 500, 502, 503, 504, 599}
	permanent := []int64{400, 402, 405, 410, 411, 413, 414, 415, 418, 422, 426, 431, 451, 499}
	var msgs []*wharf.Message
	for _, c := range append(append([]int64(nil), retried...), permanent...) {
		msgs = append(msgs, msg(c, "t", "", "{}"))
	}
	errs := publish(t, s, msgs...)
	for i, m := range msgs {
		err := errAt(errs, i)
		if err == nil || !strings.Contains(err.Error(), " "+strconv.FormatInt(m.Seq, 10)+" ") || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("status %d: %v, want an error with the status and body", m.Seq, err)
			continue
		}
		if want := i >= len(retried); wharf.IsPermanent(err) != want {
			t.Errorf("status %d: permanent %v, want %v: %v", m.Seq, !want, want, err)
		}
	}

	// A Retry-After on a retried 4xx is honoured.
	ra := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusUnauthorized)
		return true
	})
	err := errAt(publish(t, openURL(t, ra.URL+"/?wharf_allow_private=true"), msg(1, "t", "", "{}")), 0)
	var rae *wharf.RetryAfterError
	if !errors.As(err, &rae) || rae.Delay != 30*time.Second {
		t.Errorf("401 with Retry-After: 30: %v, want a retry after 30s", err)
	}
}

// wharf_permanent_status replaces the permanent set; "none" retries every
// failing status; 3xx stays permanent whatever it says.
func TestPermanentStatusOption(t *testing.T) {
	t.Parallel()
	srv := statusServer(t)
	for q, perm := range map[string][]int64{
		"wharf_permanent_status=401,%20503": {401, 503},
		"wharf_permanent_status=none":       {},
	} {
		s := openURL(t, srv.URL+"/?wharf_allow_private=true&"+q)
		codes := []int64{400, 401, 404, 410, 422, 500, 503}
		var msgs []*wharf.Message
		for _, c := range codes {
			msgs = append(msgs, msg(c, "t", "", "{}"))
		}
		errs := publish(t, s, msgs...)
		for i, c := range codes {
			want := false
			for _, p := range perm {
				want = want || p == c
			}
			if err := errAt(errs, i); err == nil || wharf.IsPermanent(err) != want {
				t.Errorf("%s: status %d: %v, want permanent %v", q, c, err, want)
			}
		}
	}
	moved := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(http.StatusFound)
		return true
	})
	s := openURL(t, moved.URL+"/?wharf_allow_private=true&wharf_permanent_status=none")
	if err := errAt(publish(t, s, msg(1, "t", "", "{}")), 0); !wharf.IsPermanent(err) {
		t.Errorf("302 with wharf_permanent_status=none: %v, want permanent", err)
	}

	cfg, err := parseURL(mustURL(t, "http://h/?wharf_permanent_status=400,422"))
	if err != nil || fmt.Sprint(cfg.opts.PermanentStatus) != "[400 422]" {
		t.Fatalf("parse: %v %v", cfg.opts.PermanentStatus, err)
	}
	for _, v := range []string{"", "200", "302", "600", "4xx", "400,,422", "400;422"} {
		_, err := parseURL(mustURL(t, "http://h/?wharf_permanent_status="+v))
		if err == nil || !strings.Contains(err.Error(), "wharf_permanent_status") || !strings.Contains(err.Error(), "from 400 to 599") {
			t.Errorf("wharf_permanent_status=%s: %v, want an error saying what it takes", v, err)
		}
	}
	if _, err := New(Options{URL: "http://h/", PermanentStatus: []int{399}}); err == nil || !strings.Contains(err.Error(), "PermanentStatus") {
		t.Errorf("Options.PermanentStatus 399: %v, want an error", err)
	}
}

// A destination whose credential is being rotated answers 401 for two
// seconds: the relay keeps retrying, nothing is dead-lettered, every message
// arrives, each key in order.
func TestRotatingCredentialIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var first time.Time
			var rejected int
			seen := map[string]bool{}
			last := map[string]int64{}
			var problems []string
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request, body []byte) bool {
				mu.Lock()
				defer mu.Unlock()
				if first.IsZero() {
					first = time.Now()
				}
				if time.Since(first) < 2*time.Second {
					rejected++
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = io.WriteString(w, `{"error":"invalid token"}`)
					return true
				}
				var got []wireElement
				if mode == "batch" {
					_ = json.Unmarshal(body, &got)
				} else {
					key := r.Header.Get("wharf-key")
					got = []wireElement{{ID: r.Header.Get("webhook-id"), Seq: seqOf(r.Header), Key: &key}}
				}
				for _, e := range got {
					if seen[e.ID] {
						continue
					}
					seen[e.ID] = true
					if e.Seq <= last[*e.Key] {
						problems = append(problems, fmt.Sprintf("key %s: message %d after %d", *e.Key, e.Seq, last[*e.Key]))
					}
					last[*e.Key] = e.Seq
				}
				return false
			})
			sink := openURL(t, srv.URL+"/hook?wharf_allow_private=true&wharf_mode="+mode)
			c := newRelayClient(t, sink, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var msgs []wharf.Message
			for i := range 40 {
				msgs = append(msgs, wharf.Message{Topic: "orders", Key: fmt.Sprintf("k%d", i%4), Payload: []byte(`{}`)})
			}
			ids, err := c.Enqueue(ctx, msgs...)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			dead, err := c.DeadLetters(ctx, wharf.DeadLetterFilter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range dead {
				t.Errorf("dead-lettered: %s after %d attempts: %s", d.ID, d.Attempts, d.LastError)
			}
			mu.Lock()
			defer mu.Unlock()
			if rejected == 0 {
				t.Fatal("the destination never answered 401")
			}
			for _, id := range ids {
				if !seen[id] {
					t.Errorf("message %s was not delivered", id)
				}
			}
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}
