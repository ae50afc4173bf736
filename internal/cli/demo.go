package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfmigrate"
)

type demoFlags struct {
	messages     int
	producers    int
	batch        int
	keys         int
	payloadBytes int
	timeout      time.Duration
	keep         bool
	mode         string
	relay        relayFlags
}

func newDemoCmd(g *globals) *cobra.Command {
	f := &demoFlags{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show the pipeline end to end: delivery, a relay crash and recovery, flows, then throughput",
		Long: `Runs the whole pipeline in four steps and prints what happens:

 1. Deliver: enqueues a few keyed messages in one transaction; a relay delivers them
    to a JSON-lines file sink and the demo prints each one as it arrives, in order
    per key.
 2. Crash: while more messages are enqueued, the relay is stopped hard just after
    the file took a batch and before the relay recorded it as delivered; a new
    relay takes over. The demo then reads the file back and checks that every
    message arrived at least once and that each key's messages arrived in order
    (it exits 1 if not).
 3. Flows: starts three checkout flows (package wharfflow) in one transaction; each
    runs its first step and awaits a payment signal; the demo signals them, each then
    ships its items in child flows, joins them and emits "shipped" to the outbox with
    its last step's outcome. It prints each checkout's steps with their times (from a
    step's start to its outcome's commit) and its children, and a relay delivers the
    emitted messages.
 4. Throughput: --messages messages from --producers producers into --sink (null:
    by default, which discards them: it measures Wharf and PostgreSQL, not a
    broker), as fast as they go: the throughput, with a per-key order check. The
    producers outrun the relay there, so its latency is mostly queueing. Then a
    steady-state run: about 3 seconds of messages paced at half the rate just
    delivered, so the relay keeps up, with the commit-to-acknowledgement latency a
    message sees when there is no backlog.

Without a database URL it starts a throwaway PostgreSQL from the local server
binaries (initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin) and removes it
afterwards. With a URL it works in a fresh schema wharf_demo_<random>, dropped at the
end unless --keep is given. The file of steps 1 and 2 is in a new temporary
directory, removed at the end unless --keep is given.

With --mode wal the outbox is in WAL mode (messages in the WAL only, streamed from a
logical replication slot): the server needs wal_level=logical, which the throwaway
PostgreSQL has.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			if err := g.checkRanges(cmd.Flags()); err != nil {
				return err
			}
			return runDemo(ctx, g, f, cmd.Flags().Changed("schema"))
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.messages, "messages", 100000, "messages to enqueue in the throughput step")
	fl.IntVar(&f.producers, "producers", 4, "concurrent producer connections in the throughput step")
	fl.IntVar(&f.batch, "batch", 100, "messages per producer transaction in the throughput step")
	fl.IntVar(&f.keys, "keys", 1000, "distinct message keys in the throughput step")
	fl.IntVar(&f.payloadBytes, "payload-bytes", 200, "payload size in bytes in the throughput step")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up if a step's delivery takes longer")
	fl.BoolVar(&f.keep, "keep", false, "keep the demo schema (only with a database URL) and the file the messages of steps 1 and 2 went to")
	fl.StringVar(&f.mode, "mode", string(wharfmigrate.ModeTable), "where the demo outbox keeps messages: table or wal (see wharf migrate up --mode)")
	f.relay.register(cmd, "null:")
	return cmd
}

func (f *demoFlags) validate() error {
	for _, c := range []struct {
		name string
		v    int
	}{{"--messages", f.messages}, {"--producers", f.producers}, {"--batch", f.batch}, {"--keys", f.keys}} {
		if c.v < 1 {
			return usageError{fmt.Errorf("%s must be at least 1, got %d", c.name, c.v)}
		}
	}
	if f.mode != string(wharfmigrate.ModeTable) && f.mode != string(wharfmigrate.ModeWAL) {
		return usageError{fmt.Errorf("--mode must be table or wal, got %q", f.mode)}
	}
	if f.payloadBytes < 2 {
		return usageError{fmt.Errorf("--payload-bytes must be at least 2, got %d", f.payloadBytes)}
	}
	return nil
}

func runDemo(ctx context.Context, g *globals, f *demoFlags, schemaGiven bool) error {
	if err := f.validate(); err != nil {
		return err
	}
	sink, err := sinkurl.Open(ctx, f.relay.sink)
	if err != nil {
		return usageError{err}
	}
	defer sink.Close()
	// Check the relay settings before starting anything.
	check := f.relay.cfg
	check.Schema = g.schema
	if _, err := wharf.NewClient(nil, &check); err != nil {
		return usageError{err}
	}

	schema := g.schema
	dropSchema := false
	started, stopDB, err := g.throwawayDatabase(ctx)
	if err != nil {
		return err
	}
	defer stopDB()
	if !started && !schemaGiven {
		var b [4]byte
		_, _ = rand.Read(b[:])
		schema = "wharf_demo_" + hex.EncodeToString(b[:])
		dropSchema = !f.keep
	}

	pool, err := g.connect(ctx, int32(f.producers+6))
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := wharfmigrate.New(schema)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		return err
	}
	if dropSchema {
		defer func() {
			// Reverting every migration removes a WAL outbox's slot and
			// publication too (a slot left behind would keep WAL forever).
			// The relays have stopped; their walsenders end a moment later.
			var err error
			for i := 0; i < 50; i++ {
				if _, err = m.Down(context.Background(), pool, 0); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				g.log.Warn("wharf: dropping the demo schema failed", "schema", schema, "err", err)
			}
		}()
	}
	if f.mode == string(wharfmigrate.ModeWAL) {
		if err := m.SetWALMode(ctx, pool); err != nil {
			return err
		}
	}
	if schemaGiven {
		// The demo's relays would deliver an application's messages to the
		// demo's sinks and remove them from the outbox.
		var busy bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+schema+".outbox)").Scan(&busy); err != nil {
			return err
		}
		if busy {
			return usageError{fmt.Errorf("--schema %s: its outbox holds messages, which the demo would deliver to its own sinks: give an unused schema, or no --schema", schema)}
		}
		// Its flow runner would run an application's checkout or shipping
		// flows.
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+schema+".flow_instances WHERE flow IN ('checkout', 'shipping') AND status NOT IN ('done', 'failed', 'cancelled'))").Scan(&busy); err != nil {
			return err
		}
		if busy {
			return usageError{fmt.Errorf("--schema %s: it has active checkout or shipping flows, which the demo's flow runner would run: give an unused schema, or no --schema", schema)}
		}
	}
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)

	out := g.stdout
	fmt.Fprintln(out, "wharf demo: a transactional outbox for PostgreSQL, end to end")
	switch {
	case started:
		fmt.Fprintf(out, "database   throwaway PostgreSQL %s at %s, schema %s (removed at exit)\n", version, redactURL(g.databaseURL), schema)
	case dropSchema:
		fmt.Fprintf(out, "database   PostgreSQL %s at %s, new schema %s (dropped at exit)\n", version, redactURL(g.databaseURL), schema)
	default:
		fmt.Fprintf(out, "database   PostgreSQL %s at %s, schema %s (kept)\n", version, redactURL(g.databaseURL), schema)
	}
	if f.mode == string(wharfmigrate.ModeWAL) {
		fmt.Fprintf(out, "mode       WAL: messages are written to the WAL only and streamed from the replication slot %s\n", schema)
		fmt.Fprintln(out, "           (a message's seq is its position in the WAL, so seqs start high and leave gaps)")
	}

	if err := runShowcase(ctx, g, f, pool, schema); err != nil {
		return err
	}
	if err := runFlowShowcase(ctx, g, f, pool, schema); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n4. Throughput: %d messages, %d producers x %d per transaction, %d keys, %d-byte payloads\n",
		f.messages, f.producers, f.batch, f.keys, f.payloadBytes)
	if _, null := sink.(*sinkurl.NullSink); null {
		fmt.Fprintf(out, "   sink       %s, the null sink: it acknowledges and discards every message, so this\n", f.relay.sink)
		fmt.Fprintln(out, "              measures Wharf and PostgreSQL, not a broker (pass --sink to measure one)")
	} else {
		fmt.Fprintf(out, "   sink       %s\n", redactURL(f.relay.sink))
	}
	probe := newProbe(sink, f.messages)
	cfg := f.relay.cfg
	cfg.Schema = schema
	cfg.Logger = g.log
	cfg.Sink = probe
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		return usageError{err}
	}
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), f.relay.stopWait)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()

	// Saturation: the producers enqueue as fast as they can. They outrun
	// the relay, so this measures throughput; its latencies are mostly
	// the time messages queued behind the backlog.
	fmt.Fprintln(out, "   saturation the producers enqueue as fast as they can, faster than the relay delivers:")
	fmt.Fprintln(out, "              this measures throughput; latency here is mostly time queued in the backlog")
	produceDur, total, err := throughputRun(ctx, g, f, pool, client, probe, f.messages, 0)
	if err != nil {
		return err
	}
	probe.report(out, f.messages, produceDur, total, true)
	if v := probe.orderViolations.Load(); v > 0 {
		return fmt.Errorf("per-key order was violated %d times", v)
	}

	// Steady state: the producers are paced at half the rate just
	// delivered, so the relay keeps up and the latency is what a message
	// waits when there is no backlog.
	rate := float64(f.messages) / max(total, time.Millisecond).Seconds() / 2
	n := int(min(float64(f.messages), max(float64(f.batch*f.producers), rate*steadySeconds)))
	probe.reset(n)
	fmt.Fprintf(out, "   steady     %d messages paced at %.0f msg/s (half the rate above), so the relay keeps up:\n", n, rate)
	produceDur, total, err = throughputRun(ctx, g, f, pool, client, probe, n, rate)
	if err != nil {
		return err
	}
	probe.report(out, n, produceDur, total, false)
	if v := probe.orderViolations.Load(); v > 0 {
		return fmt.Errorf("per-key order was violated %d times", v)
	}
	return nil
}

// steadySeconds is about how long the demo's steady-state run lasts.
const steadySeconds = 3

// throughputRun enqueues n messages from f.producers producers, paced at
// rate messages per second (0: as fast as they go), and waits until the
// relay delivered them all to probe. It returns how long producing and
// delivering took.
func throughputRun(ctx context.Context, g *globals, f *demoFlags, pool *pgxpool.Pool, client *wharf.Client, probe *probe, n int, rate float64) (produceDur, total time.Duration, err error) {
	start := time.Now()
	var produced atomic.Int64
	prodDone := make(chan error, 1)
	go func() {
		err := produce(ctx, pool, client, f, n, rate, start, probe, &produced)
		produceDur = time.Since(start)
		prodDone <- err
	}()

	bar := newProgress(g.stderr, n)
	deadline := time.NewTimer(f.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var prodErr error
	prodRunning := true
	for probe.unique() < int64(n) {
		select {
		case prodErr = <-prodDone:
			prodRunning = false
			if prodErr != nil {
				bar.done()
				return 0, 0, fmt.Errorf("producer failed: %w", prodErr)
			}
		case <-tick.C:
			bar.update(produced.Load(), probe.unique(), time.Since(start))
		case <-probe.completed():
		case <-deadline.C:
			bar.done()
			return 0, 0, fmt.Errorf("delivered %d of %d messages in %s: giving up (raise --timeout)", probe.unique(), n, f.timeout)
		case <-ctx.Done():
			bar.done()
			return 0, 0, errors.New("interrupted")
		}
	}
	total = time.Since(start)
	if prodRunning {
		if prodErr = <-prodDone; prodErr != nil {
			return 0, 0, prodErr
		}
	}
	bar.update(produced.Load(), probe.unique(), total)
	bar.done()
	return produceDur, total, nil
}

func produce(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *wharf.Client, f *demoFlags, n int, rate float64, start time.Time, probe *probe, produced *atomic.Int64) error {
	payload := make([]byte, f.payloadBytes)
	copy(payload, `"`)
	for i := 1; i < len(payload)-1; i++ {
		payload[i] = 'a' + byte(i%26)
	}
	payload[len(payload)-1] = '"'
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for p := 0; p < f.producers; p++ {
		g.Go(func() error {
			msgs := make([]wharf.Message, 0, f.batch)
			for {
				first := next.Add(int64(f.batch)) - int64(f.batch)
				if first >= int64(n) {
					return nil
				}
				if rate > 0 {
					// Paced: message i is enqueued i/rate after the start.
					at := start.Add(time.Duration(float64(first) / rate * float64(time.Second)))
					select {
					case <-time.After(time.Until(at)):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				msgs = msgs[:0]
				for i := first; i < first+int64(f.batch) && i < int64(n); i++ {
					msgs = append(msgs, wharf.Message{Topic: "demo", Key: fmt.Sprintf("key-%d", i%int64(f.keys)), Payload: payload})
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				// One writer per key at a time, as an aggregate's row lock
				// would: id order is then commit order for every key.
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext(k)) FROM (SELECT DISTINCT m->>'k' AS k FROM jsonb_array_elements($1::jsonb) m ORDER BY 1) s`, keysJSON(msgs)); err != nil {
					_ = tx.Rollback(ctx)
					return err
				}
				ids, err := client.EnqueueTx(ctx, tx, msgs...)
				if err != nil {
					_ = tx.Rollback(ctx)
					return err
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				seqs := make([]int64, len(ids))
				for i, id := range ids {
					if seqs[i], _, err = wharf.ParseID(id); err != nil {
						return err
					}
				}
				probe.committed(seqs, time.Now())
				produced.Add(int64(len(ids)))
			}
		})
	}
	return g.Wait()
}

func keysJSON(msgs []wharf.Message) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"k":%q}`, m.Key)
	}
	b.WriteByte(']')
	return b.String()
}

// probe wraps the demo's sink: it records acknowledgement times, duplicates
// and per-key order so the demo can report them.
type probe struct {
	inner           wharf.Sink
	target          int64
	mu              sync.Mutex
	commit          map[int64]time.Time
	ack             map[int64]time.Time
	lastByKey       map[string]int64
	dups            atomic.Int64
	orderViolations atomic.Int64
	count           atomic.Int64
	complete        chan struct{}
	once            sync.Once
}

func newProbe(inner wharf.Sink, target int) *probe {
	p := &probe{inner: inner}
	p.reset(target)
	return p
}

// reset starts a new measurement of target messages. The relay must have
// nothing of the previous one left to deliver.
func (p *probe) reset(target int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = int64(target)
	p.commit = make(map[int64]time.Time, target)
	p.ack = make(map[int64]time.Time, target)
	p.lastByKey = map[string]int64{}
	p.dups.Store(0)
	p.orderViolations.Store(0)
	p.count.Store(0)
	p.complete = make(chan struct{})
	p.once = sync.Once{}
}

func (p *probe) completed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.complete
}

func (p *probe) committed(ids []int64, at time.Time) {
	p.mu.Lock()
	for _, id := range ids {
		p.commit[id] = at
	}
	p.mu.Unlock()
}

func (p *probe) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	errs := p.inner.Publish(ctx, msgs)
	now := time.Now()
	p.mu.Lock()
	for i, m := range msgs {
		if errs != nil && errs[i] != nil {
			continue
		}
		if _, seen := p.ack[m.Seq]; seen {
			p.dups.Add(1)
			continue
		}
		p.ack[m.Seq] = now
		if last := p.lastByKey[m.Key]; m.Key != "" && m.Seq < last {
			p.orderViolations.Add(1)
		}
		if m.Seq > p.lastByKey[m.Key] {
			p.lastByKey[m.Key] = m.Seq
		}
	}
	n := int64(len(p.ack))
	if n >= p.target {
		p.once.Do(func() { close(p.complete) })
	}
	p.mu.Unlock()
	p.count.Store(n)
	return errs
}

func (p *probe) Close() error { return nil }

func (p *probe) unique() int64 { return p.count.Load() }

// report prints the run of n messages: rates, latency and key order. The
// saturation run says what its latency is made of.
func (p *probe) report(w io.Writer, n int, produceDur, total time.Duration, saturation bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lat := make([]time.Duration, 0, len(p.ack))
	for id, a := range p.ack {
		if c, ok := p.commit[id]; ok {
			// The relay can acknowledge before the producer's Commit call
			// returned: count that as zero latency.
			lat = append(lat, max(0, a.Sub(c)))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))].Round(10 * time.Microsecond)
	}
	rate := func(n int, d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f msg/s", float64(n)/d.Seconds())
	}
	fmt.Fprintf(w, "   produced   %d messages in %s (%s)\n", n, produceDur.Round(time.Millisecond), rate(n, produceDur))
	fmt.Fprintf(w, "   delivered  %d messages in %s (%s), %d redelivered\n", len(p.ack), total.Round(time.Millisecond), rate(len(p.ack), total), p.dups.Load())
	what := "steady state"
	if saturation {
		what = "saturated, mostly queueing"
	}
	fmt.Fprintf(w, "   latency    commit -> sink ack (%s): p50 %s  p95 %s  p99 %s  max %s\n", what, pct(0.50), pct(0.95), pct(0.99), pct(1))
	order := "intact"
	if v := p.orderViolations.Load(); v > 0 {
		order = fmt.Sprintf("VIOLATED %d times", v)
	}
	fmt.Fprintf(w, "   key order  %s across %d keys\n", order, len(p.lastByKey))
}

// progress draws a bar on a terminal, or a line a second elsewhere.
type progress struct {
	w       io.Writer
	total   int
	tty     bool
	last    time.Time
	drawn   bool
	lastN   int64
	lastAt  time.Duration
	rateStr string
}

func newProgress(w io.Writer, total int) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progress{w: w, total: total, tty: tty}
}

func (p *progress) update(produced, delivered int64, elapsed time.Duration) {
	if !p.tty && time.Since(p.last) < time.Second && delivered < int64(p.total) {
		return
	}
	p.last = time.Now()
	if dt := elapsed - p.lastAt; dt > 0 {
		p.rateStr = fmt.Sprintf("%.0f msg/s", float64(delivered-p.lastN)/dt.Seconds())
	}
	p.lastN, p.lastAt = delivered, elapsed
	const width = 30
	done := int(float64(width) * float64(delivered) / float64(p.total))
	bar := strings.Repeat("=", done) + strings.Repeat(" ", width-done)
	line := fmt.Sprintf("[%s] %3.0f%%  delivered %d/%d  produced %d  %s  %s",
		bar, 100*float64(delivered)/float64(p.total), delivered, p.total, produced, p.rateStr, elapsed.Round(100*time.Millisecond))
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\033[K", line)
		p.drawn = true
	} else {
		fmt.Fprintln(p.w, line)
	}
}

func (p *progress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// The demo's first two steps send their messages to a JSON-lines file, print
// a few as they arrive, stop a relay hard mid-run and then read the file back
// to check the guarantees.
const (
	demoTopic      = "orders"
	demoShowKeys   = 3
	demoCrashMsgs  = 1000
	demoCrashKeys  = 20
	demoCrashPerTx = 50
)

var demoEvents = []string{"created", "paid", "shipped"}

// demoBeforeCheck, when set (by tests only), is called with the file's path
// before the demo reads it back.
var demoBeforeCheck func(path string)

// sentMsg is what the demo enqueued, to check the file against.
type sentMsg struct {
	id, topic, key string
	seq            int64
}

func runShowcase(ctx context.Context, g *globals, f *demoFlags, pool *pgxpool.Pool, schema string) error {
	out := g.stdout
	dir, err := os.MkdirTemp("", "wharf-demo-")
	if err != nil {
		return fmt.Errorf("cannot create a directory for the demo's file sink: %w (set TMPDIR to a writable directory)", err)
	}
	path := filepath.Join(dir, "delivered.jsonl")
	note := "removed at exit; --keep keeps it"
	if f.keep {
		note = "kept after the demo"
	} else {
		defer os.RemoveAll(dir)
	}
	sinkURL := (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String()
	fmt.Fprintf(out, "sink       %s: JSON lines, fsync'd before each acknowledgement (%s)\n", sinkURL, note)

	producer, err := wharf.NewClient(pool, &wharf.Config{Schema: schema})
	if err != nil {
		return err
	}
	var sent []sentMsg

	// Each relay opens the file itself, as a relay process of its own would.
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	newRelay := func(ds *demoSink) (*wharf.Client, error) {
		inner, err := sinkurl.Open(ctx, sinkURL)
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, func() { _ = inner.Close() })
		ds.inner = inner
		cfg := f.relay.cfg
		cfg.Schema = schema
		cfg.Logger = g.log
		cfg.RelayID = "" // two relays: each gets an id of its own
		cfg.Sink = ds
		c, err := wharf.NewClient(pool, &cfg)
		if err != nil {
			return nil, usageError{err}
		}
		cleanups = append(cleanups, func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), f.relay.stopWait)
			defer cancel()
			_ = c.Stop(stopCtx)
		})
		return c, nil
	}
	// wait polls done until it holds or crashed reports a size; a producer
	// that fails (reported on prodDone, then sent again) ends it too.
	wait := func(what string, done func() bool, crashed <-chan int, prodDone chan error) (int, error) {
		deadline := time.NewTimer(f.timeout)
		defer deadline.Stop()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !done() {
			select {
			case n := <-crashed:
				return n, nil
			case err := <-prodDone:
				prodDone <- err // for the caller, which waits for the producer later
				if err != nil {
					return 0, fmt.Errorf("enqueueing failed: %w", err)
				}
				prodDone = nil
			case <-tick.C:
			case <-deadline.C:
				return 0, fmt.Errorf("%s took longer than %s: giving up (raise --timeout)", what, f.timeout)
			case <-ctx.Done():
				return 0, errors.New("interrupted")
			}
		}
		return 0, nil
	}

	// 1. A few keyed messages in one transaction, printed as they arrive.
	msgs := make([]wharf.Message, 0, demoShowKeys*len(demoEvents))
	for _, ev := range demoEvents {
		for k := 1; k <= demoShowKeys; k++ {
			msgs = append(msgs, wharf.Message{Topic: demoTopic, Key: fmt.Sprintf("order-%d", k),
				Payload: fmt.Appendf(nil, `{"order":"order-%d","event":%q}`, k, ev)})
		}
	}
	fmt.Fprintf(out, "\n1. Deliver: %d messages for %d keys, enqueued in one transaction\n", len(msgs), demoShowKeys)
	printer := &demoPrinter{w: out, on: true, arrived: map[string][]string{}}
	ds1 := &demoSink{onAck: printer.show, crashed: make(chan int, 1)}
	relay1, err := newRelay(ds1)
	if err != nil {
		return err
	}
	if err := relay1.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	fmt.Fprintf(out, "   relay 1    %s started\n", relay1.RelayID())
	fmt.Fprintf(out, "   enqueue    topic %s, keys order-1..order-%d, each key: %s\n", demoTopic, demoShowKeys, strings.Join(demoEvents, ", "))
	first, err := enqueueDemo(ctx, producer, pool, msgs)
	if err != nil {
		return err
	}
	sent = append(sent, first...)
	if _, err := wait("delivering step 1", func() bool { return ds1.ackedCount() >= len(first) }, nil, nil); err != nil {
		return err
	}
	arrived := printer.stop()
	if err := printKeyOrder(out, first, arrived); err != nil {
		return err
	}

	// 2. Stop relay 1 hard while messages flow, start relay 2, check the file.
	fmt.Fprintf(out, "\n2. Crash: relay 1 is stopped hard mid-run, relay 2 takes over\n")
	fmt.Fprintf(out, "   enqueue    %d messages for %d keys in %d transactions while relay 1 delivers\n", demoCrashMsgs, demoCrashKeys, demoCrashMsgs/demoCrashPerTx)
	before := ds1.ackedCount()
	ds1.armCrash(before + demoCrashMsgs/2)
	prodDone := make(chan error, 1)
	go func() {
		for t := 0; t < demoCrashMsgs/demoCrashPerTx; t++ {
			batch := make([]wharf.Message, 0, demoCrashPerTx)
			for i := t * demoCrashPerTx; i < (t+1)*demoCrashPerTx; i++ {
				k := i%demoCrashKeys + 1
				batch = append(batch, wharf.Message{Topic: demoTopic, Key: fmt.Sprintf("order-%d", k),
					Payload: fmt.Appendf(nil, `{"order":"order-%d","n":%d}`, k, i)})
			}
			s, err := enqueueDemo(ctx, producer, pool, batch)
			if err != nil {
				prodDone <- err
				return
			}
			sent = append(sent, s...) // read once prodDone was received
		}
		prodDone <- nil
	}()
	crashBatch, err := wait("waiting for relay 1 to reach the crash point", func() bool { return false }, ds1.crashed, prodDone)
	if err != nil {
		return err
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = relay1.StopAndCancel(stopCtx)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   relay 1    stopped hard right after the file took a batch of %d messages, before the relay recorded\n", crashBatch)
	fmt.Fprintf(out, "              them as delivered (StopAndCancel: its sink calls are cancelled and nothing more is recorded);\n")
	fmt.Fprintf(out, "              the file had taken %d of this step's messages from it\n", ds1.ackedCount()-before)
	if err := <-prodDone; err != nil {
		return fmt.Errorf("enqueueing step 2's messages failed: %w", err)
	}
	// A relay hands its lanes back when it stops, even hard, unless the
	// database does not answer in time: then another relay takes them over
	// when their leases expire, as after a crash of the process.
	var held int
	var registered bool
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+schema+".lanes l JOIN "+schema+".relays r ON r.relay_id = l.owner WHERE l.owner = $1 AND r.lease_until > now()), EXISTS (SELECT 1 FROM "+schema+".relays WHERE relay_id = $1)",
		relay1.RelayID()).Scan(&held, &registered); err != nil {
		return err
	}
	relay2, err := newRelay(&demoSink{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   relay 2    %s starts: delivers what relay 1 left in the outbox\n", relay2.RelayID())
	if held > 0 || registered {
		fmt.Fprintf(out, "              (relay 1 did not hand back its lanes in time: relay 2 takes them over when its lease runs out,\n")
		fmt.Fprintf(out, "              as after kill -9: up to --lease-ttl, 10s by default)\n")
	}
	drainCtx, cancel := context.WithTimeout(ctx, f.timeout)
	drainStart := time.Now()
	err = relay2.Drain(drainCtx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted")
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("relay 2 did not deliver everything within %s: giving up (raise --timeout)", f.timeout)
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "   relay 2    delivered the rest and stopped: nothing left in the outbox after %s\n", time.Since(drainStart).Round(time.Millisecond))
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil

	if demoBeforeCheck != nil {
		demoBeforeCheck(path)
	}
	res, err := checkDelivered(path, sent)
	if err != nil {
		return err
	}
	if !res.ok() {
		return fmt.Errorf("guarantee check FAILED on %s: %s", path, res.problem())
	}
	fmt.Fprintf(out, "   check      read the file back: %d lines; all %d messages of steps 1 and 2 delivered at least once,\n", res.lines, len(sent))
	fmt.Fprintf(out, "              %d delivered again after the crash with the same id (consumers deduplicate by id),\n", res.dups)
	if res.firstDup != "" {
		fmt.Fprintf(out, "              e.g. %s;\n", res.firstDup)
	}
	fmt.Fprintf(out, "              every key's messages arrived in enqueue order across %d keys: OK\n", res.keys)
	return nil
}

// enqueueDemo enqueues msgs in one transaction.
func enqueueDemo(ctx context.Context, c *wharf.Client, pool *pgxpool.Pool, msgs []wharf.Message) ([]sentMsg, error) {
	var ids []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = c.EnqueueTx(ctx, tx, msgs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	sent := make([]sentMsg, len(ids))
	for i, id := range ids {
		seq, _, err := wharf.ParseID(id)
		if err != nil {
			return nil, err
		}
		sent[i] = sentMsg{id: id, topic: msgs[i].Topic, key: msgs[i].Key, seq: seq}
	}
	return sent, nil
}

// printKeyOrder prints, per key, the seqs in the order they arrived, and
// fails if any key's arrived out of enqueue order.
func printKeyOrder(w io.Writer, sent []sentMsg, arrived map[string][]string) error {
	seqs := map[string]int64{}
	for _, s := range sent {
		seqs[s.id] = s.seq
	}
	for k := 1; k <= demoShowKeys; k++ {
		key := fmt.Sprintf("order-%d", k)
		parts := make([]string, 0, len(arrived[key]))
		for i, id := range arrived[key] {
			parts = append(parts, fmt.Sprintf("%d", seqs[id]))
			if i > 0 && seqs[id] <= seqs[arrived[key][i-1]] {
				return fmt.Errorf("per-key order was violated: key %s arrived as seq %s", key, strings.Join(parts, ", "))
			}
		}
		if len(parts) != len(demoEvents) {
			return fmt.Errorf("key %s: %d of %d messages arrived", key, len(parts), len(demoEvents))
		}
		fmt.Fprintf(w, "   key order  %s arrived as seq %s (%s): enqueue order\n", key, strings.Join(parts, ", "), strings.Join(demoEvents, ", "))
	}
	return nil
}

// demoPrinter prints the messages the destination acknowledged until stopped.
type demoPrinter struct {
	w       io.Writer
	mu      sync.Mutex
	on      bool
	arrived map[string][]string // key -> ids in arrival order
}

func (p *demoPrinter) show(msgs []*wharf.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on {
		return
	}
	for _, m := range msgs {
		fmt.Fprintf(p.w, "   delivered  id %s  topic %s  key %s  payload %s\n", m.ID, m.Topic, m.Key, m.Payload)
		p.arrived[m.Key] = append(p.arrived[m.Key], m.ID)
	}
}

// stop ends the printing; nothing is written to w once it returned.
func (p *demoPrinter) stop() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = false
	return p.arrived
}

// demoSink wraps the file sink of the demo's relays. It counts what the file
// acknowledged and, once armed, stops its relay hard: after the file took the
// batch that reaches the crash point it reports the batch's size on crashed
// and holds the sink call until the relay cancels it, so the relay never
// records those messages as delivered.
type demoSink struct {
	inner   wharf.Sink
	onAck   func([]*wharf.Message)
	crashed chan int
	mu      sync.Mutex
	acked   int
	crashAt int // 0: never
}

func (s *demoSink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	errs := s.inner.Publish(ctx, msgs)
	ok := msgs
	if errs != nil {
		ok = make([]*wharf.Message, 0, len(msgs))
		for i, m := range msgs {
			if errs[i] == nil {
				ok = append(ok, m)
			}
		}
	}
	s.mu.Lock()
	s.acked += len(ok)
	crash := s.crashAt > 0 && s.acked >= s.crashAt && len(ok) > 0
	if crash {
		s.crashAt = 0
	}
	s.mu.Unlock()
	if s.onAck != nil {
		s.onAck(ok)
	}
	if crash {
		s.crashed <- len(ok)
		<-ctx.Done()
		return wharf.FailAll(len(msgs), fmt.Errorf("wharf demo: relay stopped hard: %w", ctx.Err()))
	}
	return errs
}

func (s *demoSink) Close() error { return nil }

func (s *demoSink) ackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

func (s *demoSink) armCrash(at int) {
	s.mu.Lock()
	s.crashAt = at
	s.mu.Unlock()
}

// deliveryCheck is what reading the file back found.
type deliveryCheck struct {
	lines, unique, dups, keys int
	missing, unknown, order   int
	bad                       int    // lines that are not a message
	first                     string // the first problem
	firstDup                  string // the first redelivery
}

func (c *deliveryCheck) ok() bool {
	return c.missing == 0 && c.unknown == 0 && c.order == 0 && c.bad == 0
}

func (c *deliveryCheck) note(format string, args ...any) {
	if c.first == "" {
		c.first = fmt.Sprintf(format, args...)
	}
}

func (c *deliveryCheck) problem() string {
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{{c.missing, "never delivered"}, {c.order, "out of per-key order"}, {c.unknown, "not enqueued by the demo"}, {c.bad, "unreadable lines"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	return strings.Join(parts, ", ") + " (first: " + c.first + ")"
}

// checkDelivered reads the JSON-lines file at path and checks it against
// what was enqueued: every message there at least once, and per topic and
// key the first copies in seq order (a later copy is a redelivery, which may
// follow later messages of its key).
func checkDelivered(path string, sent []sentMsg) (deliveryCheck, error) {
	var c deliveryCheck
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("cannot read the demo's file sink back: %w", err)
	}
	byID := make(map[string]sentMsg, len(sent))
	keys := map[string]bool{}
	for _, s := range sent {
		byID[s.id] = s
		keys[s.topic+"\x00"+s.key] = true
	}
	c.keys = len(keys)
	latest := map[string]int64{}            // topic+key -> highest seq arrived
	seen := make(map[string]int, len(sent)) // id -> line of its first copy
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" && len(data) == 0 {
			break
		}
		c.lines++
		var m struct {
			ID    string  `json:"id"`
			Seq   int64   `json:"seq"`
			Topic string  `json:"topic"`
			Key   *string `json:"key"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil || m.Key == nil {
			c.bad++
			c.note("line %d is not a keyed message: %.60q", i+1, line)
			continue
		}
		s, known := byID[m.ID]
		if !known || s.topic != m.Topic || s.key != *m.Key || s.seq != m.Seq {
			c.unknown++
			c.note("line %d: id %s (topic %s, key %s) was not enqueued so", i+1, m.ID, m.Topic, *m.Key)
			continue
		}
		if seen[m.ID] > 0 {
			c.dups++
			if c.firstDup == "" {
				c.firstDup = fmt.Sprintf("id %s (key %s) is on lines %d and %d", m.ID, s.key, seen[m.ID], i+1)
			}
			continue
		}
		seen[m.ID] = i + 1
		c.unique++
		k := s.topic + "\x00" + s.key
		if s.seq < latest[k] {
			c.order++
			c.note("line %d: key %s seq %d arrived after seq %d", i+1, s.key, s.seq, latest[k])
		}
		latest[k] = max(latest[k], s.seq)
	}
	for _, s := range sent {
		if seen[s.id] == 0 {
			c.missing++
			c.note("id %s (key %s, seq %d) is not in the file", s.id, s.key, s.seq)
		}
	}
	return c, nil
}
