package wharfflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/backoff"
)

// StepFunc is one step of a flow. It may change *state; the state it leaves
// is saved with the outcome it returns. Side effects outside the database
// should be keyed by in.IdempotencyKey: a step runs again when its runner
// dies before its outcome commits.
type StepFunc[S any] func(ctx context.Context, state *S, in Input) Outcome

// Input is what a step receives besides its state.
type Input struct {
	// Instance is the flow instance's id.
	Instance int64
	// Flow and Step name the flow and the step running.
	Flow, Step string
	// Attempt is 0 on a step's first run and grows with each Retry.
	Attempt int
	// Signals are the awaited signals the step consumes (empty unless the
	// step was resumed by Await, oldest first). Its outcome marks them
	// consumed.
	Signals []ReceivedSignal
	// Children are the outcomes of the children spawned by the previous
	// step, for a join step (see Spawn).
	Children []ChildResult
	// IdempotencyKey is "<instance>/<step>/<attempt>": the same when a step
	// is run again after its runner died, different on each Retry.
	IdempotencyKey string
}

// ReceivedSignal is a signal as a step receives it.
type ReceivedSignal struct {
	ID      int64           `json:"id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload"`
	At      time.Time       `json:"at"`
}

// ChildResult is how a child instance ended.
type ChildResult struct {
	ID   int64  `json:"id"`
	Flow string `json:"flow"`
	// Status is done, failed or cancelled.
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
	Error  string          `json:"error"`
}

// Options are an instance's flow-control settings.
type Options struct {
	// Priority orders due steps: higher first. Defaults to 0.
	Priority int
	// ConcurrencyKey, when set, admits at most the key's limit of running
	// steps of instances with this key at once (across runners).
	ConcurrencyKey string
	// ConcurrencyLimit proposes the key's limit; defaults to 1: one step at
	// a time per key. The limit is the key's, not the instance's: it is
	// Config.ConcurrencyLimits[key] when a runner sets it, or else the
	// ConcurrencyLimit of the first instance of the key a claim sees;
	// instances started later with another value follow the key's.
	ConcurrencyLimit int
	// RateKey, when set, takes one token per step from the key's token
	// bucket (Config.RateLimits), and is paused by RateLimited.
	RateKey string
}

// StartOptions are Options plus what only a top-level start has.
type StartOptions struct {
	// Key is the correlation key: at most one instance of the flow with this
	// key is active (not done, failed or cancelled: a failed instance gives
	// its key up); starting another returns the active one's id. Signals may
	// address the instance by it.
	Key string
	// RunAt, when set, is when the first step may run.
	RunAt time.Time
	Options
}

// FlowConfig holds a flow's retry policy.
type FlowConfig struct {
	// MaxAttempts is how many times a step runs before Retry fails the
	// instance. Defaults to 5.
	MaxAttempts int
	// RetryBackoff is the first Retry's delay, doubled on each attempt with
	// jitter. Defaults to 1s.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the delay. Defaults to 5m.
	MaxRetryBackoff time.Duration
}

// Flow is a named set of steps over a state of type S, saved as JSON.
type Flow[S any] struct {
	name  string
	first string
	steps map[string]StepFunc[S]
	cfg   FlowConfig
}

// New returns an empty flow called name. Add steps with Step; the first one
// added is where instances start.
func New[S any](name string, cfg *FlowConfig) *Flow[S] {
	f := &Flow[S]{name: name, steps: map[string]StepFunc[S]{}}
	if cfg != nil {
		f.cfg = *cfg
	}
	if f.cfg.MaxAttempts <= 0 {
		f.cfg.MaxAttempts = 5
	}
	if f.cfg.RetryBackoff <= 0 {
		f.cfg.RetryBackoff = time.Second
	}
	if f.cfg.MaxRetryBackoff <= 0 {
		f.cfg.MaxRetryBackoff = 5 * time.Minute
	}
	return f
}

// Step adds a step called name. It panics on an empty, repeated or
// unstorable name (invalid UTF-8, a NUL): a flow's steps are fixed at
// startup.
func (f *Flow[S]) Step(name string, fn StepFunc[S]) *Flow[S] {
	if name == "" || fn == nil {
		panic("wharfflow: a step needs a name and a function")
	}
	if err := checkText(name); err != nil {
		panic(fmt.Sprintf("wharfflow: flow %s: step name %q %v", f.name, name, err))
	}
	if _, dup := f.steps[name]; dup {
		panic(fmt.Sprintf("wharfflow: flow %s has two steps called %s", f.name, name))
	}
	if f.first == "" {
		f.first = name
	}
	f.steps[name] = fn
	return f
}

// Name is the flow's name.
func (f *Flow[S]) Name() string { return f.name }

// Start describes a new instance of f with the given state, for
// Client.Start, StartTx and StartSQLTx.
func (f *Flow[S]) Start(state S, o StartOptions) Start {
	b, err := json.Marshal(state)
	return Start{flow: f.name, step: f.first, state: b, opts: o, err: err}
}

// Child describes a child instance of f, for Spawn.
func (f *Flow[S]) Child(state S, o Options) Child {
	b, err := json.Marshal(state)
	return Child{flow: f.name, step: f.first, state: b, opts: o, err: err}
}

// Start is an instance to start (Flow.Start).
type Start struct {
	flow, step string
	state      []byte
	opts       StartOptions
	err        error
}

// Child is a child instance to spawn (Flow.Child).
type Child struct {
	flow, step string
	state      []byte
	opts       Options
	err        error
}

// Definition is a flow as the runner holds it: a *Flow[S] of any S.
type Definition interface {
	Name() string
	run(ctx context.Context, state []byte, in Input) ([]byte, Outcome)
	firstStep() string
	stepNames() []string
	hasStep(name string) bool
	config() FlowConfig
}

func (f *Flow[S]) firstStep() string        { return f.first }
func (f *Flow[S]) config() FlowConfig       { return f.cfg }
func (f *Flow[S]) hasStep(name string) bool { _, ok := f.steps[name]; return ok }

// stepNames are the flow's steps, the first one first, then by name.
func (f *Flow[S]) stepNames() []string {
	out := []string{f.first}
	for name := range f.steps {
		if name != f.first {
			out = append(out, name)
		}
	}
	slices.Sort(out[1:])
	return out
}

// run decodes the state, runs the step (a panic is a Retry) and encodes the
// state it leaves.
func (f *Flow[S]) run(ctx context.Context, state []byte, in Input) (out []byte, o Outcome) {
	fn, ok := f.steps[in.Step]
	if !ok {
		return nil, Fail(fmt.Errorf("flow %s has no step %s", f.name, in.Step))
	}
	var s S
	if len(state) > 0 {
		if err := json.Unmarshal(state, &s); err != nil {
			return nil, Fail(fmt.Errorf("decoding the state of flow %s: %w", f.name, err))
		}
	}
	defer func() {
		if p := recover(); p != nil {
			out, o = nil, Retry(fmt.Errorf("step %s panicked: %v", in.Step, p))
		}
	}()
	o = fn(ctx, &s, in)
	b, err := json.Marshal(&s)
	if err != nil {
		return nil, Fail(fmt.Errorf("encoding the state of flow %s: %w", f.name, err))
	}
	return b, o
}

type kind uint8

const (
	kindNone kind = iota
	kindNext
	kindRetry
	kindAwait
	kindSpawn
	kindDone
	kindFail
	kindPaused
)

func (k kind) String() string {
	return [...]string{"none", "next", "retry", "await", "spawn", "done", "fail", "paused"}[k]
}

// Outcome is what a step returns: exactly one of the constructors below,
// optionally with outbox messages (Emit) committed with it.
type Outcome struct {
	kind        kind
	step        string
	at          time.Time
	delay       time.Duration
	err         error
	result      any
	signals     []string
	deadline    time.Time
	timeoutStep string
	children    []Child
	pauseKey    string
	emit        []wharf.Message
}

// Next runs step next, as soon as a runner is free.
func Next(step string) Outcome { return Outcome{kind: kindNext, step: step} }

// NextAt runs step next, never before at.
func NextAt(step string, at time.Time) Outcome { return Outcome{kind: kindNext, step: step, at: at} }

// Retry runs the same step again after the flow's backoff, or fails the
// instance (keeping err) once the flow's MaxAttempts are spent.
func Retry(err error) Outcome { return Outcome{kind: kindRetry, err: err} }

// RetryAfter is Retry after delay d instead of the backoff.
func RetryAfter(err error, d time.Duration) Outcome {
	return Outcome{kind: kindRetry, err: err, delay: max(d, time.Nanosecond)}
}

// Await waits for one of the named signals, then runs step then with every
// pending signal of those names. A signal sent before the await is kept and
// resumes it at once. Add a deadline with Deadline.
func Await(then string, signals ...string) Outcome {
	return Outcome{kind: kindAwait, step: then, signals: signals}
}

// Deadline makes an Await run timeoutStep at at when no awaited signal has
// come by then.
func (o Outcome) Deadline(at time.Time, timeoutStep string) Outcome {
	o.deadline, o.timeoutStep = at, timeoutStep
	return o
}

// Spawn starts children and runs step join, with their results
// (Input.Children), once every one of them has ended (done, failed or
// cancelled).
func Spawn(join string, children ...Child) Outcome {
	return Outcome{kind: kindSpawn, step: join, children: children}
}

// Done ends the instance with result (saved as JSON; nil for none).
func Done(result any) Outcome { return Outcome{kind: kindDone, result: result} }

// Fail ends the instance as failed with err; an operator may retry it from
// this step (Client.Retry, `wharf flow retry`).
func Fail(err error) Outcome { return Outcome{kind: kindFail, err: err} }

// RateLimited pauses every step on key (instances whose RateKey or
// ConcurrencyKey is key) until until, and runs this step again then, without
// spending an attempt: for an upstream's 429 with Retry-After.
func RateLimited(key string, until time.Time) Outcome {
	return Outcome{kind: kindPaused, pauseKey: key, at: until}
}

// Emit adds outbox messages that commit with the outcome, and only if it
// commits (the relay then delivers them).
func (o Outcome) Emit(msgs ...wharf.Message) Outcome {
	o.emit = append(append([]wharf.Message(nil), o.emit...), msgs...)
	return o
}

// errNoOutcome is the error of a step that returned the zero Outcome.
var errNoOutcome = errors.New("the step returned no outcome (use Next, Retry, Await, Spawn, Done, Fail or RateLimited)")

// wireOutcome is an outcome as complete_flow_steps reads it.
type wireOutcome struct {
	ID          int64           `json:"id"`
	Token       int64           `json:"token"`
	Kind        string          `json:"kind"`
	Step        string          `json:"step,omitempty"`
	State       json.RawMessage `json:"state,omitempty"`
	Attempt     int             `json:"attempt"`
	RunAt       *time.Time      `json:"run_at,omitempty"`
	Delay       float64         `json:"delay,omitempty"`
	Error       string          `json:"error,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	AwaitNames  []string        `json:"await_names,omitempty"`
	Deadline    *time.Time      `json:"deadline,omitempty"`
	TimeoutStep string          `json:"timeout_step,omitempty"`
	Consumed    []int64         `json:"consumed,omitempty"`
	Children    []wireChild     `json:"children,omitempty"`
	PauseKey    string          `json:"pause_key,omitempty"`
	PauseUntil  *time.Time      `json:"pause_until,omitempty"`
	RanStep     string          `json:"ran_step"`
	StartedAt   time.Time       `json:"started_at"`
	// Cont asks to keep the lease for the next step (see continueChain).
	Cont bool `json:"cont,omitempty"`
	// Parent is the instance's parent, for a done or failed child: the
	// write locks it before the child (as every writer does) and checks its
	// join.
	Parent int64 `json:"parent,omitempty"`
	// refused: encode turned the step's outcome into a failure (an outcome
	// the database would refuse, or a malformed one); its messages are not
	// enqueued.
	refused bool
}

type wireChild struct {
	Flow             string          `json:"flow"`
	Step             string          `json:"step"`
	State            json.RawMessage `json:"state"`
	Priority         int             `json:"priority,omitempty"`
	ConcurrencyKey   string          `json:"concurrency_key,omitempty"`
	ConcurrencyLimit int             `json:"concurrency_limit,omitempty"`
	RateKey          string          `json:"rate_key,omitempty"`
	// Lease asks the write to insert the child leased to the runner, which
	// runs it without a claim (Runner.write decides, by its free slots).
	Lease bool `json:"lease,omitempty"`
}

// ptrTime is t for the database, rounded up to its microseconds so that
// "not before t" holds; nil for the zero time.
func ptrTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	if r := t.Truncate(time.Microsecond); r.Before(t) {
		t = r.Add(time.Microsecond)
	}
	return &t
}

// encode turns a step's outcome into the row write, applying the flow's
// retry policy. A malformed outcome, or one the database would refuse (a
// state, result or name it cannot store, a message the outbox refuses),
// fails the instance alone with the reason, keeping its saved state and
// enqueueing none of its messages: written with its batch, it would fail
// every outcome of the batch.
func encode(def Definition, c *claimed, state []byte, o *Outcome, started time.Time) wireOutcome {
	w := encodeOutcome(def, c, state, o, started)
	if w.Kind == "done" || w.Kind == "fail" {
		w.Parent = c.parent
	}
	return w
}

func encodeOutcome(def Definition, c *claimed, state []byte, o *Outcome, started time.Time) wireOutcome {
	w := wireOutcome{ID: c.ID, Token: c.Token, State: state, RanStep: c.Step, StartedAt: started}
	for _, s := range c.Signals {
		w.Consumed = append(w.Consumed, s.ID)
	}
	fail := func(err error) wireOutcome {
		w = wireOutcome{ID: c.ID, Token: c.Token, Kind: "fail", Attempt: c.Attempt, Error: storableText(err.Error()),
			RanStep: c.Step, StartedAt: started, Consumed: w.Consumed, refused: true}
		return w
	}
	if o.kind == kindNone {
		return fail(errNoOutcome)
	}
	if state != nil {
		if err := checkJSON(state); err != nil {
			return fail(fmt.Errorf("the step's state cannot be saved: %w", err))
		}
	}
	if len(o.emit) > 0 {
		if err := validateEmit(o.emit); err != nil {
			return fail(err)
		}
	}
	w.Kind = o.kind.String()
	switch o.kind {
	case kindNext:
		if !def.hasStep(o.step) {
			return fail(fmt.Errorf("Next: flow %s has no step %q", def.Name(), o.step))
		}
		w.Step, w.RunAt = o.step, ptrTime(o.at)
	case kindRetry:
		cfg := def.config()
		if o.err != nil {
			w.Error = storableText(o.err.Error())
		} else {
			w.Error = "retry"
		}
		if c.Attempt+1 >= cfg.MaxAttempts {
			w.Kind, w.Attempt = "fail", c.Attempt
			w.Error = fmt.Sprintf("attempt %d of %d: %s", c.Attempt+1, cfg.MaxAttempts, w.Error)
			return w
		}
		w.Attempt = c.Attempt + 1
		d := o.delay
		if d <= 0 {
			d = backoff.Delay(c.Attempt+1, cfg.RetryBackoff, cfg.MaxRetryBackoff)
		}
		w.Delay = d.Seconds()
	case kindAwait:
		if len(o.signals) == 0 {
			return fail(errors.New("Await needs at least one signal name"))
		}
		for _, name := range o.signals {
			if name == "" {
				return fail(errors.New("Await: a signal name is empty"))
			}
			if err := checkText(name); err != nil {
				return fail(fmt.Errorf("Await: signal name %q %w", name, err))
			}
		}
		if !def.hasStep(o.step) {
			return fail(fmt.Errorf("Await: flow %s has no step %q", def.Name(), o.step))
		}
		if !o.deadline.IsZero() && !def.hasStep(o.timeoutStep) {
			return fail(fmt.Errorf("Await deadline: flow %s has no step %q", def.Name(), o.timeoutStep))
		}
		w.Step, w.AwaitNames, w.Deadline, w.TimeoutStep = o.step, o.signals, ptrTime(o.deadline), o.timeoutStep
	case kindSpawn:
		if !def.hasStep(o.step) {
			return fail(fmt.Errorf("Spawn: flow %s has no step %q", def.Name(), o.step))
		}
		w.Step = o.step
		if len(o.children) == 0 {
			w.Kind = "next"
			break
		}
		for i, ch := range o.children {
			if ch.err != nil {
				return fail(fmt.Errorf("Spawn: child %d state: %w", i, ch.err))
			}
			if ch.flow == "" {
				return fail(fmt.Errorf("Spawn: child %d has no flow (use Flow.Child)", i))
			}
			if err := checkJSON(ch.state); err != nil {
				return fail(fmt.Errorf("Spawn: child %d state cannot be saved: %w", i, err))
			}
			for _, k := range [...]struct{ name, v string }{{"flow", ch.flow}, {"ConcurrencyKey", ch.opts.ConcurrencyKey}, {"RateKey", ch.opts.RateKey}} {
				if err := checkKey(k.v); err != nil {
					return fail(fmt.Errorf("Spawn: child %d %s %q %w", i, k.name, k.v, err))
				}
			}
			w.Children = append(w.Children, wireChild{
				Flow: ch.flow, Step: ch.step, State: ch.state, Priority: ch.opts.Priority,
				ConcurrencyKey: ch.opts.ConcurrencyKey, ConcurrencyLimit: ch.opts.ConcurrencyLimit, RateKey: ch.opts.RateKey,
			})
		}
	case kindDone:
		if o.result != nil {
			b, err := json.Marshal(o.result)
			if err != nil {
				return fail(fmt.Errorf("Done: encoding the result: %w", err))
			}
			if err := checkJSON(b); err != nil {
				return fail(fmt.Errorf("Done: the result cannot be saved: %w", err))
			}
			w.Result = b
		}
	case kindFail:
		w.Attempt = c.Attempt
		if o.err != nil {
			w.Error = storableText(o.err.Error())
		} else {
			w.Error = "failed"
		}
	case kindPaused:
		if o.pauseKey == "" {
			return fail(errors.New("RateLimited needs a key"))
		}
		if err := checkKey(o.pauseKey); err != nil {
			return fail(fmt.Errorf("RateLimited: key %q %w", o.pauseKey, err))
		}
		w.Attempt, w.PauseKey, w.RunAt, w.PauseUntil = c.Attempt, o.pauseKey, ptrTime(o.at), ptrTime(o.at)
		w.Consumed = nil // the step runs again with them
		if w.RunAt == nil {
			now := time.Now()
			w.RunAt, w.PauseUntil = &now, &now
		}
	}
	if o.kind == kindRetry {
		w.Consumed = nil
	}
	return w
}

// validateEmit refuses the messages the outbox would refuse (EnqueueTx),
// naming the message and the field.
func validateEmit(msgs []wharf.Message) error {
	for i, m := range msgs {
		if m.Topic == "" {
			return fmt.Errorf("Emit: message %d has no Topic", i)
		}
		for _, f := range [...]struct{ name, v string }{{"Topic", m.Topic}, {"Key", m.Key}, {"DedupKey", m.DedupKey}} {
			if err := checkText(f.v); err != nil {
				return fmt.Errorf("Emit: message %d: %s %w", i, f.name, err)
			}
		}
		for k, v := range m.Headers {
			if checkText(k) != nil || checkText(v) != nil {
				return fmt.Errorf("Emit: message %d: header %q must be valid UTF-8 without NUL characters (encode binary values, e.g. base64)", i, k)
			}
		}
	}
	return nil
}

// checkText refuses what a PostgreSQL text value cannot hold.
func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("holds a NUL character (PostgreSQL text cannot)")
	}
	return nil
}

// maxKeyBytes is the longest correlation, concurrency or rate key: keys
// are index keys (PostgreSQL's index entries hold about 2,700 bytes).
const maxKeyBytes = 1000

// checkKey refuses a key the database would refuse (checkText, and
// maxKeyBytes).
func checkKey(s string) error {
	if err := checkText(s); err != nil {
		return err
	}
	if len(s) > maxKeyBytes {
		return fmt.Errorf("is %d bytes long: keys hold at most %d", len(s), maxKeyBytes)
	}
	return nil
}

// storableText is s as a text value can hold it: an error message keeps
// its meaning with a NUL or a broken UTF-8 sequence replaced.
func storableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// checkJSON refuses JSON that PostgreSQL's jsonb refuses although
// encoding/json writes it: invalid UTF-8, the escape \u0000 (a NUL
// character in a string), and a \u escape of half a surrogate pair. The
// input is JSON from encoding/json (or a json.RawMessage it checked).
func checkJSON(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("it holds invalid UTF-8")
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' || i+4 >= len(b) {
			continue
		}
		v, err := strconv.ParseUint(string(b[i+1:i+5]), 16, 32)
		if err != nil {
			continue
		}
		switch {
		case v == 0:
			return errors.New("it holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store")
		case v >= 0xD800 && v < 0xDC00: // a high surrogate must come with a low one
			if i+10 >= len(b) || b[i+5] != '\\' || b[i+6] != 'u' {
				return errors.New("it holds half a UTF-16 surrogate pair, which PostgreSQL's jsonb cannot store")
			}
			lo, err := strconv.ParseUint(string(b[i+7:i+11]), 16, 32)
			if err != nil || lo < 0xDC00 || lo >= 0xE000 {
				return errors.New("it holds half a UTF-16 surrogate pair, which PostgreSQL's jsonb cannot store")
			}
			i += 6 // and 4 below: past the low surrogate
		case v >= 0xDC00 && v < 0xE000:
			return errors.New("it holds half a UTF-16 surrogate pair, which PostgreSQL's jsonb cannot store")
		}
		i += 4
	}
	return nil
}

func idempotencyKey(id int64, step string, attempt int) string {
	return strconv.FormatInt(id, 10) + "/" + step + "/" + strconv.Itoa(attempt)
}
