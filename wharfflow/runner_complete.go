package wharfflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf"
)

// complete writes outcomes in batches: whatever came while the previous
// batch was being written goes in the next one, after the results of
// batons the previous write made running (resubmitted).
func (r *Runner) complete(ctx context.Context, claimDone <-chan struct{}) {
	batch := make([]result, 0, r.cfg.MaxInFlight)
	for {
		batch = r.takeResubmitted(batch[:0])
		if len(batch) == 0 {
			select {
			case res := <-r.results:
				batch = append(batch, res)
			case <-claimDone:
				// The claim loop waited for its steps; write what they left,
				// and what those writes resubmit.
				for {
					for {
						select {
						case res := <-r.results:
							batch = append(batch, res)
							continue
						default:
						}
						break
					}
					if len(batch) == 0 {
						return
					}
					r.write(ctx, batch)
					batch = r.takeResubmitted(batch[:0])
				}
			}
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case res := <-r.results:
				batch = append(batch, res)
			default:
				break more
			}
		}
		r.write(ctx, batch)
	}
}

// takeResubmitted appends the resubmitted results to batch.
func (r *Runner) takeResubmitted(batch []result) []result {
	r.mu.Lock()
	defer r.mu.Unlock()
	batch = append(batch, r.resubmit...)
	r.resubmit = r.resubmit[:0]
	return batch
}

// write applies one batch of outcomes: one statement, or a transaction of
// two when outcomes emit outbox messages. Outcomes of steps whose lease was
// lost are not applied, and their messages are not enqueued. The write may
// lease instances to the runner (planLeases); release runs them.
func (r *Runner) write(runCtx context.Context, batch []result) {
	ctx := context.WithoutCancel(runCtx)
	// In id order, the order the write locks the instances in, as every
	// writer does: none waits on another in a cycle. Halves of the batch
	// (writeSplit) keep it.
	slices.SortFunc(batch, func(a, b result) int { return cmp.Compare(a.c.ID, b.c.ID) })
	plan := r.planLeases(runCtx, batch)
	wr := r.writeSplit(ctx, runCtx, batch, plan.flows, plan.budget)
	if len(wr.leased) > 0 {
		r.leasedTraces(ctx, batch, wr.leased)
	}
	if len(wr.resumed) > 0 {
		traces := make(map[int64]map[string]string, len(batch))
		for i := range batch {
			traces[batch[i].c.ID] = batch[i].c.Trace
		}
		for i := range wr.resumed {
			wr.resumed[i].Trace = traces[wr.resumed[i].ID]
		}
	}
	r.release(runCtx, batch, wr, plan.reserve)
}

// writeSplit writes part, and when the database refuses it (a value it
// cannot store, a limit: refused), writes each half of it alone, down to
// the one outcome it refuses, which fails its instance alone with the
// reason (refusedOutcome): no other step of the batch runs again. A write
// that fails otherwise (the database unreachable) is retried as a whole
// (writeRetrying).
func (r *Runner) writeSplit(ctx, runCtx context.Context, part []result, flows []string, budget int) writeResult {
	wr, err := r.writeRetrying(ctx, runCtx, part, flows, budget)
	if err == nil {
		return wr
	}
	if !refused(err) {
		r.cfg.Logger.Error("wharfflow: writing outcomes failed; the steps run again after their leases", "err", err, "steps", len(part))
		return writeResult{}
	}
	if len(part) == 1 {
		res := &part[0]
		if res.w.refused {
			// Even the failure was refused: the fault is not this outcome's.
			r.cfg.Logger.Error("wharfflow: writing an outcome failed; the step runs again after its lease", "err", err,
				"instance", res.c.ID, "step", res.c.Step)
			return writeResult{}
		}
		r.cfg.Logger.Warn("wharfflow: the database refused a step's outcome; failing its instance", "err", err,
			"instance", res.c.ID, "flow", res.c.Flow, "step", res.c.Step)
		res.w = refusedOutcome(res.c, res.w, err)
		res.emit = nil
		return r.writeSplit(ctx, runCtx, part, flows, budget)
	}
	half := len(part) / 2
	a := r.writeSplit(ctx, runCtx, part[:half], flows, budget)
	b := r.writeSplit(ctx, runCtx, part[half:], flows, budget-a.leasedBySQL)
	return a.merge(b)
}

// refusedOutcome is the failure of a step whose outcome the database
// refused: the instance fails with the reason, its saved state kept, its
// messages not enqueued; its signals are consumed (the failure is its
// outcome) and its attempt counted in its history.
func refusedOutcome(c claimed, w wireOutcome, err error) wireOutcome {
	return wireOutcome{ID: w.ID, Token: w.Token, Kind: "fail", Attempt: c.Attempt, RanStep: w.RanStep, StartedAt: w.StartedAt,
		Consumed: w.Consumed, Parent: c.parent, refused: true,
		Error: storableText(fmt.Sprintf("the database refused the step's outcome (%s): %s", w.Kind, oneLine(err)))}
}

// refused reports whether the database (or the outbox, for an emitted
// message) refused what a write carried (a value, a size), as opposed to
// failing whatever it carried (unreachable, restarting, a deadlock, a
// missing right): data exceptions, integrity violations, program limits,
// and messages EnqueueTx refuses before writing anything.
func refused(err error) bool {
	if errors.Is(err, wharf.ErrInvalidMessage) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		var syntax *json.SyntaxError
		var marshal *json.MarshalerError
		return errors.As(err, &syntax) || errors.As(err, &marshal)
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// writeRetrying writes part, retrying a write that failed for reasons not
// its own (refused: returned at once) for a lease's time: the steps' leases
// are renewed meanwhile (they stay in inflight until release), so a short
// outage of the database costs no step a second run. Past that, or after a
// few attempts once the runner is stopping, it gives up (the steps run
// again after their leases) rather than hold every later outcome of the
// runner behind a write that cannot succeed. Each attempt has a lease's
// time: a write longer than that is fenced anyway.
func (r *Runner) writeRetrying(ctx, runCtx context.Context, part []result, flows []string, budget int) (writeResult, error) {
	giveUp := time.Now().Add(r.cfg.LeaseTTL)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL)
		wr, err := r.writeOnce(actx, part, flows, budget)
		cancel()
		if err == nil || refused(err) || (attempt >= 4 && (runCtx.Err() != nil || time.Now().After(giveUp))) {
			return wr, err
		}
		r.cfg.Logger.Warn("wharfflow: writing outcomes, will retry", "err", err, "steps", len(part))
		time.Sleep(min(time.Duration(50<<min(attempt, 10))*time.Millisecond, 5*time.Second))
	}
}

// completeSQL calls complete_flow_steps; its rows are read by scanApplied.
func (r *Runner) completeSQL() string {
	return "SELECT kind, id, token, flow, step, state, attempt, parent_id, children, signals, concurrency_key, rate_key, wait FROM " +
		r.cfg.Schema + ".complete_flow_steps($1, $2::jsonb, $3, $4, $5, $6, $7, $8, $9)"
}

// writeOnce writes part in one transaction: its outcomes, and the messages
// of those applied.
func (r *Runner) writeOnce(ctx context.Context, part []result, flows []string, budget int) (writeResult, error) {
	ws := make([]wireOutcome, len(part))
	emits := false
	for i := range part {
		ws[i] = part[i].w
		emits = emits || len(part[i].emit) > 0
	}
	doc, err := json.Marshal(ws)
	if err != nil {
		return writeResult{}, err
	}
	// The batons named for the slots the part's steps free.
	var bt batonArgs
	for i := range part {
		if b := part[i].baton; b != nil {
			bt.ids = append(bt.ids, b.ID)
			bt.tokens = append(bt.tokens, b.Token)
			bt.keys = append(bt.keys, b.ckey)
			bt.started = append(bt.started, part[i].batonStarted)
		}
	}
	wr := writeResult{applied: map[int64]int64{}}
	if !emits {
		err = r.scanApplied(ctx, r.pool, string(doc), flows, budget, bt, &wr)
	} else {
		err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if err := r.scanApplied(ctx, tx, string(doc), flows, budget, bt, &wr); err != nil {
				return err
			}
			var msgs []wharf.Message
			for i := range part {
				if _, ok := wr.applied[part[i].c.ID]; ok {
					msgs = append(msgs, part[i].emit...)
				}
			}
			_, err := r.outbox.EnqueueTx(ctx, tx, msgs...)
			return err
		})
	}
	if err != nil {
		return writeResult{}, err
	}
	return wr, nil
}

// writeResult is what complete_flow_steps answered.
type writeResult struct {
	// applied are the applied outcomes' ids, with the new token of those
	// that continue on their lease (0 for the others).
	applied map[int64]int64
	// leased are the instances the write leased to the runner: spawned
	// children, parents at their join step, steps that waited for a slot
	// of a concurrency key.
	leased []claimed
	// resumed are the awaits of the batch whose signal came first, leased
	// back to the runner with their signals.
	resumed []claimed
	// batons are steps of concurrency keys the write reserved to the
	// runner (flow_key_free).
	batons []claimed
	// leasedBySQL counts the leases taken from the write's budget (all but
	// the children the runner marked).
	leasedBySQL int
	// due is how many steps the write made due for any runner's claim.
	due int64
}

func (a writeResult) merge(b writeResult) writeResult {
	if a.applied == nil {
		a.applied = map[int64]int64{}
	}
	for id, t := range b.applied {
		a.applied[id] = t
	}
	a.leased = append(a.leased, b.leased...)
	a.resumed = append(a.resumed, b.resumed...)
	a.batons = append(a.batons, b.batons...)
	a.leasedBySQL += b.leasedBySQL
	a.due += b.due
	return a
}

// leasePlan is what a write may lease to the runner.
type leasePlan struct {
	flows   []string // the runner's flows; nil: lease nothing (stopping)
	budget  int      // leases complete_flow_steps may give besides marked children
	reserve int      // slots reserved for the write beyond those its batch frees
}

// planLeases decides how many instances the write may lease to the
// runner, marking in the batch's spawns the children it asks to lease, and
// reserves the slots they need.
//
// Every outcome but a continued Next frees its slot with the write (one
// that passed its slot to a baton already running does not). Those slots,
// and beyond them free slots not promised to a claim in flight, go first to
// what the write may lease in its own statements (budget): an await of an
// instance without keys whose signal came first, the join of a done or
// failed child's parent, a baton named in an outcome or the next waiting
// step of the concurrency key of a step that ended; then to spawned
// children (of the runner's flows, without keys: a keyed child goes
// through the claim, which applies its keys). Children left over are
// inserted due, for any runner's claim.
func (r *Runner) planLeases(ctx context.Context, batch []result) leasePlan {
	freed, other, want := 0, 0, 0
	for i := range batch {
		c, w := &batch[i].c, &batch[i].w
		switch {
		case w.Cont:
		case batch[i].batonStarted:
			// Its slot went to the baton already running.
		case batch[i].baton != nil:
			freed++ // for the baton, once the write makes it running
			other++
		default:
			freed++
			if c.ckey != "" {
				other++ // the key's next waiting step
			}
		}
		switch w.Kind {
		case "await":
			if c.ckey == "" && c.rkey == "" {
				other++
			}
		case "done", "fail":
			if c.parent != 0 {
				other++
			}
		case "spawn":
			for _, ch := range w.Children {
				if r.leasable(ch) {
					want++
				}
			}
		}
	}
	r.mu.Lock()
	if r.closing || ctx.Err() != nil {
		r.mu.Unlock()
		return leasePlan{}
	}
	reserve := max(0, min(other+want-freed, r.freeSlots()))
	r.reserved += reserve
	r.mu.Unlock()
	budget := freed + reserve
	other = min(other, budget)
	budget -= other
	for i := range batch {
		w := &batch[i].w
		if w.Kind != "spawn" || budget <= 0 {
			continue
		}
		kids := slices.Clone(w.Children)
		for j := range kids {
			if budget > 0 && r.leasable(kids[j]) {
				kids[j].Lease = true
				budget--
			}
		}
		w.Children = kids
	}
	return leasePlan{flows: r.names, budget: other, reserve: reserve}
}

// leasable: a child the write may lease to this runner.
func (r *Runner) leasable(ch wireChild) bool {
	_, ok := r.flows[ch.Flow]
	return ok && ch.ConcurrencyKey == "" && ch.RateKey == ""
}

// leasedTraces gives the instances a write leased their trace context: a
// child its spawning step's (a child has none of its own, its nearest
// ancestor's is its parent's), the others their own, read as a claim's are.
func (r *Runner) leasedTraces(ctx context.Context, batch []result, leased []claimed) {
	if r.cfg.Tracer == nil {
		return
	}
	spawners := map[int64]map[string]string{}
	for i := range batch {
		spawners[batch[i].c.ID] = batch[i].c.Trace
	}
	var others []claimed
	var at []int
	for i := range leased {
		if t, ok := spawners[leased[i].parent]; ok && leased[i].child {
			leased[i].Trace = t
			continue
		}
		others = append(others, leased[i])
		at = append(at, i)
	}
	if err := r.loadTraces(ctx, others); err != nil {
		r.cfg.Logger.Warn("wharfflow: reading the leased steps' trace context", "err", err)
		return
	}
	for k, i := range at {
		leased[i].Trace = others[k].Trace
	}
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// batonArgs are complete_flow_steps's baton parameters.
type batonArgs struct {
	ids, tokens []int64
	keys        []string
	started     []bool
}

// scanApplied runs complete_flow_steps and reads its answer into wr.
func (r *Runner) scanApplied(ctx context.Context, q queryer, doc string, flows []string, budget int, bt batonArgs, wr *writeResult) error {
	rows, err := q.Query(ctx, r.completeSQL(), r.cfg.RunnerID, doc, r.cfg.LeaseTTL, flows, budget, bt.ids, bt.tokens, bt.keys, bt.started)
	if err != nil {
		return err
	}
	defer rows.Close()
	read := time.Now()
	for rows.Next() {
		var kind string
		var id int64
		var token, parent *int64
		var flow, step, ckey, rkey *string
		var state, children, signals []byte
		var attempt *int
		var wait *float64
		if err := rows.Scan(&kind, &id, &token, &flow, &step, &state, &attempt, &parent, &children, &signals, &ckey, &rkey, &wait); err != nil {
			return err
		}
		switch kind {
		case "due": // the steps made due
			if token != nil {
				wr.due = *token
			}
		case "applied":
			wr.applied[id] = 0
			if token != nil {
				wr.applied[id] = *token
			}
		default: // an instance leased to the runner
			c := claimed{ID: id, Flow: *flow, State: state, child: kind == "child"}
			if token != nil {
				c.Token = *token
			}
			if step != nil {
				c.Step = *step
			}
			if attempt != nil {
				c.Attempt = *attempt
			}
			if err := c.decode(wait, signals, children, parent, ckey, rkey); err != nil {
				return err
			}
			// The lease began when the write's statement did: LeaseTTL
			// before its end.
			c.leased = read.Add(c.left - r.cfg.LeaseTTL)
			switch kind {
			case "baton": // reserved, not running: no slot yet
				wr.batons = append(wr.batons, c)
			case "await":
				wr.leasedBySQL++
				wr.resumed = append(wr.resumed, c)
			default:
				if !c.child {
					wr.leasedBySQL++
				}
				wr.leased = append(wr.leased, c)
			}
		}
	}
	return rows.Err()
}

// release frees the batch's slots, runs the next step of those that
// continue on their lease and the instances the write leased to the runner
// (or hands them back when it is stopping), returns the write's reserved
// slots, counts the batch and wakes the claim loop when a claim may find
// something.
func (r *Runner) release(ctx context.Context, batch []result, wr writeResult, reserve int) {
	var back []claimed
	lateWoken := false
	r.mu.Lock()
	r.ranSeq++
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		if s, ok := r.inflight[id]; ok && s.token == res.c.Token {
			s.cancel(nil)
			delete(r.inflight, id)
		}
		if len(res.c.Signals) > 0 && r.reading != 0 {
			r.ran[id] = ranStep{token: res.c.Token, seq: r.ranSeq}
		}
		if r.late[id] {
			delete(r.late, id)
			r.wakeIDs = append(r.wakeIDs, id)
			lateWoken = true
		}
	}
	r.reserved -= reserve
	stopping := r.closing || ctx.Err() != nil
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		token := wr.applied[id]
		if token == 0 {
			continue
		}
		next := claimed{ID: id, Flow: res.c.Flow, Step: res.w.Step, State: res.w.State, Token: token, Trace: res.c.Trace,
			parent: res.c.parent, leased: res.c.leased}
		if stopping {
			back = append(back, next)
			continue
		}
		r.run(ctx, next, res.chain+1)
	}
	var resubmit []result
	made := map[int64]bool{}
	for _, c := range wr.leased {
		made[c.ID] = true
	}
	// First the batons named that the write did not make running (their
	// reservation lost, their instance cancelled, their key paused or with
	// no free slot): handed back, and those started commit nothing and stop
	// before the steps the write leased start.
	for i := range batch {
		b := batch[i].baton
		if b == nil || made[b.ID] {
			continue
		}
		back = append(back, *b)
		if !batch[i].batonStarted {
			continue
		}
		if s, ok := r.inflight[b.ID]; ok && s.token == b.Token {
			s.cancel(errLeaseLost)
			if _, ok := r.deferred[b.ID]; ok {
				delete(r.deferred, b.ID)
				delete(r.inflight, b.ID)
			} else {
				s.dropped = true
			}
			r.stats.lost.Add(1)
		}
	}
	for _, c := range wr.leased {
		if s, ok := r.inflight[c.ID]; ok && s.token == c.Token && s.unconverted {
			// A baton started before this write made it running.
			s.unconverted = false
			if res, ok := r.deferred[c.ID]; ok {
				delete(r.deferred, c.ID)
				resubmit = append(resubmit, res)
			}
			continue
		}
		if stopping {
			back = append(back, c)
			continue
		}
		r.stats.leased.Add(1) // before the step starts, for whoever it tells
		r.run(ctx, c, 0)
	}
	keys := map[string]bool{}
	for _, c := range wr.batons {
		if stopping {
			back = append(back, c)
			continue
		}
		r.batons[c.ckey] = append(r.batons[c.ckey], c)
		keys[c.ckey] = true
	}
	// A baton started before its write made it running may have ended
	// meanwhile, with no baton of its own to pass on: it passes one now,
	// before its result is written.
	for i := range resubmit {
		if res := &resubmit[i]; res.c.ckey != "" && res.baton == nil && !stopping {
			r.passBaton(ctx, res)
			keys[res.c.ckey] = true
		}
	}
	for key := range keys {
		r.spareBatons(ctx, key)
	}
	for _, c := range wr.resumed {
		if s, ok := r.inflight[c.ID]; ok && s.token >= c.Token {
			continue // running it already
		}
		if stopping || r.freeSlots() <= 0 {
			back = append(back, c)
			continue
		}
		r.stats.signalled.Add(1)
		r.run(ctx, c, 0)
	}
	// The completer writes them next (release runs in its goroutine).
	r.resubmit = append(r.resubmit, resubmit...)
	if !stopping {
		r.startQueued(ctx)
	}
	r.mu.Unlock()
	if lateWoken {
		r.wakeLater()
	}
	if len(back) > 0 {
		r.handBack(ctx, back)
	}
	// A claim may find something when the write made steps due (children
	// it did not lease, joins and keys' next steps, awaits whose signal
	// came first: complete_flow_steps notifies them too, but the
	// listener's round trip is slower than this), when an outcome
	// scheduled its own instance (NextAt, Retry, RateLimited, an Await's
	// deadline: the claim sets the timer), or a slot freed while the claim
	// loop waited for one. Steps continued on their lease, and instances
	// leased to the runner, need no claim.
	wake := r.starved.Load() || wr.due > 0 || len(back) > 0
	for i := range batch {
		token, ok := wr.applied[batch[i].c.ID]
		r.stats.observe(batch[i], ok)
		r.cfg.Metrics.observe(batch[i], ok)
		if !ok {
			r.cfg.Logger.Warn("wharfflow: outcome not applied: the step's lease was lost (or the instance cancelled)",
				"instance", batch[i].c.ID, "step", batch[i].c.Step)
			// Its lease still ends: the claim sets the timer for it.
			wake = true
			continue
		}
		switch w := batch[i].w; w.Kind {
		case "next", "retry", "paused":
			wake = wake || token == 0
		case "await":
			wake = wake || w.Deadline != nil
		}
	}
	if wake {
		r.poke()
	}
}

// oneLine is err's text on one line.
func oneLine(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	return err.Error()
}
