package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
)

// The retry schedule of poison messages unless the relay's configuration
// sets one: as in the fault suite's poison scenario.
const (
	PoisonAttempts = 3
	PoisonBackoff  = 50 * time.Millisecond
)

// relayUsage is what the relays cost, as far as it can be measured.
type relayUsage struct {
	cpu          time.Duration
	peakRSS      int64
	note         string
	deadLettered int64 // poison messages failed on their last attempt
}

// relays are the relays under test: one in this process, or processes.
type relays interface {
	// exited reports a relay that stopped on its own (an error: the bench
	// stops them).
	exited() <-chan error
	// stop stops the relays gracefully and reports their resource usage.
	stop(ctx context.Context) (relayUsage, error)
}

// probeSink wraps the real sink and records acknowledgement times. With
// poisonEvery > 0 it fails every message whose seq is a multiple of it, on
// every attempt; the last attempt (maxAttempts) is the one the relay
// dead-letters, and the message counts as worked off, without a latency.
type probeSink struct {
	inner       wharf.Sink
	tr          *tracker
	poisonEvery int64
	maxAttempts int
	deadLetters atomic.Int64 // poison messages failed on their last attempt
}

// errPoison is what the probe sink answers for a poison message.
var errPoison = errors.New("bench: poison message (--poison-percent)")

func (p *probeSink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if p.poisonEvery > 0 {
		return p.publishPoisoned(ctx, msgs)
	}
	errs := p.inner.Publish(ctx, msgs)
	p.acked(msgs, errs)
	return errs
}

func (p *probeSink) acked(msgs []*wharf.Message, errs []error) {
	now := time.Now()
	ids := make([]int64, 0, len(msgs))
	for i, m := range msgs {
		if errs == nil || errs[i] == nil {
			ids = append(ids, m.Seq)
		}
	}
	p.tr.ackedIDs(ids, now)
}

// publishPoisoned fails the poison messages and, as every sink must, does
// not attempt the later messages of their keys; the rest go to the sink.
func (p *probeSink) publishPoisoned(ctx context.Context, msgs []*wharf.Message) []error {
	res := wharf.NewResults(msgs)
	var pass []*wharf.Message
	var at []int
	var dead []int64
	for i, m := range msgs {
		if res.Blocked(i) {
			continue
		}
		if m.Seq%p.poisonEvery == 0 {
			res.Fail(i, errPoison)
			if m.Attempt >= p.maxAttempts {
				dead = append(dead, m.Seq)
			}
			continue
		}
		pass = append(pass, m)
		at = append(at, i)
	}
	if len(pass) > 0 {
		errs := p.inner.Publish(ctx, pass)
		for j, i := range at {
			var err error
			if errs != nil {
				err = errs[j]
			}
			res.Set(i, err)
		}
		p.acked(pass, errs)
	}
	if len(dead) > 0 {
		p.tr.settledIDs(dead, time.Now())
		p.deadLetters.Add(int64(len(dead)))
	}
	return res.Errors()
}

func (p *probeSink) Close() error { return p.inner.Close() }

type inProcessRelay struct {
	client *wharf.Client
	pool   *pgxpool.Pool
	sink   wharf.Sink
	probe  *probeSink
	cpu0   time.Duration
	done   chan error
	inProd bool // producers share the process
}

func startInProcess(ctx context.Context, o Options, schema string, tr *tracker, withProducers bool) (*inProcessRelay, error) {
	sink, err := sinkurl.Open(ctx, o.Sink)
	if err != nil {
		return nil, fmt.Errorf("--sink: %w", err)
	}
	pool, err := connectAs(ctx, o.DatabaseURL, 6, relayAppName)
	if err != nil {
		sink.Close()
		return nil, err
	}
	cfg := o.RelayConfig
	cfg.Schema = schema
	cfg.Logger = o.Logger
	probe := &probeSink{inner: sink, tr: tr}
	if o.PoisonPercent > 0 {
		probe.poisonEvery = max(1, int64(math.Round(100/o.PoisonPercent)))
		if cfg.MaxAttempts == 0 {
			cfg.MaxAttempts = PoisonAttempts
		}
		if cfg.RetryBackoff == 0 {
			cfg.RetryBackoff = PoisonBackoff
		}
		probe.maxAttempts = cfg.MaxAttempts
	}
	cfg.Sink = probe
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		pool.Close()
		sink.Close()
		return nil, fmt.Errorf("--relay-arg: %w", err)
	}
	cpu0, _, _ := selfUsage()
	r := &inProcessRelay{client: client, pool: pool, sink: sink, probe: probe, cpu0: cpu0, done: make(chan error, 1), inProd: withProducers}
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		pool.Close()
		sink.Close()
		return nil, err
	}
	return r, nil
}

func (r *inProcessRelay) exited() <-chan error { return nil }

func (r *inProcessRelay) stop(ctx context.Context) (relayUsage, error) {
	err := r.client.Stop(ctx)
	cpu1, rss, ok := selfUsage()
	r.pool.Close()
	r.sink.Close()
	u := relayUsage{note: "CPU and RSS not measurable on this platform"}
	if ok {
		u = relayUsage{cpu: cpu1 - r.cpu0, peakRSS: rss,
			note: "in-process relay: getrusage(RUSAGE_SELF) of the bench process while the relay ran; RSS is the process peak"}
		if r.inProd {
			u.note += "; CPU includes the producers (use --in-process=false for relay-only figures)"
		}
	}
	u.deadLettered = r.probe.deadLetters.Load()
	return u, err
}

type processRelays struct {
	cmds  []*exec.Cmd
	waits []chan error // one per process, closed after Wait returned
	exit  chan error
	mu    sync.Mutex
	stopd bool
}

// lockedWriter serialises the relay processes' stderr copies.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func startProcesses(o Options, schema string) (*processRelays, error) {
	prog := o.RelayCommand
	if len(prog) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--relays: cannot find this executable to run relay processes: %w", err)
		}
		prog = []string{exe}
	}
	stderr := &lockedWriter{w: o.RelayStderr}
	p := &processRelays{exit: make(chan error, o.Relays)}
	for i := range o.Relays {
		args := append(append([]string{}, prog[1:]...), "relay", "--schema", schema, "--sink", o.Sink, "--log-level", "warn")
		args = append(args, o.RelayArgs...)
		cmd := exec.Command(prog[0], args...)
		// The URL travels in the environment, not argv, where ps would show
		// its password.
		cmd.Env = append(os.Environ(), "WHARF_DATABASE_URL="+o.DatabaseURL, "PGAPPNAME="+relayAppName)
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			_, _ = p.stop(context.Background())
			return nil, fmt.Errorf("--relays: starting relay process %d: %w", i+1, err)
		}
		wait := make(chan error, 1)
		p.cmds = append(p.cmds, cmd)
		p.waits = append(p.waits, wait)
		go func() {
			err := cmd.Wait()
			p.mu.Lock()
			stopping := p.stopd
			p.mu.Unlock()
			if !stopping {
				if err == nil {
					err = errors.New("exited")
				}
				p.exit <- fmt.Errorf("relay process %d (pid %d) stopped on its own: %w", i+1, cmd.Process.Pid, err)
			}
			wait <- err
			close(wait)
		}()
	}
	return p, nil
}

func (p *processRelays) exited() <-chan error { return p.exit }

func (p *processRelays) stop(ctx context.Context) (relayUsage, error) {
	p.mu.Lock()
	p.stopd = true
	p.mu.Unlock()
	for _, c := range p.cmds {
		_ = terminate(c.Process)
	}
	var firstErr error
	for i, w := range p.waits {
		select {
		case <-w:
		case <-ctx.Done():
			_ = p.cmds[i].Process.Kill()
			<-w
			if firstErr == nil {
				firstErr = fmt.Errorf("relay process %d did not stop in time: killed", i+1)
			}
		}
	}
	u := relayUsage{note: fmt.Sprintf("%d relay processes: CPU summed from their rusage at exit, RSS is the largest one's peak", len(p.cmds))}
	for _, c := range p.cmds {
		cpu, rss, ok := processUsage(c.ProcessState)
		if !ok {
			u.note = "CPU and RSS not measurable on this platform"
			continue
		}
		u.cpu += cpu
		u.peakRSS = max(u.peakRSS, rss)
	}
	return u, firstErr
}
