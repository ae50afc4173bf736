package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
)

// relayUsage is what the relays cost, as far as it can be measured.
type relayUsage struct {
	cpu     time.Duration
	peakRSS int64
	note    string
}

// relays are the relays under test: one in this process, or processes.
type relays interface {
	// exited reports a relay that stopped on its own (an error: the bench
	// stops them).
	exited() <-chan error
	// stop stops the relays gracefully and reports their resource usage.
	stop(ctx context.Context) (relayUsage, error)
}

// probeSink wraps the real sink and records acknowledgement times.
type probeSink struct {
	inner wharf.Sink
	tr    *tracker
}

func (p *probeSink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	errs := p.inner.Publish(ctx, msgs)
	now := time.Now()
	ids := make([]int64, 0, len(msgs))
	for i, m := range msgs {
		if errs == nil || errs[i] == nil {
			ids = append(ids, m.Seq)
		}
	}
	p.tr.ackedIDs(ids, now)
	return errs
}

func (p *probeSink) Close() error { return p.inner.Close() }

type inProcessRelay struct {
	client *wharf.Client
	pool   *pgxpool.Pool
	sink   wharf.Sink
	cpu0   time.Duration
	done   chan error
	inProd bool // producers share the process
}

func startInProcess(ctx context.Context, o Options, schema string, tr *tracker, withProducers bool) (*inProcessRelay, error) {
	sink, err := sinkurl.Open(ctx, o.Sink)
	if err != nil {
		return nil, fmt.Errorf("--sink: %w", err)
	}
	pool, err := connect(ctx, o.DatabaseURL, 6)
	if err != nil {
		sink.Close()
		return nil, err
	}
	cfg := o.RelayConfig
	cfg.Schema = schema
	cfg.Logger = o.Logger
	cfg.Sink = &probeSink{inner: sink, tr: tr}
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		pool.Close()
		sink.Close()
		return nil, fmt.Errorf("--relay-arg: %w", err)
	}
	cpu0, _, _ := selfUsage()
	r := &inProcessRelay{client: client, pool: pool, sink: sink, cpu0: cpu0, done: make(chan error, 1), inProd: withProducers}
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
		cmd.Env = append(os.Environ(), "WHARF_DATABASE_URL="+o.DatabaseURL)
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
