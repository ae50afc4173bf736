package wharfconsole

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
)

// requestTimeout bounds every database call of one API request.
const requestTimeout = 15 * time.Second

func (h *console) api(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/config", h.config)
	hist := &statusHistory{}
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) { h.status(w, r, hist) })
	mux.HandleFunc("GET /api/blocked", h.blocked)
	mux.HandleFunc("GET /api/pending", h.pending)
	mux.HandleFunc("GET /api/dead", h.dead)
	mux.HandleFunc("POST /api/pending/cancel", h.mutate(h.cancel))
	mux.HandleFunc("POST /api/pending/reschedule", h.mutate(h.reschedule))
	mux.HandleFunc("POST /api/dead/retry", h.mutate(h.retry))
	mux.HandleFunc("POST /api/dead/purge", h.mutate(h.purge))
	h.flowsAPI(mux)
}

type configJSON struct {
	ReadOnly bool   `json:"read_only"`
	Auth     bool   `json:"auth"`
	Schema   string `json:"schema"`
	RelayID  string `json:"relay_id"`
}

func (h *console) config(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, configJSON{ReadOnly: h.o.readOnly, Auth: h.o.token != "", Schema: h.c.Schema(), RelayID: h.c.RelayID()})
}

type countJSON struct {
	N     int64 `json:"n"`
	Exact bool  `json:"exact"`
}

type relayJSON struct {
	ID              string    `json:"id"`
	Host            string    `json:"host"`
	PID             int       `json:"pid"`
	StartedAt       time.Time `json:"started_at"`
	HeartbeatAgeSec float64   `json:"heartbeat_age_s"`
	Live            bool      `json:"live"`
	Lanes           []int     `json:"lanes"`
	LeaseLeftSec    float64   `json:"lease_left_s"`
}

type laneJSON struct {
	Lane         int       `json:"lane"`
	Owner        string    `json:"owner"`
	Fence        int64     `json:"fence"`
	LeaseUntil   time.Time `json:"lease_until"`
	LeaseLeftSec float64   `json:"lease_left_s"`
	Covered      bool      `json:"covered"`
	OwnerLive    bool      `json:"owner_live"`
}

// inProcessJSON are the counters of a relay running in the console's own
// process ([wharf.Client.Metrics]).
type inProcessJSON struct {
	Delivered      int64 `json:"delivered"`
	FailedAttempts int64 `json:"failed_attempts"`
	DeadLettered   int64 `json:"dead_lettered"`
	InFlight       int64 `json:"in_flight"`
	LanesOwned     int64 `json:"lanes_owned"`
}

type statusJSON struct {
	Time             time.Time      `json:"time"`
	Messages         countJSON      `json:"messages"`
	Due              int64          `json:"due"`
	Scheduled        countJSON      `json:"scheduled"`
	Retrying         countJSON      `json:"retrying"`
	DeadLetters      countJSON      `json:"dead_letters"`
	OldestDueAgeSec  float64        `json:"oldest_due_age_s"`
	OldestDueUnknown []int          `json:"oldest_due_unknown"`
	DeadTuples       int64          `json:"dead_tuples"`
	LeaseTTLSec      float64        `json:"lease_ttl_s"`
	Relays           []relayJSON    `json:"relays"`
	Lanes            []laneJSON     `json:"lanes"`
	Uncovered        []int          `json:"uncovered"`
	InProcess        *inProcessJSON `json:"in_process"`
	// Inserted and Deleted are the outbox table's cumulative row counts
	// (wharf.Status): their change over time is the enqueue rate and the
	// rate messages leave the outbox.
	Inserted int64 `json:"inserted"`
	Deleted  int64 `json:"deleted"`
	// History is what earlier status requests saw, oldest first, so the
	// charts start with the last minutes instead of empty.
	History []historyPoint `json:"history"`
}

// historyPoint is one status sample of the console's history.
type historyPoint struct {
	Time      time.Time `json:"time"`
	Due       int64     `json:"due"`
	Scheduled int64     `json:"scheduled"`
	Retrying  int64     `json:"retrying"`
	Messages  int64     `json:"messages"`
	Inserted  int64     `json:"inserted"`
	Deleted   int64     `json:"deleted"`
	// Delivered is the in-process relay's counter (null without one).
	Delivered *int64 `json:"delivered"`
}

// historyLen and historyEvery bound the history: one point a second at most,
// 150 of them (5 minutes at the pages' 2-second refresh).
const (
	historyLen   = 150
	historyEvery = time.Second
)

// statusHistory keeps the last status samples of one console, shared by
// every browser that shows it.
type statusHistory struct {
	mu     sync.Mutex
	points []historyPoint
}

// add records p (unless the last point is less than historyEvery old) and
// returns the history before it.
func (s *statusHistory) add(p historyPoint) []historyPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := append([]historyPoint{}, s.points...)
	if n := len(s.points); n == 0 || p.Time.Sub(s.points[n-1].Time) >= historyEvery {
		s.points = append(s.points, p)
		if len(s.points) > historyLen {
			s.points = append(s.points[:0], s.points[len(s.points)-historyLen:]...)
		}
	}
	return before
}

func (h *console) status(w http.ResponseWriter, r *http.Request, hist *statusHistory) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	s, err := h.c.Status(ctx)
	if err != nil {
		h.fail(w, "status", err)
		return
	}
	out := statusJSON{
		Time:             time.Now().UTC(),
		Messages:         countJSON(s.Messages),
		Due:              s.Due(),
		Scheduled:        countJSON(s.Scheduled),
		Retrying:         countJSON(s.Retrying),
		DeadLetters:      countJSON(s.DeadLetters),
		OldestDueAgeSec:  s.OldestDueAge.Seconds(),
		OldestDueUnknown: nonNil(s.OldestDueUnknown),
		DeadTuples:       s.DeadTuples,
		LeaseTTLSec:      s.LeaseTTL.Seconds(),
		Relays:           []relayJSON{},
		Uncovered:        nonNil(s.UncoveredLanes()),
	}
	live := map[string]bool{}
	for _, rl := range s.Relays {
		live[rl.ID] = rl.Live
		out.Relays = append(out.Relays, relayJSON{
			ID: rl.ID, Host: rl.Host, PID: rl.PID, StartedAt: rl.StartedAt, HeartbeatAgeSec: rl.HeartbeatAge.Seconds(),
			Live: rl.Live, Lanes: nonNil(rl.Lanes), LeaseLeftSec: rl.LeaseLeft.Seconds(),
		})
	}
	for _, l := range s.Lanes {
		out.Lanes = append(out.Lanes, laneJSON{
			Lane: l.Lane, Owner: l.Owner, Fence: l.Fence, LeaseUntil: l.LeaseUntil, LeaseLeftSec: l.LeaseLeft.Seconds(),
			Covered: l.Owner != "" && !l.Expired(), OwnerLive: live[l.Owner],
		})
	}
	// A relay runs in this process when its engine loop ran lately.
	m := h.c.Metrics()
	if last := m.LastLoop.Load(); last != 0 && time.Since(time.Unix(0, last)) < 30*time.Second {
		out.InProcess = &inProcessJSON{
			Delivered: m.Delivered.Load(), FailedAttempts: m.FailedAttempts.Load(), DeadLettered: m.DeadLettered.Load(),
			InFlight: m.InFlight.Load(), LanesOwned: m.LanesOwned.Load(),
		}
	}
	out.Inserted, out.Deleted = s.Inserted, s.Deleted
	p := historyPoint{Time: out.Time, Due: out.Due, Scheduled: s.Scheduled.N, Retrying: s.Retrying.N, Messages: s.Messages.N,
		Inserted: s.Inserted, Deleted: s.Deleted}
	if out.InProcess != nil {
		d := out.InProcess.Delivered
		p.Delivered = &d
	}
	out.History = hist.add(p)
	writeJSON(w, http.StatusOK, out)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

type blockedKeyJSON struct {
	Topic          string     `json:"topic"`
	Key            string     `json:"key"`
	Lane           int        `json:"lane"`
	Reason         string     `json:"reason"`
	HeadID         string     `json:"head_id"`
	CreatedAt      time.Time  `json:"created_at"`
	DeliverAt      *time.Time `json:"deliver_at"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	LastError      string     `json:"last_error"`
	Waiting        int        `json:"waiting"`
	WaitingAtLeast bool       `json:"waiting_at_least"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (h *console) blocked(w http.ResponseWriter, r *http.Request) {
	limit, ok := queryLimit(w, r, 100, 1000)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	b, err := h.c.BlockedKeys(ctx, limit)
	if err != nil {
		h.fail(w, "blocked keys", err)
		return
	}
	keys := []blockedKeyJSON{}
	for _, k := range b.Keys {
		keys = append(keys, blockedKeyJSON{
			Topic: k.Topic, Key: k.Key, Lane: k.Lane, Reason: string(k.Reason), HeadID: k.HeadID, CreatedAt: k.CreatedAt,
			DeliverAt: timePtr(k.DeliverAt), Attempts: k.Attempts, NextAttemptAt: timePtr(k.NextAttemptAt),
			LastError: k.LastError, Waiting: k.Waiting, WaitingAtLeast: k.WaitingAtLeast,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"keys": keys, "more": b.More, "unscanned_lanes": nonNil(b.UnscannedLanes), "scan_bound": wharf.BlockedScanBound,
	})
}

// queryLimit reads ?limit= (default def, at most hi).
func queryLimit(w http.ResponseWriter, r *http.Request, def, hi int) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > hi {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want a whole number from 1 to %d", v, hi))
		return 0, false
	}
	return n, true
}

// payloadJSON is a payload ready to show: indented JSON, text, or base64
// for bytes that are neither.
type payloadJSON struct {
	Kind  string `json:"kind"` // json, text or base64
	Body  string `json:"body"`
	Bytes int    `json:"bytes"`
}

func showPayload(p []byte) payloadJSON {
	out := payloadJSON{Bytes: len(p)}
	var buf bytes.Buffer
	switch {
	case len(p) > 0 && json.Valid(p) && json.Indent(&buf, p, "", "  ") == nil:
		out.Kind, out.Body = "json", buf.String()
	case utf8.Valid(p) && printable(p):
		out.Kind, out.Body = "text", string(p)
	default:
		out.Kind, out.Body = "base64", base64.StdEncoding.EncodeToString(p)
	}
	return out
}

func printable(p []byte) bool {
	for _, r := range string(p) {
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' || r == 0x7f {
			return false
		}
	}
	return true
}

type messageJSON struct {
	ID        string            `json:"id"`
	Seq       int64             `json:"seq"`
	Topic     string            `json:"topic"`
	Key       string            `json:"key"`
	Headers   map[string]string `json:"headers"`
	Payload   payloadJSON       `json:"payload"`
	DeliverAt *time.Time        `json:"deliver_at"`
	DedupKey  string            `json:"dedup_key"`
	CreatedAt time.Time         `json:"created_at"`
}

func newMessageJSON(m *wharf.Message) messageJSON {
	hd := m.Headers
	if hd == nil {
		hd = map[string]string{}
	}
	return messageJSON{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Key: m.Key, Headers: hd, Payload: showPayload(m.Payload),
		DeliverAt: timePtr(m.DeliverAt), DedupKey: m.DedupKey, CreatedAt: m.CreatedAt}
}

type pendingJSON struct {
	messageJSON
	Lane          int        `json:"lane"`
	State         string     `json:"state"` // scheduled, retrying, held or due
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	// HeldBehind is set for state "held": the earlier message of the key
	// this one waits for.
	HeldBehind *holderJSON `json:"held_behind,omitempty"`
}

// holderJSON is the held message a pending message waits behind.
type holderJSON struct {
	ID       string    `json:"id"`
	Seq      int64     `json:"seq"`
	Reason   string    `json:"reason"` // scheduled or retrying
	Until    time.Time `json:"until"`
	Attempts int       `json:"attempts"`
}

// idList reads ?id= as message ids or outbox positions (seqs).
func idList(v string) (ids []string, seqs []int64, err error) {
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		if n, err := strconv.ParseInt(f, 10, 64); err == nil && n > 0 {
			seqs = append(seqs, n)
			continue
		}
		if _, _, err := wharf.ParseID(f); err != nil {
			return nil, nil, fmt.Errorf("id %q: want a message id (a UUID such as 0000000a-8001-8123-8456-789abcdef012) or an outbox position (a number)", f)
		}
		ids = append(ids, f)
	}
	return ids, seqs, nil
}

// listRequest reads what both message lists take: a limit and an id filter.
// ok is false once it answered a bad request.
func listRequest(w http.ResponseWriter, r *http.Request) (limit int, ids []string, seqs []int64, ok bool) {
	if limit, ok = queryLimit(w, r, 100, 1000); !ok {
		return 0, nil, nil, false
	}
	ids, seqs, err := idList(r.URL.Query().Get("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, nil, nil, false
	}
	return limit, ids, seqs, true
}

func (h *console) pending(w http.ResponseWriter, r *http.Request) {
	limit, ids, seqs, ok := listRequest(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	ps, err := h.c.PendingMessages(ctx, wharf.PendingFilter{IDs: ids, Seqs: seqs, Topic: q.Get("topic"), Key: q.Get("key"), Limit: limit})
	if err != nil {
		h.fail(w, "list pending messages", err)
		return
	}
	out := []pendingJSON{}
	for i := range ps {
		p := &ps[i]
		state := "due"
		var held *holderJSON
		switch {
		case p.Attempts > 0:
			state = "retrying"
		case p.Scheduled:
			state = "scheduled"
		case p.HeldBehind != nil:
			state = "held"
			h := p.HeldBehind
			held = &holderJSON{ID: h.ID, Seq: h.Seq, Reason: string(h.Reason), Until: h.Until.UTC(), Attempts: h.Attempts}
		}
		out = append(out, pendingJSON{messageJSON: newMessageJSON(&p.Message), Lane: p.Lane, State: state,
			Attempts: p.Attempts, LastError: p.LastError, NextAttemptAt: timePtr(p.NextAttemptAt), HeldBehind: held})
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out, "limit": limit})
}

type deadJSON struct {
	messageJSON
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	FailedAt  time.Time `json:"failed_at"`
}

func (h *console) dead(w http.ResponseWriter, r *http.Request) {
	limit, ids, seqs, ok := listRequest(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	ds, err := h.c.DeadLetters(ctx, wharf.DeadLetterFilter{IDs: ids, Seqs: seqs, Topic: q.Get("topic"), Limit: limit})
	if err != nil {
		h.fail(w, "list dead letters", err)
		return
	}
	out := []deadJSON{}
	for i := range ds {
		d := &ds[i]
		out = append(out, deadJSON{messageJSON: newMessageJSON(&d.Message), Attempts: d.Attempts, LastError: d.LastError, FailedAt: d.FailedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out, "limit": limit})
}

// readChange is the gate of every change (POST): it refuses them all on a
// read-only console, and reads the JSON body into req (unknown fields
// refused; usage is the body to send). ok is false once it answered. The
// token and the same-origin check came before, for every request.
func (h *console) readChange(w http.ResponseWriter, r *http.Request, req any, usage string) bool {
	if h.o.readOnly {
		writeError(w, http.StatusForbidden, "the console is read-only: start it without --console-read-only to make changes")
		return false
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the request as Content-Type: application/json")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: "+err.Error()+": send "+usage)
		return false
	}
	return true
}

// changeRequest is the body of a message change: the messages to act on,
// by id.
type changeRequest struct {
	IDs []string `json:"ids"`
	// At is the new delivery time of a reschedule (RFC 3339; "" means now).
	At string `json:"at"`
}

// mutate checks a change may be made (not read-only; a JSON body naming at
// least one message) before running it.
func (h *console) mutate(f func(ctx context.Context, req changeRequest) (map[string]any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req changeRequest
		if !h.readChange(w, r, &req, `{"ids": ["<message id>", ...]}`) {
			return
		}
		if len(req.IDs) == 0 {
			writeError(w, http.StatusBadRequest, `no message selected: send {"ids": ["<message id>", ...]}`)
			return
		}
		for _, id := range req.IDs {
			if _, _, err := wharf.ParseID(id); err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("id %q is not a message id (a UUID as the lists show)", id))
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		out, err := f(ctx, req)
		if err != nil {
			if errorStatus(err) == http.StatusBadRequest {
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
			h.fail(w, r.URL.Path, err)
			return
		}
		h.o.logger.Info("wharfconsole: "+strings.TrimPrefix(r.URL.Path, "/api/"), "ids", req.IDs, "result", out, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, out)
	}
}

func (h *console) cancel(ctx context.Context, req changeRequest) (map[string]any, error) {
	n, err := h.c.CancelMessages(ctx, wharf.PendingFilter{IDs: req.IDs})
	return map[string]any{"cancelled": n}, err
}

func (h *console) reschedule(ctx context.Context, req changeRequest) (map[string]any, error) {
	var at time.Time
	if req.At != "" {
		var err error
		if at, err = time.Parse(time.RFC3339, req.At); err != nil {
			return nil, badRequest(fmt.Sprintf("at %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z, or \"\" for now", req.At))
		}
	}
	n, err := h.c.RescheduleMessages(ctx, wharf.PendingFilter{IDs: req.IDs}, at)
	return map[string]any{"rescheduled": n}, err
}

func (h *console) retry(ctx context.Context, req changeRequest) (map[string]any, error) {
	n, err := h.c.RetryDeadLetters(ctx, wharf.DeadLetterFilter{IDs: req.IDs})
	return map[string]any{"retried": n}, err
}

func (h *console) purge(ctx context.Context, req changeRequest) (map[string]any, error) {
	n, err := h.c.PurgeDeadLetters(ctx, wharf.DeadLetterFilter{IDs: req.IDs})
	return map[string]any{"purged": n}, err
}

func (h *console) fail(w http.ResponseWriter, what string, err error) {
	h.o.logger.Warn("wharfconsole: "+what, "err", err)
	writeError(w, errorStatus(err), strings.TrimPrefix(err.Error(), "wharf: "))
}
