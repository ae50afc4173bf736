package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfotel"
	"github.com/wharfhq/wharf/wharfprom"
)

// relayFlags are the relay settings shared by `relay` and `demo`.
type relayFlags struct {
	sink     string
	routes   []string
	drain    bool
	stopWait time.Duration
	// drainTimeout bounds a --drain run (0: no bound).
	drainTimeout time.Duration
	// adminAddr is where the relay serves its metrics and probes ("": nowhere).
	adminAddr string
	cfg       wharf.Config
	// console: `relay --console` serves the web console on adminAddr.
	console consoleFlags
}

func (f *relayFlags) register(cmd *cobra.Command, sinkDefault string) {
	fl := cmd.Flags()
	fl.StringVar(&f.sink, "sink", sinkDefault, "where messages go: stdout:, file:///path.jsonl, null:, kafka://, nats://, amqp://, redis://, mqtt://, https:// (docs/relay.md, Sinks); with --route, where unrouted topics go")
	fl.StringArrayVar(&f.routes, "route", nil, "PATTERN=SINK_URL: send topics matching PATTERN (orders.*, hooks.**) to that sink; repeatable, first match wins (YAML: routes)")
	fl.BoolVar(&f.drain, "drain", false, "exit 0 once nothing deliverable is left: nothing due, in flight or waiting for a retry (messages scheduled for later stay)")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 0, "with --drain: stop after this long and exit 1, naming what is left (default: wait as long as it takes)")
	fl.DurationVar(&f.stopWait, "stop-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for in-flight deliveries (also with --drain); then they are abandoned and delivered again later. A second signal exits at once")
	fl.StringVar(&f.cfg.RelayID, "relay-id", "", "name of this relay in the lanes table (default host-pid-random)")
	fl.BoolVar(&f.cfg.PollOnly, "poll-only", false, "do not LISTEN (for PgBouncer in transaction mode); poll every --poll-interval")
	fl.DurationVar(&f.cfg.PollInterval, "poll-interval", 0, "idle poll interval (default 50ms)")
	fl.DurationVar(&f.cfg.FetchInterval, "fetch-interval", 0, "least time from one fetch to the next while the relay keeps up; a relay that is behind fetches back to back (default 5ms; 1us: always back to back)")
	fl.DurationVar(&f.cfg.LeaseTTL, "lease-ttl", 0, "lane lease lifetime: a crashed relay's lanes move after this (default 10s)")
	fl.DurationVar(&f.cfg.RebalanceInterval, "rebalance-interval", 0, "lease renewal and rebalancing period (default 1s)")
	fl.BoolVar(&f.cfg.Exclusive, "exclusive", false, "hold every lane while no other relay holds one, and stand by otherwise: one relay works, the others are hot standbys (give every relay of the outbox the same setting)")
	fl.IntVar(&f.cfg.FetchBatch, "fetch-batch", 0, "most rows read per fetch (default 4000)")
	fl.IntVar(&f.cfg.SinkBatch, "sink-batch", 0, "most messages per sink call (default 1000)")
	fl.IntVar(&f.cfg.SinkConcurrency, "sink-concurrency", 0, "sink calls in flight (default 4)")
	fl.IntVar(&f.cfg.MaxBuffered, "max-buffered", 0, "most messages loaded in memory; waiting ones are kept as positions and do not count (default 20000)")
	fl.Var((*byteSize)(&f.cfg.MaxBufferedBytes), "max-buffered-bytes", "most payload bytes loaded in memory, e.g. 64MiB or 1GiB (default 64MiB)")
	fl.BoolVar(&f.cfg.OrderAcrossTopics, "order-across-topics", false, "keep order per key across topics (default: per topic and key)")
	fl.IntVar(&f.cfg.MaxAttempts, "max-attempts", 0, "deliveries before a message is dead-lettered (default 12)")
	fl.DurationVar(&f.cfg.RetryBackoff, "retry-backoff", 0, "first retry delay, doubling per attempt with jitter (default 1s)")
	fl.DurationVar(&f.cfg.MaxRetryBackoff, "max-retry-backoff", 0, "retry delay cap (default 10m)")
	fl.StringVar(&f.adminAddr, "admin-addr", "", "serve Prometheus metrics on /metrics and the liveness and readiness probes on /healthz and /readyz at this address, e.g. :9090 (default: none)")
}

// relaySettings are the relay flags that are settings (see markSettings).
var relaySettings = []string{"sink", "route", "drain", "drain-timeout", "stop-timeout", "admin-addr", "relay-id", "poll-only", "poll-interval",
	"fetch-interval", "lease-ttl", "rebalance-interval", "exclusive", "fetch-batch", "sink-batch", "sink-concurrency", "max-buffered",
	"max-buffered-bytes", "order-across-topics", "max-attempts", "retry-backoff", "max-retry-backoff"}

// registerSettings registers the relay flags as settings: read from the
// environment and the config file too.
func (f *relayFlags) registerSettings(cmd *cobra.Command) {
	f.register(cmd, "")
	markSettings(cmd.Flags(), relaySettings...)
}

// config checks the relay settings and returns the library configuration
// they make: one-line errors that name the flag, its range and where a bad
// value came from.
func (f *relayFlags) config(g *globals, fs *pflag.FlagSet) (wharf.Config, error) {
	if err := g.checkRanges(fs); err != nil {
		return wharf.Config{}, err
	}
	cfg := f.cfg
	cfg.Schema = g.schema
	cfg.Logger = g.log
	if _, err := wharf.NewClient(nil, &cfg); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

func newRelayCmd(g *globals) *cobra.Command {
	f := &relayFlags{}
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Deliver committed messages to a sink until stopped (or drained)",
		Long: `Runs a relay. Any number of relays may run against one database: they share the
64 lanes through leases and take over a stopped or crashed relay's lanes.
Logs go to stderr. SIGINT/SIGTERM stop it gracefully (exit 0): it stops fetching,
waits up to --stop-timeout for the deliveries in flight, writes their results and
hands its lanes back. A second signal ends it at once.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			// Validate everything before touching the database or the sink.
			cfg, err := f.config(g, cmd.Flags())
			if err != nil {
				return err
			}
			if f.console.enabled {
				if f.adminAddr == "" {
					return usageError{errors.New("--console needs --admin-addr: the console is served there at /console/")}
				}
				if err := f.console.resolve("--admin-addr", f.adminAddr, g.sources); err != nil {
					return err
				}
			}
			return runRelay(ctx, g, f, cfg)
		},
	}
	f.registerSettings(cmd)
	f.console.registerRelay(cmd)
	return cmd
}

func runRelay(ctx context.Context, g *globals, f *relayFlags, cfg wharf.Config) error {
	if f.sink == "" && len(f.routes) == 0 {
		return usageError{fmt.Errorf("--sink is required (one of: %s), or --route PATTERN=URL", joinSchemes())}
	}
	sink, err := openSinks(ctx, f.sink, f.routes)
	if err != nil {
		return usageError{err}
	}
	defer sink.Close()
	cfg.Sink = sink
	// Tracing, when the standard OTEL_* variables ask for it (off otherwise,
	// at no cost).
	tracer, shutdownTracing, err := wharfotel.FromEnv(ctx, "wharf", moduleVersion())
	if err != nil {
		return usageError{err}
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTracing(sctx)
	}()
	cfg.Tracer = tracer
	pool, err := g.connect(ctx, 6)
	if err != nil {
		return err
	}
	// Closing a connection to a database that stopped answering can hang
	// (pgx sends a cancel request to it): do not let that keep the process.
	defer closeWithin(pool, 2*time.Second)
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		return err
	}
	stopAdmin, err := g.serveAdmin(f.adminAddr, client, pool, &f.console)
	if err != nil {
		return err
	}
	defer stopAdmin()
	if f.sink == "" {
		g.log.Warn("wharf: no --sink: a message whose topic no --route matches is dead-lettered at its first attempt; pass --sink URL for the other topics, or --route '**=URL'", "routes", redactRoutes(f.routes))
	}
	pingSinks(ctx, g, sink)
	if f.drain {
		return drainUntilSignal(ctx, g, f, client, pool)
	}
	// Start's context must outlive the signal: Stop below does the graceful stop.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	g.log.Info("wharf: relay started", "schema", g.schema, "sink", redactURL(f.sink), "routes", redactRoutes(f.routes))
	select {
	case <-ctx.Done():
	case <-client.Stopped():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), f.stopWait)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return err
	}
	g.log.Info("wharf: relay stopped")
	return nil
}

// pingTimeout bounds the start-up check of the sinks that can be pinged.
const pingTimeout = 5 * time.Second

// pingSinks checks, at start, that the sinks that can be pinged answer (a
// Kafka sink connects lazily: without this nothing would say that no broker
// answers until a message is due). One that does not is logged as a warning
// and the relay starts anyway: the sink keeps trying, its messages are
// retried with backoff, and /readyz reports it until it answers.
func pingSinks(ctx context.Context, g *globals, sink wharf.Sink) {
	p, ok := sink.(wharf.Pinger)
	if !ok {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := p.Ping(pctx); err != nil {
		g.log.Warn("wharf: the sink does not answer; starting anyway: its messages are retried until it does (/readyz reports it meanwhile)", "err", oneLineError(err))
	}
}

// drainReportEvery is how often a drain logs what it still waits for.
const drainReportEvery = 10 * time.Second

// drainUntilSignal drains; a signal or --drain-timeout stops it gracefully,
// and after --stop-timeout in-flight deliveries are abandoned (delivered
// again later). While it runs it logs, every drainReportEvery, what it still
// waits for.
func drainUntilSignal(ctx context.Context, g *globals, f *relayFlags, client *wharf.Client, pool *pgxpool.Pool) error {
	done := make(chan error, 1)
	go func() { done <- client.Drain(context.WithoutCancel(ctx)) }()
	var timeout <-chan time.Time
	if f.drainTimeout > 0 {
		t := time.NewTimer(f.drainTimeout)
		defer t.Stop()
		timeout = t.C
	}
	report := time.NewTicker(drainReportEvery)
	defer report.Stop()
	timedOut := false
wait:
	for {
		select {
		case err := <-done:
			return err
		case <-report.C:
			g.log.Info("wharf: draining: waiting for "+drainLeft(ctx, g, client, pool), "drain_timeout", f.drainTimeout)
		case <-timeout:
			timedOut = true
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	left := drainLeft(context.WithoutCancel(ctx), g, client, pool)
	g.log.Info("wharf: stopping the drain", "stop_timeout", f.stopWait, "left", left)
	stopCtx, cancel := context.WithTimeout(context.Background(), f.stopWait)
	defer cancel()
	err := client.Stop(stopCtx)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		// A sink that ignores cancellation: exit anyway; the leases expire.
	}
	if err == nil && timedOut {
		err = fmt.Errorf("--drain-timeout %s passed before the outbox was drained: %s left (a relay delivers them later)", f.drainTimeout, left)
	}
	return err
}

// drainLeft says what a drain still waits for: the messages at the sink or
// loaded, and those waiting for a retry with the time of the next attempt.
func drainLeft(ctx context.Context, g *globals, client *wharf.Client, pool *pgxpool.Pool) string {
	st := client.Metrics()
	var parts []string
	if n := st.InFlight.Load(); n > 0 {
		parts = append(parts, plural(n, "message")+" at the sink")
	}
	if n := st.Buffered.Load() - st.InFlight.Load(); n > 0 {
		parts = append(parts, plural(n, "message")+" loaded")
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	var next *float64
	err := pool.QueryRow(qctx, `SELECT count(*), extract(epoch FROM min(next_attempt_at) - now())::float8 FROM `+g.schema+`.retries`).Scan(&n, &next)
	if err == nil && n > 0 {
		s := plural(n, "retrying message")
		if next != nil {
			if d := time.Duration(*next * float64(time.Second)); d > 0 {
				s += ", next attempt in " + d.Round(time.Second).String()
			} else {
				s += ", next attempt due now"
			}
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		if n := st.Held.Load(); n > 0 {
			return plural(n, "held message")
		}
		return "the relay's next read"
	}
	return strings.Join(parts, "; ")
}

// plural writes "1 message", "2 messages".
func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// serveAdmin serves the relay's metrics (/metrics) and probes (/healthz,
// /readyz) on addr until the returned function is called; "" serves nothing.
// The address is bound before the relay starts, so a port in use fails the
// start instead of leaving a relay without its probes.
func (g *globals) serveAdmin(addr string, client *wharf.Client, pool *pgxpool.Pool, console *consoleFlags) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	handler, err := console.adminHandler(g, client, pool, wharfprom.Handler(client, wharfprom.WithVersion(moduleVersion()), wharfprom.WithLogger(g.log)))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error("wharf: the admin server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	g.log.Info("wharf: serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	if console != nil && console.enabled {
		g.log.Info("wharf: serving the console", "url", "http://"+ln.Addr().String()+"/console/", "read_only", console.readOnly, "token", console.token != "")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

func closeWithin(pool interface{ Close() }, d time.Duration) {
	done := make(chan struct{})
	go func() { pool.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func joinSchemes() string {
	s := ""
	for i, x := range sinkurl.Schemes() {
		if i > 0 {
			s += ", "
		}
		s += x
	}
	return s
}

// openSinks opens the relay's sink: the --sink URL alone, or a router over the
// --route PATTERN=URL pairs with --sink (when given) for every other topic.
// Each distinct URL is opened once.
func openSinks(ctx context.Context, sinkURL string, routes []string) (wharf.Sink, error) {
	if len(routes) == 0 {
		return sinkurl.Open(ctx, sinkURL)
	}
	type pair struct{ pattern, url string }
	pairs := make([]pair, 0, len(routes)+1)
	for _, r := range routes {
		pattern, u, ok := strings.Cut(r, "=")
		pattern = strings.TrimSpace(pattern)
		if !ok || strings.TrimSpace(u) == "" {
			return nil, fmt.Errorf("--route %q: write PATTERN=SINK_URL, e.g. --route 'orders.*=kafka://127.0.0.1:9092'", redactRoute(r))
		}
		if err := wharf.ValidatePattern(pattern); err != nil {
			return nil, fmt.Errorf("--route %q: %w", redactRoute(r), err)
		}
		pairs = append(pairs, pair{pattern, strings.TrimSpace(u)})
	}
	if sinkURL != "" {
		pairs = append(pairs, pair{"**", sinkURL})
	}
	opened := map[string]wharf.Sink{}
	closeAll := func() {
		for _, s := range opened {
			_ = s.Close()
		}
	}
	rs := make([]wharf.Route, 0, len(pairs))
	for _, p := range pairs {
		s, ok := opened[p.url]
		if !ok {
			var err error
			if s, err = sinkurl.Open(ctx, p.url); err != nil {
				closeAll()
				return nil, fmt.Errorf("route %q: %w", p.pattern, err)
			}
			opened[p.url] = s
		}
		rs = append(rs, wharf.Route{Pattern: p.pattern, Sink: s})
	}
	router, err := wharf.NewRouter(rs...)
	if err != nil {
		closeAll()
		return nil, err
	}
	return router, nil
}

func redactRoute(r string) string {
	pattern, u, ok := strings.Cut(r, "=")
	if !ok {
		return r
	}
	return pattern + "=" + redactURL(u)
}

func redactRoutes(routes []string) []string {
	out := make([]string, len(routes))
	for i, r := range routes {
		out[i] = redactRoute(r)
	}
	return out
}
