//go:build faults

package faults

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf"

	"github.com/wharfhq/wharf/internal/testdb"
)

// Load on the database that is not the relay's: a long transaction holding
// back the xmin horizon (nothing deleted can be vacuumed away meanwhile), and
// other clients taking every free connection slot.

// deliveryWatch tails JSON-lines files every 10 ms and records when each
// message was first seen there, and when new lines appeared at all: the
// verifier checks what arrived, this says when.
type deliveryWatch struct {
	paths    []string
	off      []int64
	mu       sync.Mutex
	seen     map[int64]time.Time
	arrivals []time.Time // polls that found new lines
	stopCh   chan struct{}
	done     chan struct{}
	once     sync.Once
}

func watchDeliveries(t *testing.T, paths ...string) *deliveryWatch {
	t.Helper()
	w := &deliveryWatch{paths: paths, off: make([]int64, len(paths)), seen: map[int64]time.Time{},
		stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			w.poll()
			select {
			case <-w.stopCh:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *deliveryWatch) stop() {
	w.once.Do(func() { close(w.stopCh) })
	<-w.done
}

func (w *deliveryWatch) poll() {
	for i, p := range w.paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		data, err := readFrom(f, w.off[i])
		_ = f.Close()
		if err != nil {
			continue
		}
		nl := bytes.LastIndexByte(data, '\n')
		if nl < 0 {
			continue
		}
		// Unparseable lines are the verifier's business; only the times
		// matter here.
		ds, _, _ := parseLines(data[:nl+1])
		w.off[i] += int64(nl + 1)
		now := time.Now()
		w.mu.Lock()
		for _, d := range ds {
			if _, ok := w.seen[d.seq]; !ok {
				w.seen[d.seq] = now
			}
		}
		if len(ds) > 0 {
			w.arrivals = append(w.arrivals, now)
		}
		w.mu.Unlock()
	}
}

func (w *deliveryWatch) seenAt(seq int64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.seen[seq]
	return at, ok
}

// firstArrivalAfter returns when new lines first appeared after t0.
func (w *deliveryWatch) firstArrivalAfter(t0 time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.arrivals {
		if a.After(t0) {
			return a, true
		}
	}
	return time.Time{}, false
}

// longestGap returns the longest time in [from, to] during which no new
// line appeared, and when it began.
func (w *deliveryWatch) longestGap(from, to time.Time) (gap time.Duration, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := from
	for _, a := range w.arrivals {
		if !a.After(from) {
			continue
		}
		if a.After(to) {
			break
		}
		if d := a.Sub(prev); d > gap {
			gap, at = d, prev
		}
		prev = a
	}
	if d := to.Sub(prev); d > gap {
		gap, at = d, prev
	}
	return gap, at
}

// prober commits one message on its own key every interval and records when
// it sent the COMMIT, so commit-to-delivery latency can be read from a
// deliveryWatch. Its messages go into the ledger like the producers'.
type prober struct {
	o      *outbox
	mu     sync.Mutex
	sent   map[int64]time.Time
	errs   atomic.Int64
	stopCh chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

func startProbes(t *testing.T, o *outbox, every time.Duration) *prober {
	t.Helper()
	p := &prober{o: o, sent: map[int64]time.Time{}, stopCh: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for n := 0; ; n++ {
			select {
			case <-p.stopCh:
				return
			case <-time.After(every):
			}
			if err := p.one(n); err != nil {
				p.errs.Add(1)
			}
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *prober) stop() {
	p.once.Do(func() { close(p.stopCh) })
	p.wg.Wait()
}

func (p *prober) one(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tx, err := p.o.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	seq, err := enqueueLedgered(ctx, p.o, tx, "probe", "probe", fmt.Sprintf(`{"probe":%d}`, n))
	if err != nil {
		return err
	}
	at := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	p.sent[seq] = at
	p.mu.Unlock()
	return nil
}

// enqueueLedgered enqueues one message in tx and records it in the ledger.
func enqueueLedgered(ctx context.Context, o *outbox, tx pgx.Tx, topic, key, payload string) (int64, error) {
	ids, err := o.client.EnqueueTx(ctx, tx, wharf.Message{Topic: topic, Key: key, Payload: []byte(payload)})
	if err != nil {
		return 0, err
	}
	seq, nonce, err := wharf.ParseID(ids[0])
	if err != nil {
		return 0, err
	}
	_, err = tx.Exec(ctx, "INSERT INTO "+o.schema+".fault_ledger (seq, topic, key, poison, nonce) VALUES ($1, $2, $3, false, $4)", seq, topic, key, nonce)
	return seq, err
}

// latencies returns commit-to-delivery of the probes committed in
// [from, to) that were delivered, sorted, and how many were not.
func (p *prober) latencies(w *deliveryWatch, from, to time.Time) (out []time.Duration, missing int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for seq, at := range p.sent {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		if seen, ok := w.seenAt(seq); ok {
			out = append(out, seen.Sub(at))
		} else {
			missing++
		}
	}
	slices.Sort(out)
	return out, missing
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func ms(d time.Duration) string {
	if d < 0 {
		return "n/a"
	}
	return d.Round(time.Millisecond).String()
}

// hist is a Prometheus histogram's cumulative bucket counts by upper bound
// (+Inf included).
type hist map[float64]float64

// scrapeHist reads a histogram from a relay's /metrics.
func scrapeHist(addr, name string) (hist, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	h := hist{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		b, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(count), 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad bucket line %q", sc.Text())
		}
		h[b] = c
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("histogram %s not found", name)
	}
	return h, nil
}

// scrapeHists sums one histogram over several relays.
func scrapeHists(t *testing.T, name string, addrs ...string) hist {
	t.Helper()
	sum := hist{}
	for _, a := range addrs {
		h, err := scrapeHist(a, name)
		must(t, err, "scrape %s from %s", name, a)
		for b, c := range h {
			sum[b] += c
		}
	}
	return sum
}

func (h hist) minus(o hist) hist {
	d := hist{}
	for b, c := range h {
		d[b] = c - o[b]
	}
	return d
}

// quantile interpolates linearly within the bucket holding rank q, as
// Prometheus' histogram_quantile does; above the last finite bound it
// returns that bound.
func (h hist) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h))
	for b := range h {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 || h[math.Inf(1)] == 0 {
		return math.NaN()
	}
	rank := q * h[math.Inf(1)]
	lo, prev := 0.0, 0.0
	for _, b := range bounds {
		c := h[b]
		if c >= rank {
			if math.IsInf(b, 1) {
				return lo
			}
			if c == prev {
				return b
			}
			return lo + (b-lo)*(rank-prev)/(c-prev)
		}
		lo, prev = b, c
	}
	return lo
}

// tableStats is what pg_stat_user_tables says about one of the schema's
// tables.
type tableStats struct {
	dead, live, autovacuums, vacuums, bytes int64
	read                                    int64 // rows read by index and sequential scans
}

func (o *outbox) tableStats(t *testing.T, table string) tableStats {
	t.Helper()
	var s tableStats
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t, o.pool.QueryRow(ctx, `SELECT n_dead_tup, n_live_tup, autovacuum_count, vacuum_count, pg_total_relation_size(relid),
	coalesce(idx_tup_fetch, 0) + seq_tup_read
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, o.schema, table).
		Scan(&s.dead, &s.live, &s.autovacuums, &s.vacuums, &s.bytes, &s.read), "statistics of %s", table)
	return s
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// A REPEATABLE READ transaction takes its snapshot and holds it (20 s
// short, 10 min long) while two relays deliver under load on a throwaway
// cluster with autovacuum on: nothing the relays delete meanwhile can be
// vacuumed away, so the outbox, its indexes and the lanes table fill with
// dead row versions. A producer transaction that began before the hold
// commits in its middle (a late commit below the relays' cursors). Latency
// is measured twice: a probe producer's commit to the line appearing in the
// file (every 20 ms, per message), and the relays' wharf_commit_to_ack_seconds
// histogram. The relays must keep up: no delivery gap over 5 s during the
// hold (the relays poll every 50 ms and their lease is 3 s, so 5 s is a
// stopped relay, not a slow one), a backlog at the end of the hold of at most
// 2 s of production, the late commit delivered within 5 s; and after the
// hold autovacuum must remove the dead tuples.
func TestXminHorizonHeld(t *testing.T) {
	hold := pick(20*time.Second, 10*time.Minute)
	before := pick(5*time.Second, 60*time.Second)
	// autovacuum_naptime is shortened (default 1 min) so the check after
	// the hold does not mostly wait for the launcher.
	naptime := pick("1s", "10s")
	const stallBound = 5 * time.Second
	c := startCluster(t, map[string]string{"autovacuum": "on", "autovacuum_naptime": naptime})
	o := newOutbox(t, c.URL())
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	r1 := startRelay(t, o, "", "a", "", "--sink", sinkFile(path), "--admin-addr", addrs[0])
	r2 := startRelay(t, o, "", "b", "", "--sink", sinkFile(path), "--admin-addr", addrs[1])
	rs := []*relay{r1, r2}
	w := watchDeliveries(t, path)
	l := startLoad(t, o, nil, loadShape{})
	p := startProbes(t, o, 20*time.Millisecond)
	waitDelivered(t, col, 300, 30*time.Second)
	const lat = "wharf_commit_to_ack_seconds"
	ctx := context.Background()

	beforeStart := time.Now()
	hBefore := scrapeHists(t, lat, addrs...)
	time.Sleep(before)

	// The late transaction: begun (and its message enqueued, so its seq is
	// taken) before the hold, committed in the middle of it.
	lateTx, err := o.pool.Begin(ctx)
	must(t, err, "begin the late transaction")
	defer func() { _ = lateTx.Rollback(context.Background()) }()
	lateSeq, err := enqueueLedgered(ctx, o, lateTx, "late", "late", `{"late":true}`)
	must(t, err, "enqueue in the late transaction")

	holder, err := pgx.Connect(ctx, c.URL())
	must(t, err, "connect the horizon holder")
	defer holder.Close(context.Background())
	var holderPid int
	must(t, holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holderPid), "holder pid")
	outbox0 := o.tableStats(t, "outbox")
	lanes0 := o.tableStats(t, "lanes")
	hHold := scrapeHists(t, lat, addrs...)
	committed0 := l.committed.Load()
	_, err = holder.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ")
	must(t, err, "begin the REPEATABLE READ transaction")
	var snapCount int
	must(t, holder.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".outbox").Scan(&snapCount), "take the snapshot")
	holdStart := time.Now()
	var holderXmin *string
	must(t, o.pool.QueryRow(ctx, "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = $1", holderPid).Scan(&holderXmin), "holder's xmin")
	if holderXmin == nil {
		t.Fatal("the REPEATABLE READ transaction holds no xmin: the fault did not happen")
	}

	stopTrace := traceHold(t, o, w, p, holdStart, pick(5*time.Second, time.Minute))
	time.Sleep(hold / 2)
	lateAt := time.Now()
	must(t, lateTx.Commit(ctx), "commit the late transaction")
	lateDelivered := time.Duration(-1)
	if within(stallBound, func() bool { _, ok := w.seenAt(lateSeq); return ok }) {
		at, _ := w.seenAt(lateSeq)
		lateDelivered = at.Sub(lateAt)
	} else {
		t.Errorf("the late commit (seq %d, begun before the hold, committed %s into it) was not delivered within %s", lateSeq, lateAt.Sub(holdStart).Round(time.Second), stallBound)
	}
	time.Sleep(time.Until(holdStart.Add(hold)))

	// End of the hold, still holding: how far behind are the relays?
	stopTrace()
	holdEnd := time.Now()
	hEnd := scrapeHists(t, lat, addrs...)
	backlog := o.count(t, "outbox")
	committedHold := l.committed.Load() - committed0
	outbox1 := o.tableStats(t, "outbox")
	lanes1 := o.tableStats(t, "lanes")
	_, err = holder.Exec(ctx, "COMMIT")
	must(t, err, "end the REPEATABLE READ transaction")
	released := time.Now()
	requireAlive(t, rs...)

	// After the hold: autovacuum may now remove what piled up. Wait for a
	// run that started after the release (one running at the release still
	// had the old horizon) to bring the dead tuples under half.
	var outbox2 tableStats
	cleanWait := pick(45*time.Second, 3*time.Minute)
	vacuumed := within(cleanWait, func() bool {
		outbox2 = o.tableStats(t, "outbox")
		return outbox2.autovacuums > outbox1.autovacuums && outbox2.dead <= outbox1.dead/2
	})
	cleanedAfter := time.Since(released)
	lanes2 := o.tableStats(t, "lanes")
	if !vacuumed {
		t.Errorf("outbox dead tuples %d at the end of the hold, %d %s after it (autovacuum runs %d -> %d): autovacuum did not clean up",
			outbox1.dead, outbox2.dead, cleanWait, outbox1.autovacuums, outbox2.autovacuums)
		vctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := o.pool.Exec(vctx, "VACUUM "+o.schema+".outbox")
		cancel()
		must(t, err, "VACUUM the outbox")
		outbox2 = o.tableStats(t, "outbox")
		addNote(t, "autovacuum did NOT clean within %s; manual VACUUM left %d dead tuples", cleanWait, outbox2.dead)
	}

	// Dead tuples piling up is the fault itself: if they did not, the
	// scenario measured nothing.
	delivered := 0
	w.mu.Lock()
	for _, at := range w.seen {
		if !at.Before(holdStart) && at.Before(holdEnd) {
			delivered++
		}
	}
	w.mu.Unlock()
	if outbox1.dead < int64(delivered)/2 {
		t.Errorf("the outbox had %d dead tuples at the end of the hold while %d messages were delivered (and deleted) during it: the horizon was not held", outbox1.dead, delivered)
	}

	gapBefore, _ := w.longestGap(beforeStart, holdStart)
	gapHold, gapAt := w.longestGap(holdStart, holdEnd)
	if gapHold > stallBound {
		t.Errorf("delivery stalled for %s during the hold (from %s into it); the bound is %s", gapHold.Round(time.Millisecond), gapAt.Sub(holdStart).Round(time.Millisecond), stallBound)
	}
	rate := float64(committedHold) / hold.Seconds()
	backlogBound := max(300, int(2*rate))
	if backlog > backlogBound {
		t.Errorf("%d messages pending at the end of the hold (producers committed %.0f msg/s): the relays fell behind (bound %d, 2 s of production)", backlog, rate, backlogBound)
	}

	revive(t, rs)
	p.stop()
	// Every probe of the two windows was committed long before now (the
	// hold ended before the autovacuum wait): all must have arrived.
	latB, missB := p.latencies(w, beforeStart, holdStart)
	latH, missH := p.latencies(w, holdStart, holdEnd)
	if missB+missH > 0 {
		t.Errorf("%d probes of before and %d of during the hold not delivered yet", missB, missH)
	}
	mBefore, mHold := hHold.minus(hBefore), hEnd.minus(hHold)
	addNote(t, "probe commit->file p50/p99/max %s/%s/%s before (%s, %d probes), %s/%s/%s during the hold (%d probes); wharf_commit_to_ack_seconds p50/p99 %.3f/%.3f s before, %.3f/%.3f s during",
		ms(quantile(latB, 0.5)), ms(quantile(latB, 0.99)), ms(quantile(latB, 1)), before, len(latB),
		ms(quantile(latH, 0.5)), ms(quantile(latH, 0.99)), ms(quantile(latH, 1)), len(latH),
		mBefore.quantile(0.5), mBefore.quantile(0.99), mHold.quantile(0.5), mHold.quantile(0.99))
	addNote(t, "longest delivery gap %s before, %s during the hold; backlog at the end of the hold %d (%.0f msg/s committed)",
		ms(gapBefore), ms(gapHold), backlog, rate)
	addNote(t, "outbox n_dead_tup %d at the start, %d at the end of the hold, %d %s after it (autovacuum runs during the hold %d), size %s -> %s -> %s; lanes n_dead_tup %d -> %d -> %d, size %s -> %s",
		outbox0.dead, outbox1.dead, outbox2.dead, cleanedAfter.Round(100*time.Millisecond), outbox1.autovacuums-outbox0.autovacuums,
		mib(outbox0.bytes), mib(outbox1.bytes), mib(outbox2.bytes), lanes0.dead, lanes1.dead, lanes2.dead, mib(lanes0.bytes), mib(lanes1.bytes))
	addNote(t, "late commit (begun before the hold, committed %s into it) delivered %s after its commit; probe errors %d", lateAt.Sub(holdStart).Round(time.Second), ms(lateDelivered), p.errs.Load())
	verify(t, fmt.Sprintf("xmin horizon held %s by a REPEATABLE READ snapshot (2 relays, autovacuum on)", hold), o, l, col, released, 2*time.Minute)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

// traceHold logs, every step of the hold, the dead tuples of the outbox and
// the lanes table, the backlog and the probes' latency over the last step,
// so a long hold shows whether anything degrades with the bloat.
func traceHold(t *testing.T, o *outbox, w *deliveryWatch, p *prober, start time.Time, step time.Duration) (stop func()) {
	stopCh, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stopCh:
				return
			case <-time.After(step):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var od, ld, backlog int64
			err := o.pool.QueryRow(ctx, `SELECT
  (SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'),
  (SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'lanes'),
  (SELECT count(*) FROM `+o.schema+`.outbox)`, o.schema).Scan(&od, &ld, &backlog)
			cancel()
			now := time.Now()
			// Probes of the step before the last second: delivered by now
			// unless something is slow (then counted as undelivered).
			lat, miss := p.latencies(w, now.Add(-step-time.Second), now.Add(-time.Second))
			line := fmt.Sprintf("XMINTRACE | %s into the hold | outbox dead %d | lanes dead %d | backlog %d | probes %d: p50 %s p99 %s max %s, undelivered %d | err %v",
				now.Sub(start).Round(time.Second), od, ld, backlog, len(lat), ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)), ms(quantile(lat, 1)), miss, err)
			t.Log(line)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(stopCh); <-done }) }
	t.Cleanup(stop)
	return stop
}

// withUser returns the URL with another user name.
func withUser(t *testing.T, raw, user string) string {
	t.Helper()
	u, err := url.Parse(raw)
	must(t, err, "parse %s", raw)
	u.User = url.User(user)
	return u.String()
}

const sqlstateTooManyConnections = "53300"

// connHog is the other clients: as many connections as the server accepts.
type connHog struct {
	url     string
	mu      sync.Mutex
	conns   []*pgx.Conn
	retaken int
	refusal string
	stopCh  chan struct{}
	done    chan struct{}
}

// connect opens one connection; full reports a refusal for lack of slots.
func (h *connHog) connect(ctx context.Context) (full bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, h.url)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == sqlstateTooManyConnections {
			h.mu.Lock()
			h.refusal = pe.Message
			h.mu.Unlock()
			return true, nil
		}
		return false, err
	}
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
	return false, nil
}

// fill connects from four goroutines until each was refused three times in
// a row, 100 ms apart: a refusal alone does not mean the slots are taken,
// since a refused client's backend holds a slot for a moment itself.
func (h *connHog) fill(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for refused := 0; refused < 3; {
				full, err := h.connect(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				if full {
					refused++
					time.Sleep(100 * time.Millisecond)
				} else {
					refused = 0
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// keep takes every slot that is freed again, every 50 ms, until release.
func (h *connHog) keep() {
	h.stopCh, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		for {
			select {
			case <-h.stopCh:
				return
			case <-time.After(50 * time.Millisecond):
			}
			h.mu.Lock()
			before := len(h.conns)
			h.mu.Unlock()
			if full, err := h.connect(context.Background()); err == nil && !full {
				h.mu.Lock()
				if len(h.conns) > before {
					h.retaken++
				}
				h.mu.Unlock()
			}
		}
	}()
}

// release closes every connection; it reports how many there were, how
// many of them were slots freed and taken again, and the server's refusal.
func (h *connHog) release() (n, retaken int, refusal string) {
	if h.stopCh != nil {
		select {
		case <-h.stopCh:
		default:
			close(h.stopCh)
		}
		<-h.done
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n, retaken, refusal = len(h.conns), h.retaken, h.refusal
	for _, c := range h.conns {
		_ = c.Close(context.Background())
	}
	h.conns = nil
	return n, retaken, refusal
}

// Other clients take every free connection slot of a server with
// max_connections 30 and hold them for a while (5 s short, 60 s long, after
// the slots are full; filling them takes seconds more). The relays run as
// the least-privilege relay role (`wharf migrate roles --create`), the
// producers and the test as the superuser, whose reserved slots the others
// cannot take. The relays' own connections are terminated as the slots
// fill (the role is held at CONNECTION LIMIT 0 from before the termination
// until the others hold every slot, so the relays cannot win a freed slot
// back), so every round trip a relay makes needs a new connection and is
// refused with SQLSTATE 53300. The relays must not exit, must count
// database errors, and within 15 s of the slots being freed (5 s: the
// relay's longest round-trip backoff; 3 s: the lease; the rest: margin on a
// shared 2-core machine) own every lane again and deliver.
func TestConnectionsExhausted(t *testing.T) {
	outage := pick(5*time.Second, 60*time.Second)
	const recoveryBound = 15 * time.Second
	c := startCluster(t, map[string]string{"max_connections": "30"})
	o := newOutbox(t, c.URL())
	ctx := context.Background()
	cmd := exec.Command(wharfBin, "migrate", "roles", "--create", "--schema", o.schema, "--database-url", c.URL(), "--relay-password", "relay")
	cmd.Env = testdb.CleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wharf migrate roles --create: %v\n%s", err, out)
	}
	admin, err := pgx.Connect(ctx, c.URL())
	must(t, err, "connect the admin session")
	defer admin.Close(context.Background())
	_, err = admin.Exec(ctx, "CREATE ROLE fault_hog LOGIN")
	must(t, err, "create the role of the other clients")
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "ALTER ROLE wharf_relay CONNECTION LIMIT -1")
	})

	relayURL := withUser(t, c.URL(), "wharf_relay")
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	r1 := startRelay(t, o, relayURL, "a", "", "--sink", sinkFile(path), "--admin-addr", addrs[0])
	r2 := startRelay(t, o, relayURL, "b", "", "--sink", sinkFile(path), "--admin-addr", addrs[1])
	rs := []*relay{r1, r2}
	w := watchDeliveries(t, path)
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)
	var totalLanes int
	must(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".lanes").Scan(&totalLanes), "count lanes")
	errsBefore := make([]float64, len(rs))
	for i, a := range addrs {
		errsBefore[i], err = metric(a, "wharf_database_errors_total")
		must(t, err, "read relay %s's metrics", rs[i].name)
	}

	// Take every slot: first keep the relays from reconnecting, cut their
	// connections, let the others fill what is free, then lift the limit.
	relayBackends := func() int {
		var n int
		must(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'wharf_relay'").Scan(&n), "count relay backends")
		return n
	}
	_, err = admin.Exec(ctx, "ALTER ROLE wharf_relay CONNECTION LIMIT 0")
	must(t, err, "limit the relay role")
	_, err = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'wharf_relay'")
	must(t, err, "terminate the relays' connections")
	cutAt := time.Now()
	if !within(10*time.Second, func() bool { return relayBackends() == 0 }) {
		t.Fatal("relay backends still there 10s after pg_terminate_backend")
	}
	hog := &connHog{url: withUser(t, c.URL(), "fault_hog")}
	defer hog.release()
	fillStart := time.Now()
	must(t, hog.fill(ctx), "take every free connection slot")
	filled := time.Since(fillStart)
	hog.keep()
	_, err = admin.Exec(ctx, "ALTER ROLE wharf_relay CONNECTION LIMIT -1")
	must(t, err, "lift the relay role's limit")
	faultStart := time.Now()
	committed0 := l.committed.Load()

	// During the fault: the relays' round trips fail and are counted.
	noticed := make([]bool, len(rs))
	within(outage, func() bool {
		all := true
		for i, a := range addrs {
			if !noticed[i] {
				v, err := metric(a, "wharf_database_errors_total")
				noticed[i] = err == nil && v > errsBefore[i]
			}
			all = all && noticed[i]
		}
		return all
	})
	for i, n := range noticed {
		if !n {
			t.Errorf("relay %s reports no database error while no connection slot was free", rs[i].name)
		}
	}
	// The slots stay taken: no relay connection may get through.
	maxRelayConns := 0
	for time.Now().Before(faultStart.Add(outage)) {
		maxRelayConns = max(maxRelayConns, relayBackends())
		time.Sleep(100 * time.Millisecond)
	}
	if maxRelayConns != 0 {
		t.Errorf("%d relay connections got through while the other clients held every slot", maxRelayConns)
	}
	maxAge := 0.0
	for _, a := range addrs {
		if v, err := metric(a, "wharf_database_last_success_age_seconds"); err == nil {
			maxAge = max(maxAge, v)
		}
	}
	gapFault, _ := w.longestGap(faultStart, time.Now())
	requireAlive(t, rs...)
	committedFault := l.committed.Load() - committed0

	hogs, retaken, refusal := hog.release()
	cleared := time.Now()
	covered := 0
	back := within(60*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := admin.QueryRow(cctx, "SELECT count(*) FROM "+o.schema+".lanes l JOIN "+o.schema+".relays r ON r.relay_id = l.owner WHERE r.lease_until > now()").Scan(&covered); err != nil {
			return false
		}
		_, delivering := w.firstArrivalAfter(cleared)
		return covered == totalLanes && delivering
	})
	recovery := time.Since(cleared)
	resumed, _ := w.firstArrivalAfter(cleared)
	if !back {
		t.Errorf("60s after the slots were freed the relays cover %d of %d lanes (delivering: %v)", covered, totalLanes, !resumed.IsZero())
	} else if recovery > recoveryBound {
		t.Errorf("the relays needed %s after the slots were freed to own every lane and deliver again; the bound is %s", recovery.Round(10*time.Millisecond), recoveryBound)
	}
	errsAfter := make([]string, len(rs))
	for i, a := range addrs {
		v, err := metric(a, "wharf_database_errors_total")
		if err != nil {
			errsAfter[i] = "?"
		} else {
			errsAfter[i] = fmt.Sprintf("%.0f", v-errsBefore[i])
		}
	}
	revive(t, rs)
	resumedIn := "never"
	if !resumed.IsZero() {
		resumedIn = ms(resumed.Sub(cleared))
	}
	addNote(t, "relays without a connection for %s: %d other connections took every free slot in %s, then held them %s (%d more freed and retaken meanwhile; refusal %q); relays' database errors +%s; longest delivery gap during the fault %s, database last success age up to %.1fs; %d messages committed meanwhile (superuser slots); after the slots were freed deliveries resumed %s later, every lane owned and delivering %s later",
		cleared.Sub(cutAt).Round(10*time.Millisecond), hogs, filled.Round(10*time.Millisecond), outage, retaken, refusal, strings.Join(errsAfter, "/+"), ms(gapFault), maxAge, committedFault, resumedIn, ms(recovery))
	verify(t, fmt.Sprintf("connection slots taken by other clients for %s (max_connections 30, relays terminated)", outage), o, l, col, cleared, 90*time.Second)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}
