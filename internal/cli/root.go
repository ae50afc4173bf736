// Package cli implements the wharf command line. cmd/wharf is a thin main
// around Main so the commands can be tested in-process and reused.
package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// Version is set at build time with -ldflags "-X github.com/wharfhq/wharf/internal/cli.Version=v1.2.3".
var Version = ""

// usageError marks a mistake in the command line itself (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// Main runs the CLI with args and returns the process exit status: 0 on
// success, 1 on failure, 2 on a usage error. Errors are one line on stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "wharf: %s\n", oneLineError(err))
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// oneLineError folds a possibly multi-line error (pgx lists every connection
// attempt on its own line) into one line, drops repeated lines and the
// "wharf: " prefix library errors carry, and names CLI flags instead of
// Config fields.
func oneLineError(err error) string {
	var parts []string
	seen := map[string]bool{}
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" || seen[line] {
			continue
		}
		seen[line] = true
		parts = append(parts, line)
	}
	msg := ""
	for i, p := range parts {
		switch {
		case i == 0:
		case strings.HasSuffix(msg, ":"):
			msg += " "
		default:
			msg += "; "
		}
		msg += p
	}
	for strings.HasPrefix(msg, "wharf: ") {
		msg = strings.TrimPrefix(msg, "wharf: ")
	}
	return configFieldRE.ReplaceAllStringFunc(msg, func(m string) string {
		return "--" + kebab(strings.TrimPrefix(m, "Config."))
	})
}

var configFieldRE = regexp.MustCompile(`Config\.[A-Z][A-Za-z]*`)

// kebab turns a Config field name into its flag name: FetchBatch -> fetch-batch.
func kebab(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// globals are the flags every command shares.
type globals struct {
	databaseURL string
	schema      string
	configFile  string
	logLevel    string
	logFormat   string
	stdout      io.Writer
	stderr      io.Writer
	log         *slog.Logger
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "wharf",
		Short: "Wharf: a transactional outbox for PostgreSQL",
		Long: `Wharf delivers messages that applications commit into a PostgreSQL outbox table,
at least once and in order per key, to stdout, files, brokers or webhooks.

Configuration comes from flags, then the environment (WHARF_DATABASE_URL, falling back
to DATABASE_URL; WHARF_SCHEMA), then the YAML file given with --config, whose keys are
the flag names with underscores (database_url, sink, lease_ttl, ...).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.load(cmd)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see wharf --help)", err)}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (env WHARF_DATABASE_URL, then DATABASE_URL)")
	pf.StringVar(&g.schema, "schema", wharfmigrate.DefaultSchema, "schema holding the outbox tables (env WHARF_SCHEMA)")
	pf.StringVar(&g.configFile, "config", "", "YAML configuration file; keys are flag names with underscores")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format on stderr: text or json")

	root.AddCommand(
		newMigrateCmd(g),
		newRelayCmd(g),
		newStatusCmd(g),
		newDeadCmd(g),
		newNotifyCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newVersionCmd(g),
	)
	for _, c := range root.Commands() {
		c.SilenceUsage = true
	}
	return root
}

// load applies the environment and the YAML file to every flag the user did not
// set, then validates the shared settings: one place, errors name the field.
func (g *globals) load(cmd *cobra.Command) error {
	flags := cmd.Flags()
	setIfUnset := func(name, value, source string) error {
		f := flags.Lookup(name)
		if f == nil || f.Changed {
			return nil
		}
		if err := f.Value.Set(value); err != nil {
			return fmt.Errorf("%s: invalid value %q for %s: %w", source, value, name, err)
		}
		// A repeatable flag (--route) takes every value of the file; the
		// flag is marked set once all of them are in.
		f.Changed = !isSliceFlag(f)
		return nil
	}
	for _, env := range []struct{ name, flag string }{
		{"WHARF_DATABASE_URL", "database-url"},
		{"DATABASE_URL", "database-url"},
		{"WHARF_SCHEMA", "schema"},
	} {
		if v := os.Getenv(env.name); v != "" {
			if err := setIfUnset(env.flag, v, "environment variable "+env.name); err != nil {
				return err
			}
		}
	}
	if g.configFile != "" {
		values, err := readConfigFile(g.configFile, cmd.Root())
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(values))
		for k := range values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range values[k] {
				if err := setIfUnset(strings.ReplaceAll(k, "_", "-"), v, "config file "+g.configFile); err != nil {
					return err
				}
			}
		}
	}
	if err := wharfmigrate.ValidateSchema(g.schema); err != nil {
		return usageError{fmt.Errorf("--schema: %w", err)}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: use debug, info, warn or error", g.logLevel)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		g.log = slog.New(slog.NewTextHandler(g.stderr, opts))
	case "json":
		g.log = slog.New(slog.NewJSONHandler(g.stderr, opts))
	default:
		return usageError{fmt.Errorf("--log-format %q: use text or json", g.logFormat)}
	}
	// go-redis logs every failed dial to stderr on its own; the sink reports
	// the failure as a retryable error already, so its lines go to debug.
	redis.SetLogger(redisLogger{g.log})
	return nil
}

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

// readConfigFile reads a flat YAML map and checks every key names a flag of
// some wharf command, so a typo fails instead of being ignored. The one
// structured key is routes: a list of {topic, sink} maps, given to --route.
func readConfigFile(path string, root *cobra.Command) (map[string][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	delete(known, "config")
	delete(known, "help")
	delete(known, "route") // written as routes: in the file
	out := map[string][]string{}
	for k, node := range raw {
		if k == "routes" {
			routes, err := readRoutes(path, &node)
			if err != nil {
				return nil, err
			}
			out["route"] = routes
			continue
		}
		name := strings.ReplaceAll(k, "_", "-")
		if !known[name] {
			return nil, fmt.Errorf("config file %s: line %d: unknown field %q (keys are flag names with underscores, e.g. database_url, sink, lease_ttl, or routes)", path, node.Line, k)
		}
		if node.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("config file %s: line %d: field %q must be a single value", path, node.Line, k)
		}
		out[k] = []string{node.Value}
	}
	return out, nil
}

// readRoutes reads the routes: list, each item {topic: PATTERN, sink: URL},
// as --route values PATTERN=URL, in file order (the first match wins).
func readRoutes(path string, node *yaml.Node) ([]string, error) {
	const want = "routes must be a list of {topic: PATTERN, sink: URL} items, e.g. - {topic: \"orders.*\", sink: \"kafka://127.0.0.1:9092\"}"
	if node.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("config file %s: line %d: %s", path, node.Line, want)
	}
	var out []string
	for _, item := range node.Content {
		var r struct {
			Topic string `yaml:"topic"`
			Sink  string `yaml:"sink"`
		}
		if item.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("config file %s: line %d: %s", path, item.Line, want)
		}
		for i := 0; i+1 < len(item.Content); i += 2 {
			if k := item.Content[i].Value; k != "topic" && k != "sink" {
				return nil, fmt.Errorf("config file %s: line %d: unknown route field %q: a route has topic and sink", path, item.Content[i].Line, k)
			}
		}
		if err := item.Decode(&r); err != nil || r.Topic == "" || r.Sink == "" {
			return nil, fmt.Errorf("config file %s: line %d: a route needs both topic and sink: %s", path, item.Line, want)
		}
		out = append(out, r.Topic+"="+r.Sink)
	}
	return out, nil
}

// isSliceFlag reports whether f accumulates values (a repeatable flag).
func isSliceFlag(f *pflag.Flag) bool {
	t := f.Value.Type()
	return strings.HasSuffix(t, "Slice") || strings.HasSuffix(t, "Array")
}

// connect opens a pool and checks the database answers, with errors that say
// which setting to fix.
func (g *globals) connect(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	if g.databaseURL == "" {
		return nil, usageError{errors.New("no database URL: pass --database-url or set WHARF_DATABASE_URL (or DATABASE_URL)")}
	}
	cfg, err := pgxpool.ParseConfig(g.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL is malformed: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database at %s:%d: %s (check --database-url / WHARF_DATABASE_URL)", cfg.ConnConfig.Host, cfg.ConnConfig.Port, oneLineError(err))
	}
	return pool, nil
}

// throwawayDatabase starts a private PostgreSQL (fsync on, for honest
// numbers) when no database URL was given, points g.databaseURL at it and
// returns the function that removes it; with a URL it does nothing.
func (g *globals) throwawayDatabase(ctx context.Context) (started bool, stop func(), err error) {
	if g.databaseURL != "" {
		return false, func() {}, nil
	}
	dir, err := pgembed.FindBinaries()
	if err != nil {
		return false, nil, err
	}
	fmt.Fprintf(g.stderr, "No database URL given: starting a throwaway PostgreSQL (fsync on) from %s ...\n", dir)
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cluster, err := pgembed.Start(startCtx, pgembed.Options{Fsync: true, Logger: g.log})
	cancel()
	if err != nil {
		return false, nil, err
	}
	g.databaseURL = cluster.URL()
	return true, func() {
		if err := cluster.Stop(); err != nil {
			g.log.Warn("wharf: removing the throwaway PostgreSQL failed", "err", err)
		}
	}, nil
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the wharf version",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			v := Version
			goVersion := ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
				if v == "" {
					v = bi.Main.Version
				}
			}
			if v == "" || v == "(devel)" {
				v = "dev"
			}
			fmt.Fprintf(g.stdout, "wharf %s (%s, schema version %d)\n", v, goVersion, latestMigration())
			return nil
		},
	}
}

func latestMigration() int {
	m, err := wharfmigrate.New(wharfmigrate.DefaultSchema)
	if err != nil {
		return 0
	}
	return m.Latest()
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}
