package wharfconsole

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf/wharfflow"
)

// WithFlows adds the Flows pages: the durable flows (package wharfflow) of
// fc, which must be a client of the console's schema. The pages read and
// change them with fc's admin calls (List, Get, StatusCounts, Retry, Cancel,
// Send). Without it the Flows page says the console was started without
// flows.
func WithFlows(fc *wharfflow.Client) Option { return func(o *options) { o.flows = fc } }

func (h *console) flowsAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/flows", h.flowSummary)
	mux.HandleFunc("GET /api/flows/instances", h.flowInstances)
	mux.HandleFunc("GET /api/flows/instances/{id}", h.flowInstance)
	mux.HandleFunc("POST /api/flows/retry", h.flowChange("retry", h.flowRetry))
	mux.HandleFunc("POST /api/flows/cancel", h.flowChange("cancel", h.flowCancel))
	mux.HandleFunc("POST /api/flows/signal", h.flowChange("signal", h.flowSignal))
}

// flowsMissing says why the console has no flows to show ("" when it has):
// started without WithFlows or with a client of another schema, a schema
// without the flow tables (an outbox migrated before migration 7), or a
// database role that may not read them.
func (h *console) flowsMissing(ctx context.Context) (string, error) {
	if h.o.flows == nil {
		return "this console was started without flows (wharfconsole.WithFlows)", nil
	}
	if fs := h.o.flows.Schema(); fs != h.c.Schema() {
		return fmt.Sprintf("the console's flows client is for schema %s, the console for %s: create it with the console's schema", fs, h.c.Schema()), nil
	}
	s, err := h.o.flows.Setup(ctx)
	switch {
	case err != nil:
		return "", err
	case !s.Installed:
		return fmt.Sprintf("flows are not set up in schema %s: their tables come with migration 7 (wharf migrate up); until then nothing runs flows on this outbox", h.c.Schema()), nil
	case !s.Readable:
		return fmt.Sprintf("the console's database role %s may not read the flow tables of schema %s: grant it SELECT on %[2]s.flow_instances, flow_steps and flow_signals, or start the console as a role that may", s.Role, h.c.Schema()), nil
	}
	return "", nil
}

// flowsReady answers 404 with the reason when there are no flows to read
// or change; ok is false once it answered.
func (h *console) flowsReady(ctx context.Context, w http.ResponseWriter) bool {
	missing, err := h.flowsMissing(ctx)
	if err != nil {
		h.flowFail(w, "flows", err)
		return false
	}
	if missing != "" {
		writeError(w, http.StatusNotFound, missing)
		return false
	}
	return true
}

type flowCountsJSON struct {
	Flow string `json:"flow"`
	// Counts are the instances per status (statuses without any left out).
	Counts map[string]int64 `json:"counts"`
	// Later are the ready instances whose step is not due yet.
	Later int64 `json:"later"`
	Total int64 `json:"total"`
}

func (h *console) flowSummary(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	missing, err := h.flowsMissing(ctx)
	if err != nil {
		h.flowFail(w, "flows", err)
		return
	}
	out := map[string]any{"available": missing == "", "message": missing, "statuses": wharfflow.Statuses(), "flows": []flowCountsJSON{}}
	if missing != "" {
		writeJSON(w, http.StatusOK, out)
		return
	}
	counts, err := h.o.flows.StatusCounts(ctx)
	if err != nil {
		h.flowFail(w, "flow counts", err)
		return
	}
	flows := []flowCountsJSON{}
	for _, c := range counts {
		if n := len(flows); n == 0 || flows[n-1].Flow != c.Flow {
			flows = append(flows, flowCountsJSON{Flow: c.Flow, Counts: map[string]int64{}})
		}
		f := &flows[len(flows)-1]
		f.Counts[c.Status] = c.N
		f.Later += c.Later
		f.Total += c.N
	}
	out["flows"] = flows
	writeJSON(w, http.StatusOK, out)
}

// flowRowJSON is an instance as the lists show it: without its state.
type flowRowJSON struct {
	ID     int64  `json:"id"`
	Flow   string `json:"flow"`
	Key    string `json:"key"`
	Status string `json:"status"`
	Step   string `json:"step"`
	// AwaitSignals, of an awaiting instance: Step runs once one comes.
	AwaitSignals []string   `json:"await_signals,omitempty"`
	Attempt      int        `json:"attempt"`
	RunAt        *time.Time `json:"run_at"`
	NotBefore    time.Time  `json:"not_before"`
	ParentID     int64      `json:"parent_id"`
	Error        string     `json:"error"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

// maxRowError bounds the error a list row carries (the instance page shows
// all of it).
const maxRowError = 300

func flowRow(i *wharfflow.Instance) flowRowJSON {
	e := i.Error
	if len(e) > maxRowError {
		e = strings.ToValidUTF8(e[:maxRowError], "") + "…"
	}
	return flowRowJSON{ID: i.ID, Flow: i.Flow, Key: i.Key, Status: i.Status, Step: i.Step, AwaitSignals: i.AwaitSignals, Attempt: i.Attempt, RunAt: i.RunAt,
		NotBefore: i.NotBefore, ParentID: i.ParentID, Error: e, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt}
}

func flowRows(is []wharfflow.Instance) []flowRowJSON {
	out := make([]flowRowJSON, 0, len(is))
	for i := range is {
		out = append(out, flowRow(&is[i]))
	}
	return out
}

// flowInstances lists instances newest first: ?flow=, ?status=, ?key= (the
// correlation key), ?limit= and ?before= (an id: the next page).
func (h *console) flowInstances(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := wharfflow.ListOptions{Flow: q.Get("flow"), Status: q.Get("status"), Key: q.Get("key")}
	if o.Status != "" && !slices.Contains(wharfflow.Statuses(), o.Status) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q: use one of %s", o.Status, strings.Join(wharfflow.Statuses(), ", ")))
		return
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("before %q: want an instance id (a positive number), as next_before gives", v))
			return
		}
		o.Before = n
	}
	limit, ok := queryLimit(w, r, 50, 1000)
	if !ok {
		return
	}
	o.Limit = limit
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if !h.flowsReady(ctx, w) {
		return
	}
	is, err := h.o.flows.List(ctx, o)
	if err != nil {
		h.flowFail(w, "list flow instances", err)
		return
	}
	var next int64
	if len(is) == limit {
		next = is[len(is)-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"instances": flowRows(is), "limit": limit, "next_before": next})
}

// maxChildren is how many children the instance page lists.
const maxChildren = 100

type flowDetailJSON struct {
	Instance wharfflow.Details `json:"instance"`
	Parent   *flowRowJSON      `json:"parent"`
	Children []flowRowJSON     `json:"children"`
	// ChildrenMore is set when the instance has more than the children
	// listed (the newest maxChildren).
	ChildrenMore bool `json:"children_more"`
	// StepsTotal and SignalsTotal count the whole history; the instance
	// carries the last maxHistory of each.
	StepsTotal   int       `json:"steps_total"`
	SignalsTotal int       `json:"signals_total"`
	Time         time.Time `json:"time"`
}

// maxHistory is how many steps and signals of an instance the page gets
// (the latest): a long-lived instance may have run thousands of steps.
const maxHistory = 500

func lastN[T any](s []T, n int) []T { return s[max(0, len(s)-n):] }

func parseInstanceID(v string) (int64, error) {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest(fmt.Sprintf("instance id %q: want a positive number, as the Flows list shows", v))
	}
	return id, nil
}

func (h *console) noInstance(id int64) string {
	return fmt.Sprintf("no flow instance %d in schema %s: it never existed, or it ended and the runners' retention deleted it", id, h.c.Schema())
}

func (h *console) flowInstance(w http.ResponseWriter, r *http.Request) {
	id, err := parseInstanceID(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if !h.flowsReady(ctx, w) {
		return
	}
	d, err := h.o.flows.Get(ctx, id)
	if errors.Is(err, wharfflow.ErrNoInstance) {
		writeError(w, http.StatusNotFound, h.noInstance(id))
		return
	}
	if err != nil {
		h.flowFail(w, "flow instance", err)
		return
	}
	out := flowDetailJSON{StepsTotal: len(d.Steps), SignalsTotal: len(d.Signals), Time: time.Now().UTC()}
	d.Steps, d.Signals = nonNil(lastN(d.Steps, maxHistory)), nonNil(lastN(d.Signals, maxHistory))
	out.Instance = d
	if d.ParentID != 0 {
		p, err := h.o.flows.Get(ctx, d.ParentID)
		switch {
		case err == nil:
			row := flowRow(&p.Instance)
			out.Parent = &row
		case !errors.Is(err, wharfflow.ErrNoInstance):
			h.flowFail(w, "flow instance's parent", err)
			return
		}
	}
	children, err := h.o.flows.List(ctx, wharfflow.ListOptions{Parent: id, Limit: maxChildren + 1})
	if err != nil {
		h.flowFail(w, "flow instance's children", err)
		return
	}
	if len(children) > maxChildren {
		children, out.ChildrenMore = children[:maxChildren], true
	}
	out.Children = flowRows(children)
	writeJSON(w, http.StatusOK, out)
}

// flowChangeRequest is the body of a flow change: the instance, and for a
// signal its name, payload and dedup key.
type flowChangeRequest struct {
	ID int64 `json:"id"`
	// IDs are the instances of a retry of several (the failed ones listed).
	IDs      []int64         `json:"ids"`
	Name     string          `json:"name"`
	Payload  json.RawMessage `json:"payload"`
	DedupKey string          `json:"dedup_key"`
}

// flowChange runs a change of one instance through the console's change
// gate (readChange: read-only, JSON body; the token and the same-origin
// check came before), and answers 404 for an instance that does not exist
// and 409 for one whose status does not allow the change.
func (h *console) flowChange(what string, f func(ctx context.Context, req flowChangeRequest) (map[string]any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req flowChangeRequest
		usage := `{"id": <instance id>}`
		switch what {
		case "signal":
			usage = `{"id": <instance id>, "name": "<signal name>", "payload": <JSON, optional>, "dedup_key": "<optional>"}`
		case "retry":
			usage = `{"id": <instance id>} or {"ids": [<instance id>, ...]}`
		}
		if !h.readChange(w, r, &req, usage) {
			return
		}
		if len(req.IDs) > 0 {
			h.flowRetryMany(w, r, req, usage, what)
			return
		}
		if req.ID < 1 {
			writeError(w, http.StatusBadRequest, "no instance selected: send "+usage)
			return
		}
		if what == "signal" && strings.TrimSpace(req.Name) == "" {
			writeError(w, http.StatusBadRequest, "the signal needs a name (the one the flow awaits): send "+usage)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		if !h.flowsReady(ctx, w) {
			return
		}
		out, err := f(ctx, req)
		if errors.Is(err, wharfflow.ErrNoInstance) {
			// Tell a missing instance from one whose status refuses it.
			i, gerr := h.o.flows.Get(ctx, req.ID)
			switch {
			case errors.Is(gerr, wharfflow.ErrNoInstance):
				writeError(w, http.StatusNotFound, h.noInstance(req.ID))
			case gerr != nil:
				h.flowFail(w, r.URL.Path, gerr)
			default:
				writeError(w, http.StatusConflict, refusal(what, &i.Instance))
			}
			return
		}
		if err != nil {
			h.flowFail(w, r.URL.Path, err)
			return
		}
		h.o.logger.Info("wharfconsole: flows/"+what, "instance", req.ID, "result", out, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, out)
	}
}

// refusal says why instance i refused change what.
func refusal(what string, i *wharfflow.Instance) string {
	switch what {
	case "retry":
		return fmt.Sprintf("instance %d is %s, not failed: only a failed instance can be retried", i.ID, i.Status)
	case "cancel":
		return fmt.Sprintf("instance %d has already ended (%s): nothing to cancel", i.ID, i.Status)
	}
	return fmt.Sprintf("instance %d has ended (%s): signals go to instances that have not ended", i.ID, i.Status)
}

func (h *console) flowRetry(ctx context.Context, req flowChangeRequest) (map[string]any, error) {
	if err := h.o.flows.Retry(ctx, req.ID); err != nil {
		return nil, err
	}
	return map[string]any{"retried": 1}, nil
}

// maxRetryMany bounds a retry of several instances (the list's largest page).
const maxRetryMany = 1000

// flowRetryMany retries the failed instances among req.IDs (after an
// outage, every failed instance of a flow): those that have not failed, or
// no longer exist, are skipped and named.
func (h *console) flowRetryMany(w http.ResponseWriter, r *http.Request, req flowChangeRequest, usage, what string) {
	switch {
	case what != "retry":
		writeError(w, http.StatusBadRequest, "ids: only a retry takes several instances: send "+usage)
		return
	case req.ID != 0:
		writeError(w, http.StatusBadRequest, "give id or ids, not both: send "+usage)
		return
	case len(req.IDs) > maxRetryMany:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%d ids: retry at most %d at once", len(req.IDs), maxRetryMany))
		return
	}
	for _, id := range req.IDs {
		if id < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("id %d: instance ids are positive numbers, as the Flows list shows", id))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if !h.flowsReady(ctx, w) {
		return
	}
	retried, skipped := 0, []int64{}
	for _, id := range req.IDs {
		err := h.o.flows.Retry(ctx, id)
		switch {
		case err == nil:
			retried++
		case errors.Is(err, wharfflow.ErrNoInstance):
			skipped = append(skipped, id)
		default:
			if retried > 0 {
				h.o.logger.Info("wharfconsole: flows/retry", "instances", req.IDs, "retried", retried, "remote", r.RemoteAddr)
			}
			h.flowFail(w, r.URL.Path, fmt.Errorf("after %d retried: %w", retried, err))
			return
		}
	}
	out := map[string]any{"retried": retried, "skipped": skipped}
	h.o.logger.Info("wharfconsole: flows/retry", "instances", req.IDs, "result", out, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, out)
}

func (h *console) flowCancel(ctx context.Context, req flowChangeRequest) (map[string]any, error) {
	n, err := h.o.flows.Cancel(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"cancelled": n}, nil
}

func (h *console) flowSignal(ctx context.Context, req flowChangeRequest) (map[string]any, error) {
	s := wharfflow.Signal{Instance: req.ID, Name: strings.TrimSpace(req.Name), DedupKey: req.DedupKey}
	if p := strings.TrimSpace(string(req.Payload)); p != "" && p != "null" {
		s.Payload = req.Payload
	}
	ids, err := h.o.flows.Send(ctx, s)
	if err != nil {
		return nil, err
	}
	return map[string]any{"signal": ids[0]}, nil
}

// flowFail answers a failed flow call: 403 naming the privilege when the
// console's database role lacks it (a role made for the outbox alone),
// otherwise as fail does.
func (h *console) flowFail(w http.ResponseWriter, what string, err error) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		h.o.logger.Warn("wharfconsole: "+what, "err", err)
		writeError(w, http.StatusForbidden, "the console's database role may not do this: "+pe.Message+": grant it the privilege, or start the console as a role that may")
		return
	}
	h.fail(w, what, err)
}
