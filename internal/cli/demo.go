package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
	relay        relayFlags
}

func newDemoCmd(g *globals) *cobra.Command {
	f := &demoFlags{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run producers and a relay end to end and print throughput and latency",
		Long: `Runs the whole pipeline: migrates a schema, starts a relay, runs producers that
enqueue messages in transactions, waits until every message was delivered, and prints
throughput, commit-to-acknowledgement latency and a per-key order check.

Without a database URL it starts a throwaway PostgreSQL from the local server
binaries (initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin) and removes it
afterwards. With a URL it works in a fresh schema wharf_demo_<random>, dropped at the
end unless --keep is given.`,
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
	fl.IntVar(&f.messages, "messages", 100000, "messages to enqueue")
	fl.IntVar(&f.producers, "producers", 4, "concurrent producer connections")
	fl.IntVar(&f.batch, "batch", 100, "messages per producer transaction")
	fl.IntVar(&f.keys, "keys", 1000, "distinct message keys")
	fl.IntVar(&f.payloadBytes, "payload-bytes", 200, "payload size in bytes")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up if delivery takes longer")
	fl.BoolVar(&f.keep, "keep", false, "keep the demo schema (only with a database URL)")
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

	schema := g.schema
	where := ""
	dropSchema := false
	started, stopDB, err := g.throwawayDatabase(ctx)
	if err != nil {
		return err
	}
	defer stopDB()
	if started {
		where = "throwaway local PostgreSQL"
	} else {
		if !schemaGiven {
			var b [4]byte
			_, _ = rand.Read(b[:])
			schema = "wharf_demo_" + hex.EncodeToString(b[:])
			dropSchema = !f.keep
		}
		where = "schema " + schema + " at " + redactURL(g.databaseURL)
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
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
				g.log.Warn("wharf: dropping the demo schema failed", "schema", schema, "err", err)
			}
		}()
	}
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)

	probe := newProbe(sink, f.messages)
	cfg := f.relay.cfg
	cfg.Schema = schema
	cfg.Logger = g.log
	cfg.Sink = probe
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		return usageError{err}
	}
	fmt.Fprintf(g.stderr, "wharf demo: %d messages, %d producers x %d per transaction, %d keys, %d-byte payloads, %s, PostgreSQL %s\n",
		f.messages, f.producers, f.batch, f.keys, f.payloadBytes, where, version)
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), f.relay.stopWait)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()

	start := time.Now()
	var produced atomic.Int64
	var produceDur time.Duration
	prodDone := make(chan error, 1)
	go func() {
		err := produce(ctx, pool, client, f, probe, &produced)
		produceDur = time.Since(start)
		prodDone <- err
	}()

	bar := newProgress(g.stderr, f.messages)
	deadline := time.NewTimer(f.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var prodErr error
	prodRunning := true
	for probe.unique() < int64(f.messages) {
		select {
		case prodErr = <-prodDone:
			prodRunning = false
			if prodErr != nil {
				bar.done()
				return fmt.Errorf("producer failed: %w", prodErr)
			}
		case <-tick.C:
			bar.update(produced.Load(), probe.unique(), time.Since(start))
		case <-probe.complete:
		case <-deadline.C:
			bar.done()
			return fmt.Errorf("delivered %d of %d messages in %s: giving up (raise --timeout)", probe.unique(), f.messages, f.timeout)
		case <-ctx.Done():
			bar.done()
			return errors.New("interrupted")
		}
	}
	total := time.Since(start)
	if prodRunning {
		if prodErr = <-prodDone; prodErr != nil {
			return prodErr
		}
	}
	bar.update(produced.Load(), probe.unique(), total)
	bar.done()
	probe.report(g.stdout, f, produceDur, total)
	if v := probe.orderViolations.Load(); v > 0 {
		return fmt.Errorf("per-key order was violated %d times", v)
	}
	return nil
}

func produce(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *wharf.Client, f *demoFlags, probe *probe, produced *atomic.Int64) error {
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
				if first >= int64(f.messages) {
					return nil
				}
				msgs = msgs[:0]
				for i := first; i < first+int64(f.batch) && i < int64(f.messages); i++ {
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
	return &probe{inner: inner, target: int64(target), commit: make(map[int64]time.Time, target),
		ack: make(map[int64]time.Time, target), lastByKey: map[string]int64{}, complete: make(chan struct{})}
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
	p.mu.Unlock()
	p.count.Store(n)
	if n >= p.target {
		p.once.Do(func() { close(p.complete) })
	}
	return errs
}

func (p *probe) Close() error { return nil }

func (p *probe) unique() int64 { return p.count.Load() }

func (p *probe) report(w io.Writer, f *demoFlags, produceDur, total time.Duration) {
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
	fmt.Fprintf(w, "produced   %d messages in %s (%s)\n", f.messages, produceDur.Round(time.Millisecond), rate(f.messages, produceDur))
	fmt.Fprintf(w, "delivered  %d messages in %s (%s), %d redelivered\n", len(p.ack), total.Round(time.Millisecond), rate(len(p.ack), total), p.dups.Load())
	fmt.Fprintf(w, "latency    commit -> sink ack: p50 %s  p95 %s  p99 %s  max %s\n", pct(0.50), pct(0.95), pct(0.99), pct(1))
	order := "intact"
	if v := p.orderViolations.Load(); v > 0 {
		order = fmt.Sprintf("VIOLATED %d times", v)
	}
	fmt.Fprintf(w, "key order  %s across %d keys\n", order, len(p.lastByKey))
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
