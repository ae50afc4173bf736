package wharfflow

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wharfhq/wharf"
)

// complete writes outcomes in batches: whatever came while the previous
// batch was being written goes in the next one.
func (r *Runner) complete(ctx context.Context, claimDone <-chan struct{}) {
	batch := make([]result, 0, r.cfg.MaxInFlight)
	for {
		select {
		case res := <-r.results:
			batch = append(batch[:0], res)
		case <-claimDone:
			// The claim loop waited for its steps; write what they left.
			for {
				select {
				case res := <-r.results:
					batch = append(batch, res)
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				r.write(ctx, batch)
			}
			return
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
		batch = batch[:0]
	}
}

// write applies one batch of outcomes: one statement, or a transaction of
// two when outcomes emit outbox messages. Outcomes of steps whose lease was
// lost are not applied, and their messages are not enqueued. The write may
// lease to the runner the children its spawns start and the joins of the
// parents whose last child it ends (planLeases); release runs them.
func (r *Runner) write(runCtx context.Context, batch []result) {
	ctx := context.WithoutCancel(runCtx)
	ws := make([]wireOutcome, len(batch))
	emits := false
	for i := range batch {
		ws[i] = batch[i].w
		emits = emits || len(batch[i].emit) > 0
	}
	flows, reserve := r.planLeases(runCtx, ws)
	// In id order, the order the write then locks the instances in, as
	// wake_flows does: the two never wait on each other in a cycle.
	slices.SortFunc(ws, func(a, b wireOutcome) int { return cmp.Compare(a.ID, b.ID) })
	doc, err := json.Marshal(ws)
	if err != nil {
		r.cfg.Logger.Error("wharfflow: encoding outcomes", "err", err)
		r.release(runCtx, batch, writeResult{}, reserve)
		return
	}
	q := "SELECT id, token, flow, step, state, attempt, parent_id, children, signals FROM " + r.cfg.Schema +
		".complete_flow_steps($1, $2::jsonb, $3, $4)"
	var wr writeResult
	for attempt := 0; ; attempt++ {
		wr = writeResult{applied: map[int64]int64{}}
		if !emits {
			err = r.scanApplied(ctx, r.pool, q, string(doc), flows, &wr)
		} else {
			err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
				if err := r.scanApplied(ctx, tx, q, string(doc), flows, &wr); err != nil {
					return err
				}
				var msgs []wharf.Message
				for i := range batch {
					if _, ok := wr.applied[batch[i].c.ID]; ok {
						msgs = append(msgs, batch[i].emit...)
					}
				}
				_, err := r.outbox.EnqueueTx(ctx, tx, msgs...)
				return err
			})
		}
		if err == nil || attempt >= 4 {
			break
		}
		r.cfg.Logger.Warn("wharfflow: writing outcomes, will retry", "err", err, "steps", len(batch))
		time.Sleep(time.Duration(50<<attempt) * time.Millisecond)
	}
	if err != nil {
		r.cfg.Logger.Error("wharfflow: writing outcomes failed; the steps run again after their leases", "err", err, "steps", len(batch))
		wr = writeResult{}
	}
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
	r.release(runCtx, batch, wr, reserve)
}

// writeResult is what complete_flow_steps answered.
type writeResult struct {
	// applied are the applied outcomes' ids, with the new token of those
	// that continue on their lease (0 for the others).
	applied map[int64]int64
	// leased are the instances the write leased to the runner: spawned
	// children, and parents at their join step.
	leased []claimed
	// resumed are the awaits of the batch whose signal came first, leased
	// back to the runner with their signals.
	resumed []claimed
	// due is how many steps the write made due for any runner's claim.
	due int64
}

// planLeases decides which spawned children the write asks to lease to the
// runner, marking them in ws, and returns the flows to pass (nil: lease
// nothing, the runner is stopping) and the slots it reserved for them.
//
// A child qualifies when the runner runs its flow and it has no keys (a
// keyed child goes through the claim, which applies its keys). Every
// outcome but a continued Next frees its slot with the write; a done or
// failed one may lease its parent's join in it, the others' slots go to
// children, and beyond those the write reserves free slots (not those of a
// claim in flight). Children left over are inserted runnable, for any
// runner's claim.
func (r *Runner) planLeases(ctx context.Context, ws []wireOutcome) (flows []string, reserve int) {
	freed, joins, want := 0, 0, 0
	for i := range ws {
		if !ws[i].Cont {
			freed++
		}
		switch ws[i].Kind {
		case "done", "fail":
			joins++
		case "spawn":
			for _, ch := range ws[i].Children {
				if r.leasable(ch) {
					want++
				}
			}
		}
	}
	r.mu.Lock()
	if r.closing || ctx.Err() != nil {
		r.mu.Unlock()
		return nil, 0
	}
	budget := freed - joins
	if want > budget {
		reserve = max(0, min(want-budget, r.cfg.MaxInFlight-len(r.inflight)-r.reserved))
		r.reserved += reserve
		budget += reserve
	}
	r.mu.Unlock()
	for i := range ws {
		if ws[i].Kind != "spawn" || budget <= 0 {
			continue
		}
		kids := slices.Clone(ws[i].Children)
		for j := range kids {
			if budget > 0 && r.leasable(kids[j]) {
				kids[j].Lease = true
				budget--
			}
		}
		ws[i].Children = kids
	}
	return r.names, reserve
}

// leasable: a child the write may lease to this runner.
func (r *Runner) leasable(ch wireChild) bool {
	_, ok := r.flows[ch.Flow]
	return ok && ch.ConcurrencyKey == "" && ch.RateKey == ""
}

// leasedTraces gives the instances a write leased their trace context: a
// child its spawning step's (a child has none of its own, its nearest
// ancestor's is its parent's), a join its own, read as a claim's are.
func (r *Runner) leasedTraces(ctx context.Context, batch []result, leased []claimed) {
	if r.cfg.Tracer == nil {
		return
	}
	spawners := map[int64]map[string]string{}
	for i := range batch {
		spawners[batch[i].c.ID] = batch[i].c.Trace
	}
	var joins []claimed
	var at []int
	for i := range leased {
		if t, ok := spawners[leased[i].parent]; ok && leased[i].Children == nil {
			leased[i].Trace = t
			continue
		}
		joins = append(joins, leased[i])
		at = append(at, i)
	}
	if err := r.loadTraces(ctx, joins); err != nil {
		r.cfg.Logger.Warn("wharfflow: reading the leased joins' trace context", "err", err)
		return
	}
	for k, i := range at {
		leased[i].Trace = joins[k].Trace
	}
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// scanApplied reads complete_flow_steps's answer into wr.
func (r *Runner) scanApplied(ctx context.Context, q queryer, sql, doc string, flows []string, wr *writeResult) error {
	rows, err := q.Query(ctx, sql, r.cfg.RunnerID, doc, r.cfg.LeaseTTL, flows)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var token, parent *int64
		var flow, step *string
		var state, children, signals []byte
		var attempt *int
		if err := rows.Scan(&id, &token, &flow, &step, &state, &attempt, &parent, &children, &signals); err != nil {
			return err
		}
		switch {
		case id == 0: // the steps made due
			if token != nil {
				wr.due = *token
			}
		case flow == nil: // an applied outcome
			wr.applied[id] = 0
			if token != nil {
				wr.applied[id] = *token
			}
		default: // an instance leased to the runner
			c := claimed{ID: id, Flow: *flow, State: state}
			if token != nil {
				c.Token = *token
			}
			if step != nil {
				c.Step = *step
			}
			if attempt != nil {
				c.Attempt = *attempt
			}
			if parent != nil {
				c.parent = *parent
			}
			if len(children) > 0 {
				if err := json.Unmarshal(children, &c.Children); err != nil {
					return err
				}
			}
			if len(signals) > 0 {
				if err := json.Unmarshal(signals, &c.Signals); err != nil {
					return err
				}
				wr.resumed = append(wr.resumed, c)
				continue
			}
			wr.leased = append(wr.leased, c)
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
	var backIDs, backTokens []int64
	lateWoken := false
	r.mu.Lock()
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		if s, ok := r.inflight[id]; ok && s.token == res.c.Token {
			s.cancel(nil)
			delete(r.inflight, id)
		}
		if r.late[id] {
			delete(r.late, id)
			r.wakeIDs = append(r.wakeIDs, id)
			lateWoken = true
		}
	}
	stopping := r.closing || ctx.Err() != nil
	for i := range batch {
		res := &batch[i]
		id := res.c.ID
		token := wr.applied[id]
		if token == 0 {
			continue
		}
		if stopping {
			backIDs = append(backIDs, id)
			backTokens = append(backTokens, token)
			continue
		}
		r.run(ctx, claimed{ID: id, Flow: res.c.Flow, Step: res.w.Step, State: res.w.State, Token: token, Trace: res.c.Trace,
			leased: res.c.leased}, res.chain+1)
	}
	for _, c := range wr.leased {
		if stopping {
			backIDs = append(backIDs, c.ID)
			backTokens = append(backTokens, c.Token)
			continue
		}
		r.stats.leased.Add(1) // before the step starts, for whoever it tells
		r.run(ctx, c, 0)
	}
	for _, c := range wr.resumed {
		if stopping {
			backIDs = append(backIDs, c.ID)
			backTokens = append(backTokens, c.Token)
			continue
		}
		c.leased = time.Now()
		r.queue(c)
	}
	r.reserved -= reserve
	if !stopping {
		r.startQueued(ctx)
	}
	r.mu.Unlock()
	if lateWoken {
		r.wakeLater()
	}
	if len(backIDs) > 0 {
		if _, err := r.pool.Exec(context.WithoutCancel(ctx), "SELECT "+r.cfg.Schema+".release_flow_leases($1, $2, $3)",
			r.cfg.RunnerID, backIDs, backTokens); err != nil {
			r.cfg.Logger.Warn("wharfflow: handing back steps; they run after their lease", "err", err)
		}
	}
	// A claim may find something when the write made steps due (children
	// it did not lease, joins and keys' next steps, awaits whose signal
	// came first: complete_flow_steps notifies them too, but the
	// listener's round trip is slower than this), when an outcome
	// scheduled its own instance (NextAt, Retry, RateLimited, an Await's
	// deadline: the claim sets the timer), or a slot freed while the claim
	// loop waited for one. Steps continued on their lease, and children
	// and joins leased to the runner, need no claim.
	wake := r.starved.Load() || wr.due > 0
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
