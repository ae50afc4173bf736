package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfmigrate"
)

func newConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check the relay configuration",
	}
	f := &relayFlags{}
	var offline bool
	validate := &cobra.Command{
		Use:   "validate",
		Short: "Check every setting, and that the database and every sink answer",
		Long: `Reads the relay's settings exactly as 'wharf relay' would (flags, then WHARF_*
environment variables, then the --config file), prints each with where it came from
(secrets hidden), and checks them:

  - every value is in range, the sink URLs parse and name known sinks, route patterns
    are valid;
  - the database answers and its schema is migrated to the version this build needs;
  - every sink opens as it would at relay start (the same side effects: a NATS sink
    with create_stream=true creates its stream) and its hosts accept a connection.

--offline skips the database and the sinks. Exit status: 0 when everything is valid,
2 for a flag or a value out of range, 1 when the config file or an environment
variable does not parse (or names an unknown setting), or the database or a sink
cannot be reached.`,
		Example: `  wharf config validate --config /etc/wharf/wharf.yaml
  WHARF_SINK=nats://nats:4222 wharf config validate --offline`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return validateConfig(cmd, g, f, offline)
		},
	}
	f.registerSettings(validate)
	validate.Flags().BoolVar(&offline, "offline", false, "check the settings only: do not connect to the database or the sinks")
	cmd.AddCommand(validate)
	return cmd
}

var defaultInUsage = regexp.MustCompile(`\(default ([^)]*)\)`)

// writeSettings lists the command's settings with their values (URLs
// redacted) and where each came from.
func writeSettings(out io.Writer, g *globals, fs *pflag.FlagSet) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "settings")
	fs.VisitAll(func(f *pflag.Flag) {
		if !isSetting(f) {
			return
		}
		value := f.Value.String()
		source := "flag"
		if src, ok := g.sources[f.Name]; ok {
			source = src
		} else if !f.Changed {
			source = "default"
			if value == "" || value == "0" || value == "0s" || value == "[]" {
				if m := defaultInUsage.FindStringSubmatch(f.Usage); m != nil {
					value = m[1]
				} else if value == "[]" {
					value = "none"
				}
			}
		}
		switch f.Name {
		case "database-url", "sink":
			if value != "" {
				value = redactURL(value)
			}
		case "route":
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				routes := sv.GetSlice()
				for i, r := range routes {
					routes[i] = redactRoute(r)
				}
				value = strings.Join(routes, " ")
			}
		}
		if value == "" {
			value = "-"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", f.Name, value, source)
	})
	_ = w.Flush()
}

// validateConfig is `wharf config validate`.
func validateConfig(cmd *cobra.Command, g *globals, f *relayFlags, offline bool) error {
	ctx := cmd.Context()
	writeSettings(g.stdout, g, cmd.Flags())
	if _, err := f.config(g, cmd.Flags()); err != nil {
		return err
	}
	if f.sink == "" && len(f.routes) == 0 {
		return usageError{fmt.Errorf("--sink is required (one of: %s), or --route PATTERN=URL", joinSchemes())}
	}
	urls, err := sinkURLs(f)
	if err != nil {
		return usageError{err}
	}
	if g.databaseURL != "" {
		// A database URL that cannot be read is a setting's mistake, found
		// with --offline too.
		if _, err := g.parseDatabaseURL(); err != nil {
			return err
		}
	}
	w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "checks")
	fmt.Fprintln(w, "  settings\tok")
	if offline {
		fmt.Fprintln(w, "  database\tnot checked (--offline)")
		for _, u := range urls {
			fmt.Fprintf(w, "  sink %s\tnot checked (--offline)\n", redactURL(u))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(g.stdout, "the settings are valid")
		return nil
	}
	var problems []string
	report := func(what string, err error, ok string) {
		if err != nil {
			msg := oneLineError(err)
			fmt.Fprintf(w, "  %s\tFAILED: %s\n", what, msg)
			problems = append(problems, what+": "+msg)
			return
		}
		fmt.Fprintf(w, "  %s\tok: %s\n", what, ok)
	}
	dbOK, err := checkDatabase(ctx, g)
	report("database", err, dbOK)
	if err == nil {
		ok, note, err := checkAutovacuum(ctx, g)
		switch {
		case err != nil:
			report("autovacuum", err, "")
		case note != "":
			fmt.Fprintf(w, "  autovacuum\tnote: %s\n", note)
		default:
			report("autovacuum", nil, ok)
		}
	}
	for _, u := range urls {
		ok, err := checkSink(ctx, u)
		report("sink "+redactURL(u), err, ok)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	switch len(problems) {
	case 0:
		fmt.Fprintln(g.stdout, "the configuration is valid")
		return nil
	case 1:
		return errors.New(problems[0])
	default:
		return fmt.Errorf("%d problems: %s", len(problems), strings.Join(problems, "; "))
	}
}

// sinkURLs checks the routes and returns every distinct sink URL, in order.
func sinkURLs(f *relayFlags) ([]string, error) {
	var urls []string
	add := func(u string) {
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	for _, r := range f.routes {
		pattern, u, ok := strings.Cut(r, "=")
		if !ok || strings.TrimSpace(u) == "" {
			return nil, fmt.Errorf("--route %q: write PATTERN=SINK_URL, e.g. --route 'orders.*=kafka://127.0.0.1:9092'", redactRoute(r))
		}
		if err := wharf.ValidatePattern(strings.TrimSpace(pattern)); err != nil {
			return nil, fmt.Errorf("--route %q: %w", redactRoute(r), err)
		}
		add(strings.TrimSpace(u))
	}
	if f.sink != "" {
		add(f.sink)
	}
	schemes := sinkurl.Schemes()
	for _, raw := range urls {
		scheme := strings.ToLower(raw)
		if i := strings.Index(scheme, ":"); i >= 0 {
			scheme = scheme[:i]
		}
		if !slices.Contains(schemes, scheme) {
			return nil, fmt.Errorf("unknown sink scheme %q in %q: use one of %s", scheme, redactURL(raw), strings.Join(schemes, ", "))
		}
	}
	return urls, nil
}

func checkDatabase(ctx context.Context, g *globals) (string, error) {
	pool, err := g.connect(ctx, 1)
	if err != nil {
		return "", err
	}
	defer closeWithin(pool, 2*time.Second)
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return "", err
	}
	m, err := wharfmigrate.New(g.schema)
	if err != nil {
		return "", err
	}
	if err := m.Check(ctx, pool); err != nil {
		return "", err
	}
	return fmt.Sprintf("PostgreSQL %s, schema %s at version %d", version, g.schema, m.Latest()), nil
}

// maxNaptime is the longest autovacuum_naptime config validate accepts
// without a note: a busy table outbox is vacuumed at most once per
// naptime, over every row deleted since.
const maxNaptime = 10 * time.Second

// checkAutovacuum reads the server's autovacuum settings and returns a note
// when they let a busy table outbox bloat between vacuums.
func checkAutovacuum(ctx context.Context, g *globals) (ok, note string, err error) {
	pool, err := g.connect(ctx, 1)
	if err != nil {
		return "", "", err
	}
	defer closeWithin(pool, 2*time.Second)
	var on bool
	var naptime int64 // seconds
	var shown string
	err = pool.QueryRow(ctx, `SELECT current_setting('autovacuum')::bool,
    (SELECT setting::bigint FROM pg_settings WHERE name = 'autovacuum_naptime'),
    current_setting('autovacuum_naptime')`).Scan(&on, &naptime, &shown)
	if err != nil {
		return "", "", err
	}
	switch {
	case !on:
		return "", "autovacuum is off: a table outbox's delivered rows stay as dead tuples and the table and its indexes grow until VACUUM runs (set autovacuum = on, or vacuum the outbox on a schedule)", nil
	case time.Duration(naptime)*time.Second > maxNaptime:
		return "", fmt.Sprintf("autovacuum_naptime is %s: a table outbox busy at thousands of messages per second is vacuumed at most once per naptime, over every row delivered since, and that vacuum slows the relay's removals for a second or so each time; set autovacuum_naptime = 5s (docs/operating.md, Autovacuum)", shown), nil
	}
	return "naptime " + shown, "", nil
}

// checkSink opens the sink as a relay would, pings it when it can, and dials
// each of its network hosts.
func checkSink(ctx context.Context, raw string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s, err := sinkurl.Open(ctx, raw)
	if err != nil {
		return "", err
	}
	defer s.Close()
	if p, ok := s.(wharf.Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return "", fmt.Errorf("ping: %w", err)
		}
	}
	hosts := sinkHosts(raw)
	if len(hosts) == 0 {
		return "opened", nil
	}
	var d net.Dialer
	for _, h := range hosts {
		c, err := d.DialContext(ctx, "tcp", h)
		if err != nil {
			return "", fmt.Errorf("%s does not accept connections: %w", h, err)
		}
		_ = c.Close()
	}
	return "opened, " + strings.Join(hosts, ", ") + " accepting connections", nil
}

// sinkHosts returns the host:port pairs a network sink URL names.
func sinkHosts(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil
	}
	defaults := map[string]string{"http": "80", "https": "443", "kafka": "9092", "nats": "4222", "amqp": "5672", "amqps": "5671", "redis": "6379", "rediss": "6379", "mqtt": "1883", "mqtts": "8883"}
	port, ok := defaults[u.Scheme]
	if !ok {
		return nil
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), port)
		}
		out = append(out, h)
	}
	return out
}
