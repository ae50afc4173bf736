package e2e

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"

	"github.com/wharfhq/wharf/internal/testdb"
)

// hookServer is a webhook receiver in the test process: it checks each
// request's Standard Webhooks signature and records the messages it accepts
// by key, in arrival order.
type hookServer struct {
	*httptest.Server
	secret string
	batch  bool
	reject int64 // a message id answered with 400, or 0

	mu       sync.Mutex
	byKey    map[string][]int64
	count    map[int64]int
	problems []string
}

func newHookServer(t *testing.T, batch bool, reject int64) *hookServer {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	h := &hookServer{
		secret: "whsec_" + base64.StdEncoding.EncodeToString(key),
		batch:  batch,
		reject: reject,
		byKey:  map[string][]int64{},
		count:  map[int64]int{},
	}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.Close)
	return h
}

// verifySignature is the Standard Webhooks check a receiver makes: v1 is the
// base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>" keyed with
// the base64-decoded part of the secret after whsec_.
func verifySignature(secret string, hdr http.Header, body []byte) error {
	id, ts := hdr.Get("webhook-id"), hdr.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || id == "" {
		return fmt.Errorf("webhook-id %q, webhook-timestamp %q", id, ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("webhook-timestamp %s is %s off", ts, d)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(hdr.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return fmt.Errorf("webhook-signature %q does not verify", hdr.Get("webhook-signature"))
}

func (h *hookServer) problem(format string, args ...any) {
	h.mu.Lock()
	h.problems = append(h.problems, fmt.Sprintf(format, args...))
	h.mu.Unlock()
}

type hookMessage struct {
	id      int64
	key     string
	origin  string
	payload []byte
}

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := verifySignature(h.secret, r.Header, body); err != nil {
		h.problem("%s: %v", r.Header.Get("webhook-id"), err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.URL.Path != "/hook/orders" || r.Header.Get("wharf-topic") != "orders" || r.URL.RawQuery != "" {
		h.problem("request to %s?%s with wharf-topic %q, want /hook/orders and no query", r.URL.Path, r.URL.RawQuery, r.Header.Get("wharf-topic"))
	}
	var msgs []hookMessage
	if h.batch {
		var els []struct {
			ID      string            `json:"id"`
			Seq     int64             `json:"seq"`
			Topic   string            `json:"topic"`
			Key     *string           `json:"key"`
			Headers map[string]string `json:"headers"`
			Payload json.RawMessage   `json:"payload"`
			Attempt int               `json:"attempt"`
		}
		if err := json.Unmarshal(body, &els); err != nil {
			h.problem("batch body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, e := range els {
			if seq, _, err := wharf.ParseID(e.ID); err != nil || seq != e.Seq || e.Key == nil || e.Topic != "orders" || e.Attempt < 1 {
				h.problem("element %s (seq %d): key %v topic %q attempt %d", e.ID, e.Seq, e.Key, e.Topic, e.Attempt)
				continue
			}
			msgs = append(msgs, hookMessage{e.Seq, *e.Key, e.Headers["origin"], e.Payload})
		}
	} else {
		id, _, err := wharf.ParseID(r.Header.Get("webhook-id"))
		if err != nil {
			h.problem("webhook-id %q is not a message id", r.Header.Get("webhook-id"))
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			h.problem("message %d: content-type %q", id, ct)
		}
		msgs = append(msgs, hookMessage{id, r.Header.Get("wharf-key"), r.Header.Get("origin"), body})
	}
	for _, m := range msgs {
		if m.id == h.reject {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"rejected by the test"}`)
			return
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		var p struct {
			N *int `json:"n"`
		}
		if m.origin != "sql" || json.Unmarshal(m.payload, &p) != nil || p.N == nil {
			h.problems = append(h.problems, fmt.Sprintf("message %d: origin header %q, payload %s", m.id, m.origin, m.payload))
		}
		h.byKey[m.key] = append(h.byKey[m.key], m.id)
		h.count[m.id]++
	}
	w.WriteHeader(http.StatusNoContent)
}

// relayToHook runs `wharf relay --drain` into h with the secret passed in the
// environment, as an operator would.
func relayToHook(t *testing.T, b *bundle, h *hookServer, mode string) {
	t.Helper()
	env := append(testdb.CleanEnv(), "E2E_HOOK_SECRET="+h.secret)
	sink := h.URL + "/hook/{{topic}}?wharf_allow_private=true&wharf_secret_env=E2E_HOOK_SECRET&wharf_mode=" + mode
	res := runCLI(t, env, 2*time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--retry-backoff", "10ms", "--max-retry-backoff", "50ms", "--sink", sink)
	require.Equalf(t, 0, res.code, "relay to the webhook: %s", res.stderr)
	require.NotContains(t, res.stderr, h.secret, "the relay logged the secret")
}

// SQL enqueue -> wharf relay (a process) -> an HTTP receiver: every message
// once at least, with a valid signature, in order per key, in single and
// batch mode.
func TestRelayToWebhook(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := newHookServer(t, mode == "batch", 0)
			want := enqueueSQL(t, b, "orders", 400, 10)

			relayToHook(t, b, h, mode)
			require.Equal(t, 0, b.outboxCount(t))
			h.mu.Lock()
			defer h.mu.Unlock()
			require.Empty(t, h.problems)
			require.Len(t, h.count, 400, "every message must arrive")
			requireFirstDeliveriesInOrder(t, want, h.byKey)
		})
	}
}

// A receiver that answers 400 to one message: the relay dead-letters that
// message at once (a 4xx is permanent) with the status and the receiver's
// answer as the error, and delivers every other one, the later messages of
// the same key included, in order.
func TestRelayToWebhookDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := enqueueSQL(t, b, "orders", 100, 5)
	reject := want["k2"][3]
	h := newHookServer(t, false, reject)

	relayToHook(t, b, h, "single")
	require.Equal(t, 0, b.outboxCount(t))

	res := runCLI(t, nil, time.Minute, "dead", "list", "--json", "--schema", b.schema, "--database-url", databaseURL)
	require.Equalf(t, 0, res.code, "stderr: %s", res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 1, "exactly the rejected message is dead: %s", res.stdout)
	var d struct {
		Seq       int64  `json:"seq"`
		Attempts  int    `json:"attempts"`
		LastError string `json:"last_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &d), lines[0])
	require.Equal(t, reject, d.Seq)
	require.Equal(t, 1, d.Attempts, "a 400 is not retried")
	require.Contains(t, d.LastError, "400 Bad Request")
	require.Contains(t, d.LastError, "rejected by the test")

	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(t, h.problems)
	require.Len(t, h.count, 99, "every other message must arrive")
	require.Zero(t, h.count[reject])
	ids := want["k2"]
	want["k2"] = append(append([]int64(nil), ids[:3]...), ids[4:]...)
	requireFirstDeliveriesInOrder(t, want, h.byKey)
}
