package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
	"github.com/wharfhq/wharf/wharfflow"
)

// consoleFlags are the web console's settings, shared by `console` and
// `relay --console`.
type consoleFlags struct {
	// enabled: `relay --console` mounts the console on --admin-addr.
	enabled   bool
	token     string
	tokenFile string
	readOnly  bool
}

var consoleSettings = []string{"console-token", "console-token-file", "console-read-only"}

func (c *consoleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.token, "console-token", "", "token the console asks for (Authorization: Bearer, or its login form); required to listen beyond loopback")
	fs.StringVar(&c.tokenFile, "console-token-file", "", "file holding the console token (surrounding white space ignored), instead of --console-token")
	fs.BoolVar(&c.readOnly, "console-read-only", false, "serve the console read-only: no cancel, reschedule, retry, purge or signal")
}

// registerRelay adds the console flags to `relay`.
func (c *consoleFlags) registerRelay(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&c.enabled, "console", false, "serve the web console at /console/ on --admin-addr")
	c.register(fs)
	markSettings(fs, append([]string{"console"}, consoleSettings...)...)
}

// resolve reads the token file and checks the console may listen on addr
// (named by flag): beyond loopback only with a token. One-line usage errors.
func (c *consoleFlags) resolve(flag, addr string, sources map[string]string) error {
	from := func(name string) string {
		if src, ok := sources[name]; ok {
			return " (from " + src + ")"
		}
		return ""
	}
	if c.tokenFile != "" {
		if c.token != "" {
			return usageError{fmt.Errorf("--console-token%s and --console-token-file%s are both set: keep one", from("console-token"), from("console-token-file"))}
		}
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("--console-token-file%s: %w", from("console-token-file"), err)}
		}
		if c.token = strings.TrimSpace(string(b)); c.token == "" {
			return usageError{fmt.Errorf("--console-token-file %s%s is empty: write the token in it", c.tokenFile, from("console-token-file"))}
		}
	}
	if c.token == "" && !loopback(addr) {
		return usageError{fmt.Errorf("%s %s%s is not a loopback address: set --console-token, WHARF_CONSOLE_TOKEN or --console-token-file for the console to ask for, or listen on 127.0.0.1", flag, addr, from(strings.TrimPrefix(flag, "--")))}
	}
	return nil
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// handler is the console for client, with the Flows pages over the same
// pool and schema (they say so when the schema has no flow tables).
func (c *consoleFlags) handler(g *globals, client *wharf.Client, pool *pgxpool.Pool) (http.Handler, error) {
	flows, err := wharfflow.NewClient(pool, client.Schema())
	if err != nil {
		return nil, err
	}
	return wharfconsole.Handler(client, wharfconsole.WithToken(c.token), wharfconsole.WithReadOnly(c.readOnly), wharfconsole.WithLogger(g.log),
		wharfconsole.WithFlows(flows)), nil
}

// adminHandler is the relay's admin listener: the metrics and probes, and
// with --console the console at /console/.
func (c *consoleFlags) adminHandler(g *globals, client *wharf.Client, pool *pgxpool.Pool, metrics http.Handler) (http.Handler, error) {
	if c == nil || !c.enabled {
		return metrics, nil
	}
	console, err := c.handler(g, client, pool)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", console))
	mux.Handle("/", metrics)
	return mux, nil
}

func newConsoleCmd(g *globals) *cobra.Command {
	c := &consoleFlags{}
	var addr string
	var acrossTopics bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: backlog, relays, lanes, blocked keys, pending messages, dead letters, flows",
		Long: `Serves the web console against the database until stopped (SIGINT/SIGTERM).
It shows the backlog and throughput live, the relays and their lane leases, the
keys held behind a scheduled or retrying message, and the pending messages and
dead letters, which it can cancel, reschedule, retry or purge, and the durable
flows (counts per flow and status, instances with their state, steps and
signals), which it can retry, cancel or signal (unless --console-read-only). Listening beyond loopback needs --console-token.
A relay can serve the same console on its admin address: wharf relay --console.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.resolve("--addr", addr, g.sources); err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			pool, err := g.connect(ctx, 4)
			if err != nil {
				return err
			}
			defer closeWithin(pool, 2*time.Second)
			client, err := wharf.NewClient(pool, &wharf.Config{Schema: g.schema, Logger: g.log, OrderAcrossTopics: acrossTopics})
			if err != nil {
				return err
			}
			handler, err := c.handler(g, client, pool)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %s: %w", addr, err)
			}
			srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			g.log.Info("wharf: console serving", "url", "http://"+ln.Addr().String()+"/", "schema", g.schema, "read_only", c.readOnly, "token", c.token != "")
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&addr, "addr", "127.0.0.1:9751", "address to serve the console on")
	fs.BoolVar(&acrossTopics, "order-across-topics", false, "the relays keep order per key across topics (as their --order-across-topics): blocked keys are grouped the same way")
	c.register(fs)
	markSettings(fs, append([]string{"addr", "order-across-topics"}, consoleSettings...)...)
	return cmd
}
