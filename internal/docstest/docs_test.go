package docstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/build"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"

	"github.com/wharfhq/wharf/internal/cli"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfflow"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// maxSkips is how many `docs-test: skip` blocks the whole repo may have.
const maxSkips = 5

// repoRoot is the module's root, from this package's directory.
const repoRoot = "../.."

var (
	databaseURL string
	databaseErr error
)

func TestMain(m *testing.M) {
	databaseURL = os.Getenv("TEST_DATABASE_URL")
	var cluster *pgembed.Cluster
	if databaseURL == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var err error
		cluster, err = pgembed.Start(ctx, pgembed.Options{})
		cancel()
		if err != nil {
			databaseErr = fmt.Errorf("TEST_DATABASE_URL is not set and no local PostgreSQL could be started: %w", err)
		} else {
			databaseURL = cluster.URL()
		}
	}
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop()
	}
	os.Exit(code)
}

// supportedTags are the language tags the harness knows, and what it does
// with each.
var supportedTags = map[string]string{
	"go":      "compiled: found in a .go file of the module",
	"sql":     "run against schema wharf",
	"sh":      "commands checked",
	"bash":    "commands checked",
	"console": "commands ($ lines) checked, the rest is output",
	"text":    "not checked",
	"yaml":    "parsed (Prometheus rules: promtool check rules)",
	"yml":     "parsed (Prometheus rules: promtool check rules)",
	"json":    "parsed",
	"promql":  "promtool checks the expression",
}

func tagList() string {
	var tags []string
	for t := range supportedTags {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	return strings.Join(tags, ", ")
}

// markdownFiles are README.md and every .md file under docs/, relative to
// the repo root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(repoRoot, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files[1:])
	return files
}

type skipped struct {
	where, reason string
}

// TestDocsCodeBlocks checks every code block of README.md and docs/**/*.md
// (the docs-check; it runs in `go test ./...`). To run it alone:
//
//	TEST_DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	  go test -count=1 -run TestDocsCodeBlocks ./internal/docstest
//
// (-run 'TestDocsCodeBlocks/README.md' for one file). docs/cli.md is
// generated (make docs) and checked like the rest, and TestCLIReferenceIsCurrent
// fails when it is stale.
//
// Each failure is "file:line: what is wrong: what to do". The rules, by the
// block's language tag:
//
//   - go: the block's lines (common indentation removed; blank lines and
//     leading whitespace ignored) must appear as a contiguous run in a .go
//     file that `go test ./...` compiles: write the code in an Example
//     function or an example_doc_<topic>_test.go file first, then paste it.
//   - sql: run in document order, per file, in one session, on a database
//     of its own (docs_<random>, created for the file and dropped after) with
//     schema wharf migrated to the head and the README's checkout flow
//     registered (a runner started and stopped: definitions written, no step
//     runs). A block is sent as one query string, as psql -c would. A block
//     preceded by `<!-- docs-test: error -->` must fail, and must not leave
//     the session in a failed transaction. After an unexpected failure the
//     test rolls back, so the next blocks are checked on their own. The
//     database of its own keeps schema wharf free of other tests.
//   - sh, bash, console: each command (console: the lines starting "$ ") is
//     checked: wharf, ./wharf and `go run ./cmd/wharf` command lines are
//     parsed by the real command tree (cli.CheckArgs: commands, flags, flag
//     values and argument counts; not what a command checks when it runs),
//     make targets must exist in the Makefile, paths
//     given to go run/build/test must exist, `go test` flags must be go
//     test's, and other programs must be in knownPrograms.
//   - yaml, yml, json: must parse. A YAML block holding Prometheus rules
//     (groups: ... rules:) and a promql block are checked by
//     `promtool check rules`.
//   - text: not checked.
//
// `<!-- docs-test: skip (reason) -->` before a block skips it; the test logs
// every skip and fails when there are more than maxSkips.
//
// Without TEST_DATABASE_URL the test starts a throwaway PostgreSQL from the
// local server binaries. Without either, each file's sql subtest is skipped
// for lack of a tool (internal/testtool), and so is its promtool subtest
// without promtool; with CI=true both fail instead.
func TestDocsCodeBlocks(t *testing.T) {
	var (
		mu    sync.Mutex
		skips []skipped
	)
	for _, file := range markdownFiles(t) {
		t.Run(file, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(repoRoot, file))
			if err != nil {
				t.Fatal(err)
			}
			fail := failer(t, file)
			var sqlBlocks []Block
			var rules []promRules // checked by promtool after the other blocks
			for _, b := range ParseMarkdown(string(src)) {
				if b.DirectiveErr != "" {
					fail(b.Line, "%s", b.DirectiveErr)
					continue
				}
				if b.Unclosed {
					fail(b.Line, "the code block is never closed: end it with a fence like the one that opens it")
					continue
				}
				if b.Directive == "skip" {
					mu.Lock()
					skips = append(skips, skipped{fmt.Sprintf("%s:%d", file, b.Line), b.Reason})
					mu.Unlock()
					continue
				}
				if b.Directive == "error" && b.Tag != "sql" {
					fail(b.Line, "`<!-- docs-test: error -->` is for sql blocks that must fail; this block is tagged %q: remove the comment", b.Tag)
				}
				switch b.Tag {
				case "":
					what := "code block"
					if b.Indented {
						what = "indented code block (four spaces)"
					}
					fail(b.Line, "%s has no language tag; make it a fenced block tagged go, sql, sh, console, text… (supported: %s)", what, tagList())
				case "go":
					if msg := checkGo(t, b); msg != "" {
						fail(b.Line, "%s", msg)
					}
				case "sql":
					sqlBlocks = append(sqlBlocks, b)
				case "sh", "bash", "console":
					cmds, problems := ShellCommands(b)
					for _, p := range problems {
						fail(p.Line, "%s", p.Msg)
					}
					for _, c := range cmds {
						if msg := checkCommandLine(c.Text); msg != "" {
							fail(c.Line, "`%s`: %s", c.Text, msg)
						}
					}
				case "text":
				case "yaml", "yml":
					msg, r := checkYAML(b)
					if msg != "" {
						fail(b.Line, "%s", msg)
					} else if r != "" {
						rules = append(rules, promRules{b.Line, "Prometheus rules", r})
					}
				case "json":
					if msg := checkJSON(b); msg != "" {
						fail(b.Line, "%s", msg)
					}
				case "promql":
					rules = append(rules, promRules{b.Line, "PromQL expression", promQLRules(b)})
				default:
					fail(b.Line, "unknown language tag %q: the docs test checks %s (text is not checked; use it only for output, diagrams and tables of values)", b.Tag, tagList())
				}
			}
			if len(sqlBlocks) > 0 {
				t.Run("sql", func(t *testing.T) { runSQL(t, file, sqlBlocks, failer(t, file)) })
			}
			if len(rules) > 0 {
				t.Run("promtool", func(t *testing.T) { checkRules(t, rules, failer(t, file)) })
			}
		})
	}
	for _, s := range skips {
		t.Logf("skipped: %s (%s)", s.where, s.reason)
	}
	if len(skips) > maxSkips {
		t.Errorf("%d blocks are skipped with `docs-test: skip`, at most %d may be: make some of them checkable", len(skips), maxSkips)
	}
}

// failer reports "file:line: message" as an error of t.
func failer(t *testing.T, file string) func(line int, format string, args ...any) {
	return func(line int, format string, args ...any) {
		t.Helper()
		t.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
	}
}

// ---- go ----

// goLines is a compiled .go file's lines, trimmed, without blank lines.
type goFile struct {
	path  string
	lines []string
	nums  []int // the file line of each entry of lines
}

var goCorpus struct {
	once  sync.Once
	files []goFile
	err   error
}

// compiledGoFiles reads every .go file of the module that `go test ./...`
// compiles on this platform: not under testdata, vendor, directories
// starting with . or _, or nested modules; build constraints satisfied.
func compiledGoFiles() ([]goFile, error) {
	goCorpus.once.Do(func() {
		ctx := build.Default
		goCorpus.err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() {
				if path == repoRoot {
					return nil
				}
				if name == "testdata" || name == "vendor" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(name, ".go") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return nil
			}
			if ok, err := ctx.MatchFile(filepath.Dir(path), name); err != nil || !ok {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, path)
			f := goFile{path: filepath.ToSlash(rel)}
			for i, l := range strings.Split(string(data), "\n") {
				if l = strings.TrimSpace(l); l != "" {
					f.lines = append(f.lines, l)
					f.nums = append(f.nums, i+1)
				}
			}
			goCorpus.files = append(goCorpus.files, f)
			return nil
		})
	})
	return goCorpus.files, goCorpus.err
}

// checkGo finds the block in a compiled file; the message, when it is not
// found, names the longest prefix found and the first line missing.
func checkGo(t *testing.T, b Block) string {
	files, err := compiledGoFiles()
	if err != nil {
		t.Fatalf("reading the module's .go files: %v", err)
	}
	var want []string
	var wantLine []int
	for i, l := range b.Body {
		if l = strings.TrimSpace(l); l != "" {
			want = append(want, l)
			wantLine = append(wantLine, b.BodyLine+i)
		}
	}
	if len(want) == 0 {
		return "empty go block: remove it"
	}
	best, bestFile, bestAt := 0, "", 0
	for _, f := range files {
		for i := range f.lines {
			n := 0
			for n < len(want) && i+n < len(f.lines) && f.lines[i+n] == want[n] {
				n++
			}
			if n == len(want) {
				return ""
			}
			if n > best {
				best, bestFile, bestAt = n, f.path, f.nums[i]
			}
		}
	}
	how := "write the code in a compiled .go file first (an Example function, or example_doc_<topic>_test.go in the package), then paste it here unchanged"
	if best == 0 {
		return fmt.Sprintf("go block is not compiled code: its first line %q is in no .go file of the module; %s", want[0], how)
	}
	prefix := fmt.Sprintf("its first %d lines match", best)
	if best == 1 {
		prefix = "its first line matches"
	}
	return fmt.Sprintf("go block is not compiled code: %s %s:%d, but its line %d (%q) does not follow there; %s",
		prefix, bestFile, bestAt, wantLine[best], want[best], how)
}

// ---- sql ----

// Order and Parcel are the README's checkout types.
type Order struct {
	ID      string   `json:"id"`
	Items   []string `json:"items"`
	Shipped []string `json:"shipped"`
}

type Parcel struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

// checkoutFlows are the README's checkout flow and its shipping child flow
// (wharfflow/example_checkout_test.go), as far as their registration goes:
// the flows' names and steps, in order. Keep them in step with the README.
func checkoutFlows() []wharfflow.Definition {
	shipping := wharfflow.New[Parcel]("shipping", nil).
		Step("ship", func(ctx context.Context, p *Parcel, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(p.Item)
		})
	checkout := wharfflow.New[Order]("checkout", nil).
		Step("reserve", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Await("paid", "payment-captured").Deadline(time.Now().Add(time.Hour), "expire")
		}).
		Step("paid", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			var parcels []wharfflow.Child
			for _, item := range o.Items {
				parcels = append(parcels, shipping.Child(Parcel{Order: o.ID, Item: item}, wharfflow.Options{}))
			}
			return wharfflow.Spawn("shipped", parcels...)
		}).
		Step("shipped", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Done(o)
		}).
		Step("expire", func(ctx context.Context, o *Order, in wharfflow.Input) wharfflow.Outcome {
			return wharfflow.Fail(errors.New("no payment within an hour"))
		})
	return []wharfflow.Definition{checkout, shipping}
}

// freshDatabase creates database docs_<random> on the test server, with
// schema wharf migrated to the head and the checkout flow registered (a
// runner started and stopped: the definitions stay, no step runs), and
// returns its URL; it is dropped at cleanup.
func freshDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatalf("connecting to TEST_DATABASE_URL: %v", err)
	}
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	name := "docs_" + hex.EncodeToString(rb[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m, err := wharfmigrate.New(wharfmigrate.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		t.Fatalf("migrating schema wharf: %v", err)
	}
	r, err := wharfflow.NewRunner(pool, &wharfflow.Config{
		Schema: wharfmigrate.DefaultSchema, Flows: checkoutFlows(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("registering the checkout flow: %v", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("stopping the checkout runner: %v", err)
	}
	return u.String()
}

// runSQL runs a file's sql blocks in order in one session.
func runSQL(t *testing.T, file string, blocks []Block, fail func(int, string, ...any)) {
	if databaseErr != nil {
		testtool.Missing(t, "PostgreSQL", fmt.Sprintf("runs the %d sql blocks of %s: %v", len(blocks), file, databaseErr))
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, freshDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET statement_timeout = '10s'; SET lock_timeout = '5s'"); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		sql := strings.Join(b.Body, "\n")
		_, err := conn.Exec(ctx, sql)
		failedTx := conn.PgConn().TxStatus() == 'E'
		switch {
		case b.Directive == "error" && err == nil:
			fail(b.Line, "the sql block is marked `<!-- docs-test: error -->` but ran without error: make it fail as the text says, or remove the comment")
		case b.Directive == "error" && failedTx:
			fail(b.Line, "the sql block fails as marked (%s) but leaves the session in a failed transaction, so a reader's next statements fail too: make the block the one failing statement, outside BEGIN ... COMMIT", sqlError(err))
		case b.Directive == "error":
			t.Logf("%s:%d: fails as marked: %s", file, b.Line, sqlError(err))
		case err != nil:
			hint := ""
			for _, l := range b.Body {
				if strings.HasPrefix(strings.TrimSpace(l), `\`) {
					hint = " (psql meta-commands such as \\d are not SQL: show them in a console block, `$ psql -c '\\d wharf.outbox'`)"
				}
			}
			fail(sqlErrorLine(b, sql, err), "sql block (run in order after the file's earlier blocks, on schema wharf with the checkout flow registered) fails: %s; fix it so it runs, or put `<!-- docs-test: error -->` before it if it is meant to fail%s", sqlError(err), hint)
		}
		if failedTx {
			// Reported above; roll back so that the next blocks are
			// checked on their own.
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func sqlError(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		s := pg.Message + " (SQLSTATE " + pg.Code + ")"
		if pg.Hint != "" {
			s += "; hint: " + pg.Hint
		}
		return s
	}
	return err.Error()
}

// sqlErrorLine is the file line of the error's position in the block, or
// the block's fence line.
func sqlErrorLine(b Block, sql string, err error) int {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Position > 0 {
		rs := []rune(sql)
		if int(pg.Position) <= len(rs) {
			return b.BodyLine + strings.Count(string(rs[:pg.Position-1]), "\n")
		}
	}
	return b.Line
}

// ---- yaml, json, promql ----

// checkYAML parses a yaml block; rules is the block when it holds
// Prometheus rules, for promtool.
func checkYAML(b Block) (msg, rules string) {
	src := strings.Join(b.Body, "\n")
	dec := yaml.NewDecoder(strings.NewReader(src))
	var docs []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Sprintf("yaml block does not parse: %v (yaml line N is file line %d+N-1)", err, b.BodyLine), ""
		}
		docs = append(docs, v)
	}
	if len(docs) == 1 && isPrometheusRules(docs[0]) {
		return "", src
	}
	return "", ""
}

func isPrometheusRules(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	groups, ok := m["groups"].([]any)
	if !ok || len(groups) == 0 {
		return false
	}
	g, ok := groups[0].(map[string]any)
	_, hasRules := g["rules"]
	return ok && hasRules
}

func checkJSON(b Block) string {
	dec := json.NewDecoder(strings.NewReader(strings.Join(b.Body, "\n")))
	n := 0
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "json block does not parse: " + err.Error() + ": make it valid JSON (no comments, no `...`), or tag it text if it is not JSON"
		}
		n++
	}
	if n == 0 {
		return "empty json block: remove it"
	}
	return ""
}

// promQLRules is a rules file recording the block's expression.
func promQLRules(b Block) string {
	expr := strings.TrimSpace(strings.Join(b.Body, "\n"))
	rules, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{
		"name": "docs", "rules": []any{map[string]any{"record": "docs:expr", "expr": expr}},
	}}})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return string(rules)
}

// promRules is a block for `promtool check rules`.
type promRules struct {
	line  int
	what  string
	rules string
}

// checkRules runs `promtool check rules` on each; without promtool the
// subtest is skipped (failed under CI=true) through testtool.
func checkRules(t *testing.T, rules []promRules, fail func(int, string, ...any)) {
	path := testtool.Path(t, "promtool", "checks the Prometheus rules and PromQL in the docs: apt-get install prometheus")
	for i, r := range rules {
		f := filepath.Join(t.TempDir(), fmt.Sprintf("rules%d.yaml", i))
		if err := os.WriteFile(f, []byte(r.rules), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(path, "check", "rules", f).CombinedOutput(); err != nil {
			fail(r.line, "promtool check rules fails on the %s: %s", r.what, strings.Join(strings.Fields(string(out)), " "))
		}
	}
}

// ---- sh, bash, console ----

// knownPrograms may appear in shell blocks; they are not checked further.
var knownPrograms = map[string]bool{}

func init() {
	for _, p := range strings.Fields(`
		apt apt-get awk aws base64 brew cat cd chmod chown cp createdb createuser curl cut date diff
		docker docker-compose dropdb echo env export false find gcloud git grep gunzip gzip head helm
		jq kafka-console-consumer kafka-topics kcat kill kubectl less ln ls mkdir mosquitto_pub
		mosquitto_sub mv nats nc npm npx openssl pg_basebackup pg_ctl pg_dump pg_isready pg_restore
		pgbench printf promtool ps psql rabbitmqadmin rabbitmqctl redis-cli rm sed seq set sleep sort
		source ssh systemctl tail tar tee test touch tr true uniq unset unzip wait watch wc wget which
		xargs yq`) {
		knownPrograms[p] = true
	}
}

// wrappers run the command that follows them.
var wrappers = map[string]bool{"sudo": true, "time": true, "nohup": true, "exec": true, "command": true}

// shellKeywords may start a simple command; what follows is checked.
var shellKeywords = map[string]bool{"if": true, "then": true, "else": true, "elif": true, "do": true, "while": true, "until": true, "!": true, "{": true}

var assignmentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// checkCommandLine checks each simple command of a line; "" when all pass.
func checkCommandLine(line string) string {
	cmds, err := SimpleCommands(line)
	if err != nil {
		return "the line does not parse as a shell command: " + err.Error()
	}
	for i, words := range cmds {
		if msg := checkWords(words); msg != "" {
			if i > 0 {
				msg += " (it follows a |, ;, & or && on the line; to show alternatives, write each command on its own line)"
			}
			return msg
		}
	}
	return ""
}

func checkWords(words []string) string {
	for len(words) > 0 && (assignmentRE.MatchString(words[0]) || shellKeywords[words[0]]) {
		words = words[1:]
	}
	if len(words) == 0 {
		return ""
	}
	prog, args := words[0], words[1:]
	switch {
	case prog == "fi" || prog == "done" || prog == "esac" || prog == "}" || prog == "for" || prog == "case":
		return ""
	case wrappers[prog]:
		for len(args) > 0 && strings.HasPrefix(args[0], "-") {
			args = args[1:]
		}
		return checkWords(args)
	case prog == "wharf" || prog == "./wharf" || strings.HasSuffix(prog, "/wharf"):
		return checkWharf(args)
	case prog == "go":
		return checkGoCommand(args)
	case prog == "make":
		return checkMake(args)
	case prog == "sh" || prog == "bash":
		for _, a := range args {
			if a == "-c" {
				return ""
			}
			if !strings.HasPrefix(a, "-") {
				if _, err := os.Stat(filepath.Join(repoRoot, a)); err != nil && !strings.HasPrefix(a, "$") && !filepath.IsAbs(a) {
					return fmt.Sprintf("%s %s: %s is not a file of the repository: correct the path", prog, a, a)
				}
				return ""
			}
		}
		return ""
	case strings.Contains(prog, "/"):
		if strings.HasPrefix(prog, "$") || strings.HasPrefix(prog, "~") || strings.HasPrefix(prog, "/") {
			return ""
		}
		if _, err := os.Stat(filepath.Join(repoRoot, prog)); err != nil {
			return fmt.Sprintf("%s is not a file of the repository: correct the path", prog)
		}
		return ""
	case knownPrograms[prog]:
		return ""
	case strings.HasPrefix(prog, "$"):
		return "" // a program named by a variable
	}
	return fmt.Sprintf("unknown program %q: correct it, or, if it is a real tool the docs need, add it to knownPrograms in internal/docstest/docs_test.go", prog)
}

func checkWharf(args []string) string {
	if err := cli.CheckArgs(args); err != nil {
		return "wharf " + strings.Join(args, " ") + " would fail: " + err.Error()
	}
	return ""
}

// goValueFlags are the go command's build flags that take a value.
var goValueFlags = map[string]bool{
	"o": true, "p": true, "tags": true, "ldflags": true, "gcflags": true, "asmflags": true, "mod": true,
	"modfile": true, "pkgdir": true, "overlay": true, "pgo": true, "exec": true, "C": true,
	"buildmode": true, "compiler": true, "gccgoflags": true, "installsuffix": true, "toolexec": true,
	"coverpkg": true, "covermode": true, "buildvcs": false,
}

func checkGoCommand(args []string) string {
	if len(args) == 0 {
		return "`go` alone does nothing: name a go command"
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "run":
		pkgs, rest, msg := goPackages(args, true)
		if msg != "" {
			return msg
		}
		if len(pkgs) == 1 && isWharfMain(pkgs[0]) {
			return checkWharf(rest)
		}
		return checkGoPaths(pkgs)
	case "build", "install", "vet", "generate", "list":
		pkgs, _, msg := goPackages(args, false)
		if msg != "" {
			return msg
		}
		return checkGoPaths(pkgs)
	case "test":
		return checkGoTest(args)
	case "tool", "mod", "env", "version", "get", "work", "clean", "doc", "fmt", "help", "bug", "fix", "telemetry":
		return ""
	}
	return fmt.Sprintf("`go %s` is not a go command", sub)
}

func isWharfMain(pkg string) bool {
	pkg = strings.TrimSuffix(strings.SplitN(pkg, "@", 2)[0], "/")
	return pkg == "./cmd/wharf" || pkg == "cmd/wharf" || pkg == "github.com/wharfhq/wharf/cmd/wharf"
}

// goPackages splits go build/run arguments into packages and, for go run,
// the program's arguments (after the first package).
func goPackages(args []string, run bool) (pkgs, rest []string, msg string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if goValueFlags[name] {
				i++
			}
			continue
		}
		pkgs = append(pkgs, a)
		if run {
			if !strings.HasSuffix(a, ".go") {
				return pkgs, args[i+1:], ""
			}
		}
	}
	return pkgs, nil, ""
}

func checkGoPaths(pkgs []string) string {
	for _, p := range pkgs {
		if !strings.HasPrefix(p, "./") && !strings.HasPrefix(p, "../") {
			continue // an import path
		}
		dir := strings.TrimSuffix(strings.TrimSuffix(strings.SplitN(p, "@", 2)[0], "..."), "/")
		if dir == "." || dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(repoRoot, dir)); err != nil {
			return fmt.Sprintf("%s does not exist in the repository: correct the path", p)
		}
	}
	return ""
}

// checkGoTest parses go test's flags (build and test flags) and checks the
// package paths.
func checkGoTest(args []string) string {
	fs := flag.NewFlagSet("go test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for name, takesValue := range goValueFlags {
		if takesValue {
			fs.String(name, "", "")
		}
	}
	for _, b := range strings.Fields("a n x v race msan asan cover trimpath work linkshared short failfast json benchmem c i buildvcs modcacherw") {
		fs.Bool(b, false, "")
	}
	for _, s := range strings.Fields("run skip bench benchtime count cpu list parallel shuffle fuzz fuzztime fuzzminimizetime coverprofile cpuprofile memprofile memprofilerate blockprofile blockprofilerate mutexprofile mutexprofilefraction trace outputdir vet fullpath") {
		fs.String(s, "", "")
	}
	fs.Duration("timeout", 0, "")
	var pkgs []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return "go test would refuse it: " + err.Error()
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "-args" {
			break
		}
		pkgs = append(pkgs, rest[0])
		args = rest[1:]
	}
	return checkGoPaths(pkgs)
}

var makeTargets struct {
	once    sync.Once
	targets map[string]bool
	err     error
}

var makeTargetRE = regexp.MustCompile(`(?m)^([A-Za-z0-9_./-]+)\s*:([^=]|$)`)

func checkMake(args []string) string {
	makeTargets.once.Do(func() {
		data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
		makeTargets.err = err
		makeTargets.targets = map[string]bool{}
		for _, m := range makeTargetRE.FindAllSubmatch(data, -1) {
			makeTargets.targets[string(m[1])] = true
		}
	})
	if makeTargets.err != nil {
		return "reading the Makefile: " + makeTargets.err.Error()
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") || assignmentRE.MatchString(a) {
			continue
		}
		if !makeTargets.targets[a] {
			var ts []string
			for t := range makeTargets.targets {
				if !strings.HasPrefix(t, ".") {
					ts = append(ts, t)
				}
			}
			sort.Strings(ts)
			return fmt.Sprintf("make %s: the Makefile has no target %q (its targets: %s)", a, a, strings.Join(ts, ", "))
		}
	}
	return ""
}
