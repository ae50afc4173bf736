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
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
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

// Version is the release version of a release build: scripts/build-release.sh
// and the Dockerfile set it from the VERSION file with -ldflags
// "-X github.com/wharfhq/wharf/internal/cli.Version=0.1.0". Any other build
// leaves it empty and is a development build.
var Version = ""

// usageError marks a mistake in the command line itself (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// Main runs the CLI with args and returns the process exit status: 0 on
// success, 1 on failure, 2 on a usage error. Errors are one line on stderr.
// Confirmation questions (`wharf dead purge`, `wharf outbox cancel`) read the
// answer from standard input when it is a terminal.
func Main(args []string, stdout, stderr io.Writer) int {
	return mainWith(args, ioStreams{stdin: os.Stdin, stdout: stdout, stderr: stderr, terminal: stdinIsTerminal()})
}

// ioStreams are the process's streams; tests pass their own.
type ioStreams struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// terminal: stdin is a terminal, so a question can be answered.
	terminal bool
}

func stdinIsTerminal() bool {
	fi, err := os.Stdin.Stat()
	return err == nil && isTerminal(fi)
}

// isTerminal reports whether a file is a terminal: a character device other
// than /dev/null (which scripts redirect from, and nobody answers through).
func isTerminal(fi os.FileInfo) bool {
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return true
}

func mainWith(args []string, streams ioStreams) int {
	root, g := newRootWith(streams)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	if m := unknownCommandRE.FindStringSubmatch(err.Error()); m != nil {
		// Cobra's own wording spans lines ("Did you mean this?" and a list).
		parent := root
		if c, _, ferr := root.Find(strings.Fields(m[2])[1:]); ferr == nil {
			parent = c
		}
		err = unknownCommand(parent, m[1])
	}
	code := 1
	var ue usageError
	if errors.As(err, &ue) {
		code = 2
	}
	msg := "wharf: " + oneLineError(err)
	if g.logFormat == "json" && g.log != nil {
		// Log collectors parse every stderr line as JSON: the fatal
		// error too.
		g.log.Error(msg, "exit_code", code)
	} else {
		fmt.Fprintln(streams.stderr, msg)
	}
	return code
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

// kebab turns a Config field name into its flag name: FetchBatch ->
// fetch-batch, LeaseTTL -> lease-ttl, RelayID -> relay-id.
func kebab(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) {
			// A word starts at an upper-case letter after a lower-case one,
			// or at the last capital of an acronym followed by lower case.
			if i > 0 && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))) {
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
	stdin       io.Reader
	stdout      io.Writer
	stderr      io.Writer
	terminal    bool
	log         *slog.Logger
	// sources names where each setting not given as a flag came from
	// (an environment variable or the config file), for error messages and
	// `wharf config validate`.
	sources map[string]string
}

func newRoot(streams ioStreams) *cobra.Command {
	root, _ := newRootWith(streams)
	return root
}

// newRootWith is newRoot with the globals the commands fill in.
func newRootWith(streams ioStreams) (*cobra.Command, *globals) {
	g := &globals{stdin: streams.stdin, stdout: streams.stdout, stderr: streams.stderr, terminal: streams.terminal, sources: map[string]string{}}
	stdout, stderr := streams.stdout, streams.stderr
	root := &cobra.Command{
		Use:   "wharf",
		Short: "Wharf: a transactional outbox for PostgreSQL",
		Long: `Wharf delivers messages that applications commit into a PostgreSQL outbox table,
at least once and in order per key, to stdout, files, brokers or webhooks.

Settings (the flags whose help names a WHARF_ variable) come from, in this order:
  1. the command line:           --max-attempts 8
  2. the environment:            WHARF_MAX_ATTEMPTS=8 (WHARF_ and the flag name in upper
                                 case with underscores; the database URL also falls back
                                 to DATABASE_URL; --route has no variable)
  3. the YAML file (--config FILE, or WHARF_CONFIG): max_attempts: 8 (the flag name with
                                 underscores; routes: a list of {topic, sink})
  4. the default shown in the help.
Values out of range are refused with the range. 'wharf config validate' checks the
whole configuration and that the database and every sink answer.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.load(cmd)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if m := badFlagValueRE.FindStringSubmatch(err.Error()); m != nil {
			if f := c.Flags().Lookup(m[2]); f != nil {
				return usageError{fmt.Errorf("invalid value %q for --%s: %s (see wharf --help)", m[1], m[2], wantValue(f, err))}
			}
		}
		return usageError{fmt.Errorf("%w (see wharf --help)", err)}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL or key=value connection string")
	pf.StringVar(&g.schema, "schema", wharfmigrate.DefaultSchema, "schema holding the outbox tables")
	pf.StringVar(&g.configFile, "config", "", "YAML configuration file; keys are setting names with underscores [WHARF_CONFIG]")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format on stderr: text or json")
	markSettings(pf, "database-url", "schema", "log-level", "log-format")

	root.AddCommand(
		newMigrateCmd(g),
		newRelayCmd(g),
		newStatusCmd(g),
		newOutboxCmd(g),
		newDeadCmd(g),
		newNotifyCmd(g),
		newConfigCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newVersionCmd(g),
		newConsoleCmd(g),
		newFlowCmd(g),
	)
	for _, c := range root.Commands() {
		c.SilenceUsage = true
	}
	refuseUnknownSubcommands(root)
	return root, g
}

// refuseUnknownSubcommands makes every command that only groups others
// (wharf outbox, wharf dead, ...) refuse an argument that names none of them,
// with a usage error (exit 2) and one "did you mean" line, instead of printing
// its help and exiting 0. Without arguments it prints its help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
	if cmd.Runnable() || !cmd.HasSubCommands() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		return unknownCommand(c, args[0])
	}
}

// unknownCommand is the one-line error for a subcommand that does not exist.
func unknownCommand(parent *cobra.Command, name string) error {
	var names []string
	for _, c := range parent.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	msg := fmt.Sprintf("unknown command %q for %q", name, parent.CommandPath())
	if parent.SuggestionsMinimumDistance <= 0 {
		parent.SuggestionsMinimumDistance = 2
	}
	if s := parent.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf(": did you mean %s?", strings.Join(s, " or "))
	} else {
		msg += ": it takes " + strings.Join(names, ", ")
	}
	return usageError{errors.New(msg + " (see " + parent.CommandPath() + " --help)")}
}

// unknownCommandRE matches cobra's error for an unknown command of the root.
var unknownCommandRE = regexp.MustCompile(`^unknown command "([^"]*)" for "([^"]*)"`)

// load applies the environment and the YAML file to every setting the user
// did not give as a flag, then validates the shared settings: one place,
// errors name the field and where its value came from.
func (g *globals) load(cmd *cobra.Command) error {
	flags := cmd.Flags()
	setIfUnset := func(name, value, source string) error {
		f := flags.Lookup(name)
		if f == nil || f.Changed || !isSetting(f) {
			return nil
		}
		if err := f.Value.Set(value); err != nil {
			return fmt.Errorf("%s: invalid value %q for %s: %s", source, value, name, wantValue(f, err))
		}
		// A repeatable flag (--route) takes every value of the file; the
		// flag is marked set once all of them are in.
		f.Changed = !isSliceFlag(f)
		g.sources[name] = source
		return nil
	}
	var envErr error
	flags.VisitAll(func(f *pflag.Flag) {
		if envErr != nil || !isSetting(f) || isSliceFlag(f) {
			return
		}
		for _, env := range envNames(f.Name) {
			if v, ok := os.LookupEnv(env); ok && v != "" {
				envErr = setIfUnset(f.Name, v, "environment variable "+env)
				return
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if !flags.Changed("config") {
		if v := os.Getenv("WHARF_CONFIG"); v != "" {
			g.configFile = v
		}
	}
	if g.configFile != "" {
		values, err := readConfigFile(g.configFile, cmd.Root())
		if err != nil {
			return err
		}
		lines := configLines(g.configFile)
		keys := make([]string, 0, len(values))
		for k := range values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range values[k] {
				source := "config file " + g.configFile
				if n := lines[k]; n > 0 {
					source += fmt.Sprintf(" line %d", n)
				}
				if err := setIfUnset(strings.ReplaceAll(k, "_", "-"), v, source); err != nil {
					return err
				}
			}
		}
	}
	if err := wharfmigrate.ValidateSchema(g.schema); err != nil {
		return usageError{fmt.Errorf("--schema%s: %w", g.from("schema"), err)}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q%s: use debug, info, warn or error", g.logLevel, g.from("log-level"))}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		g.log = slog.New(slog.NewTextHandler(g.stderr, opts))
	case "json":
		g.log = slog.New(slog.NewJSONHandler(g.stderr, opts))
	default:
		return usageError{fmt.Errorf("--log-format %q%s: use text or json", g.logFormat, g.from("log-format"))}
	}
	// go-redis logs every failed dial to stderr on its own.
	silenceRedisLogger()
	return nil
}

// from says where a setting's value came from when it was not a flag, for
// error messages: " (from environment variable WHARF_X)".
func (g *globals) from(name string) string {
	if src, ok := g.sources[name]; ok {
		return " (from " + src + ")"
	}
	return ""
}

// settingAnnotation marks the flags that are settings: read from the
// environment and the config file as well. Actions and selections (--yes,
// --force, --all, --id, ...) are not, so no environment variable or file can
// confirm a purge.
const settingAnnotation = "wharf_setting"

// markSettings marks flags as settings and says in their help where else
// they can be set.
func markSettings(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, settingAnnotation, []string{"true"}); err != nil {
			panic(err) // a misspelt flag name: a programming error
		}
		f := fs.Lookup(n)
		if n == "route" {
			continue // its help says: YAML routes
		}
		f.Usage += " [" + strings.Join(envNames(n), ", ") + "; YAML " + strings.ReplaceAll(n, "-", "_") + "]"
	}
}

func isSetting(f *pflag.Flag) bool { return len(f.Annotations[settingAnnotation]) > 0 }

// envNames are the environment variables a setting is read from, in order.
func envNames(flag string) []string {
	names := []string{"WHARF_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
	if flag == "database-url" {
		names = append(names, "DATABASE_URL")
	}
	return names
}

// go-redis has one process-wide logger, which its background dialers write
// to long after the command that opened the client returned. Its lines (a
// failed dial, a pool retry) repeat what the Redis sink already reports as a
// retryable error, so they are dropped: routing them to a command's logger
// would send one command's lines to another's streams when commands run in
// one process (tests, programs embedding the CLI).
var redisLoggerOnce sync.Once

func silenceRedisLogger() {
	redisLoggerOnce.Do(func() { redis.SetLogger(discardRedisLogger{}) })
}

type discardRedisLogger struct{}

func (discardRedisLogger) Printf(context.Context, string, ...any) {}

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
		return nil, fmt.Errorf("config file %s: %w%s", path, err, yamlHint(data, err))
	}
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		mark := func(f *pflag.Flag) {
			if isSetting(f) {
				known[f.Name] = true
			}
		}
		c.Flags().VisitAll(mark)
		c.PersistentFlags().VisitAll(mark)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
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
			return nil, fmt.Errorf("config file %s: line %d: unknown field %q (keys are setting names with underscores, e.g. database_url, sink, lease_ttl, or routes; see wharf relay --help)", path, node.Line, k)
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
	cfg, err := g.parseDatabaseURL()
	if err != nil {
		return nil, err
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

// parseDatabaseURL parses the database URL with errors that name the flag
// and say what is wrong. pgx reads a value that is not a postgres:// or
// postgresql:// URL as key=value pairs, so a mistyped scheme (postgress://)
// would fail as "invalid keyword/value", its user name hidden as if it were a
// password: such a value is refused for its scheme, and one that is neither
// a URL nor key=value pairs is refused without echoing it.
func (g *globals) parseDatabaseURL() (*pgxpool.Config, error) {
	raw := g.databaseURL
	flag := "--database-url" + g.from("database-url")
	if scheme, _, ok := strings.Cut(raw, "://"); ok && !strings.ContainsAny(scheme, " =") {
		if scheme != "postgres" && scheme != "postgresql" {
			return nil, usageError{fmt.Errorf("%s: unknown scheme %q: use postgres:// or postgresql:// (or a key=value connection string)", flag, scheme)}
		}
	} else if !ok && !strings.Contains(raw, "=") {
		return nil, usageError{fmt.Errorf("%s is neither a URL nor a key=value connection string: use postgres://USER:PASSWORD@HOST:PORT/DATABASE or host=HOST user=USER dbname=DATABASE", flag)}
	}
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		// pgx's message echoes the value with its password hidden.
		return nil, usageError{fmt.Errorf("%s is malformed: %w", flag, err)}
	}
	return cfg, nil
}

// throwawayDatabase starts a private PostgreSQL (fsync on, for honest
// numbers) when no database URL was given, points g.databaseURL at it and
// returns the function that removes it; with a URL it does nothing.
func (g *globals) throwawayDatabase(ctx context.Context) (started bool, stop func(), err error) {
	return g.throwawayDatabaseWith(ctx, nil)
}

// throwawayDatabaseWith is throwawayDatabase with extra server settings
// (pgembed.Options.Settings), given those of the libraries to load.
func (g *globals) throwawayDatabaseWith(ctx context.Context, settings func(binDir string) map[string]string) (started bool, stop func(), err error) {
	if g.databaseURL != "" {
		// The commands that hand the URL on (wharf bench) check it here,
		// as connect does for the others.
		if _, err := g.parseDatabaseURL(); err != nil {
			return false, nil, err
		}
		return false, func() {}, nil
	}
	dir, err := pgembed.FindBinaries()
	if err != nil {
		return false, nil, err
	}
	fmt.Fprintf(g.stderr, "No database URL given: starting a throwaway PostgreSQL (fsync on) from %s ...\n", dir)
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	opts := pgembed.Options{Fsync: true, Logger: g.log}
	if settings != nil {
		opts.Settings = settings(dir)
	}
	cluster, err := pgembed.Start(startCtx, opts)
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
		Short: "Print the wharf version, the source revision it was built from and the schema version it needs",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(g.stdout, versionLine(debug.ReadBuildInfo()))
			return nil
		},
	}
}

// versionLine describes the build: its version, the VCS revision and time
// when the build recorded them, the Go version and platform, and the schema
// version this build needs. The version is Version in a release build, else
// the module version `go install ...@v1.2.3` stamps; any other build (go build
// or go run in a checkout, which stamps a pseudo-version, or a tree without
// VCS, "(devel)") says it is a development build.
func versionLine(bi *debug.BuildInfo, ok bool) string {
	v := moduleVersionOf(bi, ok)
	var details []string
	if !isRelease(v) {
		details = append(details, "development build")
	}
	goVersion := runtime.Version()
	if ok && bi != nil {
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if rev := settings["vcs.revision"]; rev != "" {
			d := "revision " + rev
			if len(rev) > 12 {
				d = "revision " + rev[:12]
			}
			if t := settings["vcs.time"]; t != "" {
				d += " " + t
			}
			if settings["vcs.modified"] == "true" {
				d += " (modified)"
			}
			details = append(details, d)
		}
	}
	details = append(details, goVersion+" "+runtime.GOOS+"/"+runtime.GOARCH, fmt.Sprintf("schema version %d", latestMigration()))
	return fmt.Sprintf("wharf %s (%s)", v, strings.Join(details, ", "))
}

// moduleVersion is this build's version: the -X override, else the module
// version the build recorded, else "(devel)".
func moduleVersion() string { return moduleVersionOf(debug.ReadBuildInfo()) }

func moduleVersionOf(bi *debug.BuildInfo, ok bool) string {
	if Version != "" {
		return Version
	}
	if ok && bi != nil && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// releaseVersion is a semantic version, with or without its "v", that is
// not a Go pseudo-version (v0.0.0-20261207213000-0123456789ab, what a build
// in a checkout stamps) nor marked +dirty.
var (
	releaseVersion = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	pseudoVersion  = regexp.MustCompile(`[0-9]{14}-[0-9a-f]{12}$`)
)

func isRelease(v string) bool { return releaseVersion.MatchString(v) && !pseudoVersion.MatchString(v) }

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
