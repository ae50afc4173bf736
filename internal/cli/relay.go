package cli

import (
	"context"
	"fmt"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
)

// relayFlags are the relay settings shared by `relay` and `demo`.
type relayFlags struct {
	sink     string
	routes   []string
	drain    bool
	stopWait time.Duration
	cfg      wharf.Config
}

func (f *relayFlags) register(cmd *cobra.Command, sinkDefault string) {
	fl := cmd.Flags()
	fl.StringVar(&f.sink, "sink", sinkDefault, "where messages go: stdout:, file:///path.jsonl, null:, kafka://, nats://, amqp://, redis://, https:// (see README); with --route, where unrouted topics go")
	fl.StringArrayVar(&f.routes, "route", nil, "PATTERN=SINK_URL: send topics matching PATTERN (orders.*, hooks.**) to that sink; repeatable, first match wins (YAML: routes)")
	fl.BoolVar(&f.drain, "drain", false, "exit 0 once nothing deliverable is left: nothing due, in flight or waiting for a retry (messages scheduled for later stay)")
	fl.DurationVar(&f.stopWait, "stop-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for in-flight deliveries")
	fl.StringVar(&f.cfg.RelayID, "relay-id", "", "name of this relay in the lanes table (default host-pid-random)")
	fl.BoolVar(&f.cfg.PollOnly, "poll-only", false, "do not LISTEN (for PgBouncer in transaction mode); poll every --poll-interval")
	fl.DurationVar(&f.cfg.PollInterval, "poll-interval", 0, "idle poll interval (default 50ms)")
	fl.DurationVar(&f.cfg.LeaseTTL, "lease-ttl", 0, "lane lease lifetime: a crashed relay's lanes move after this (default 10s)")
	fl.DurationVar(&f.cfg.RebalanceInterval, "rebalance-interval", 0, "lease renewal and rebalancing period (default 1s)")
	fl.IntVar(&f.cfg.FetchBatch, "fetch-batch", 0, "most rows read per fetch (default 4000)")
	fl.IntVar(&f.cfg.SinkBatch, "sink-batch", 0, "most messages per sink call (default 1000)")
	fl.IntVar(&f.cfg.SinkConcurrency, "sink-concurrency", 0, "sink calls in flight (default 4)")
	fl.IntVar(&f.cfg.MaxBuffered, "max-buffered", 0, "most messages held in memory (default 20000)")
	fl.IntVar(&f.cfg.MaxAttempts, "max-attempts", 0, "deliveries before a message is dead-lettered (default 12)")
	fl.DurationVar(&f.cfg.RetryBackoff, "retry-backoff", 0, "first retry delay, doubling per attempt with jitter (default 1s)")
	fl.DurationVar(&f.cfg.MaxRetryBackoff, "max-retry-backoff", 0, "retry delay cap (default 10m)")
}

func newRelayCmd(g *globals) *cobra.Command {
	f := &relayFlags{}
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Deliver committed messages to a sink until stopped (or drained)",
		Long: `Runs a relay. Any number of relays may run against one database: they share the
64 lanes through leases and take over a stopped or crashed relay's lanes.
Logs go to stderr; SIGINT/SIGTERM stop it gracefully (exit 0).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runRelay(ctx, g, f)
		},
	}
	f.register(cmd, "")
	return cmd
}

func runRelay(ctx context.Context, g *globals, f *relayFlags) error {
	if f.sink == "" && len(f.routes) == 0 {
		return usageError{fmt.Errorf("--sink is required (one of: %s), or --route PATTERN=URL", joinSchemes())}
	}
	cfg := f.cfg
	cfg.Schema = g.schema
	cfg.Logger = g.log
	// Validate everything before touching the database or the sink.
	if _, err := wharf.NewClient(nil, &cfg); err != nil {
		return usageError{err}
	}
	sink, err := openSinks(ctx, f.sink, f.routes)
	if err != nil {
		return usageError{err}
	}
	defer sink.Close()
	cfg.Sink = sink
	pool, err := g.connect(ctx, 6)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := wharf.NewClient(pool, &cfg)
	if err != nil {
		return err
	}
	if f.drain {
		return client.Drain(ctx)
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
