package docstest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func md(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

func TestParseFences(t *testing.T) {
	blocks := ParseMarkdown(md(
		"# Title",
		"",
		"```go",
		"func f() {",
		"\treturn",
		"}",
		"```",
		"",
		"~~~ SQL extra words",
		"SELECT 1;",
		"~~~",
		"",
		"````",
		"```text",
		"nested fence, still the outer block",
		"````",
		"",
		"Inline ```code``` is not a fence.",
	))
	require.Len(t, blocks, 3)

	require.Equal(t, "go", blocks[0].Tag)
	require.Equal(t, 3, blocks[0].Line)
	require.Equal(t, 4, blocks[0].BodyLine)
	require.Equal(t, []string{"func f() {", "\treturn", "}"}, blocks[0].Body)

	require.Equal(t, "sql", blocks[1].Tag, "the tag is the info string's first word, lower case")
	require.Equal(t, []string{"SELECT 1;"}, blocks[1].Body)

	require.Equal(t, "", blocks[2].Tag)
	require.False(t, blocks[2].Indented)
	require.Equal(t, []string{"```text", "nested fence, still the outer block"}, blocks[2].Body)
}

func TestParseIndentedFenceInListIsDedented(t *testing.T) {
	blocks := ParseMarkdown(md(
		"1. Create the user:",
		"",
		"   ```sh",
		"      rabbitmqctl add_user wharf x",
		"      rabbitmqctl set_permissions -p prod wharf '' '^events$' ''",
		"   ```",
		"2. Next.",
	))
	require.Len(t, blocks, 1)
	require.Equal(t, "sh", blocks[0].Tag)
	require.Equal(t, []string{"rabbitmqctl add_user wharf x", "rabbitmqctl set_permissions -p prod wharf '' '^events$' ''"}, blocks[0].Body)
}

func TestParseUnclosedFence(t *testing.T) {
	blocks := ParseMarkdown(md("```sh", "wharf status"))
	require.Len(t, blocks, 1)
	require.True(t, blocks[0].Unclosed)
}

func TestParseIndentedCodeBlocks(t *testing.T) {
	blocks := ParseMarkdown(md(
		"A paragraph",
		"    continued, not code (it cannot interrupt a paragraph)",
		"",
		"    wharf status",
		"",
		"    wharf relay",
		"",
		"- a list item",
		"",
		"    a paragraph of the item, not code",
		"",
		"      code in the item",
		"",
		"After the list.",
	))
	require.Len(t, blocks, 2)
	require.True(t, blocks[0].Indented)
	require.Equal(t, "", blocks[0].Tag)
	require.Equal(t, 4, blocks[0].Line)
	require.Equal(t, []string{"wharf status", "", "wharf relay"}, blocks[0].Body)
	require.True(t, blocks[1].Indented)
	require.Equal(t, 12, blocks[1].Line)
	require.Equal(t, []string{"code in the item"}, blocks[1].Body)
}

func TestParseDirectives(t *testing.T) {
	blocks := ParseMarkdown(md(
		"<!-- docs-test: error -->",
		"```sql",
		"SELECT 1/0;",
		"```",
		"",
		"<!-- docs-test: skip (a Kubernetes manifest) -->",
		"",
		"```yaml",
		"kind: Pod",
		"```",
		"<!-- docs-test: skip -->",
		"```yaml",
		"a: 1",
		"```",
		"<!-- docs-test: eror -->",
		"```sql",
		"SELECT 1;",
		"```",
		"<!--",
		"a comment",
		"-->",
		"```sql",
		"SELECT 2;",
		"```",
	))
	require.Len(t, blocks, 5)
	require.Equal(t, "error", blocks[0].Directive)
	require.Equal(t, "skip", blocks[1].Directive)
	require.Equal(t, "a Kubernetes manifest", blocks[1].Reason)
	require.Contains(t, blocks[2].DirectiveErr, "needs a reason")
	require.Contains(t, blocks[3].DirectiveErr, "unknown directive `docs-test: eror`")
	require.Equal(t, "", blocks[4].Directive)
	require.Equal(t, "", blocks[4].DirectiveErr)

	blocks = ParseMarkdown(md(
		"<!-- docs-test: error -->",
		"A paragraph, not a block.",
		"",
		"```sql",
		"SELECT 1;",
		"```",
		"<!-- docs-test: skip (at the end) -->",
	))
	require.Len(t, blocks, 3)
	require.True(t, blocks[0].Orphan)
	require.Equal(t, 1, blocks[0].Line)
	require.Contains(t, blocks[0].DirectiveErr, "`<!-- docs-test: error -->` is not followed by a code block")
	require.Equal(t, "", blocks[1].Directive)
	require.True(t, blocks[2].Orphan)
	require.Equal(t, 7, blocks[2].Line)

	// Text about the directives is not one.
	blocks = ParseMarkdown(md(
		"Put `<!-- docs-test: error -->` before a block that must fail:",
		"",
		"```text",
		"<!-- docs-test: error -->",
		"```",
		"<!-- docs-test error -->",
		"```sql",
		"SELECT 1;",
		"```",
	))
	require.Len(t, blocks, 2)
	require.Equal(t, "", blocks[0].DirectiveErr)
	require.Contains(t, blocks[1].DirectiveErr, "mentions docs-test but is not")
}

func TestShellCommandsSh(t *testing.T) {
	b := ParseMarkdown(md(
		"```sh",
		"# a comment",
		"export X=1",
		"wharf relay \\",
		"  --sink stdout: \\",
		"  --drain   # until empty",
		"",
		"cat > roles.sql <<'EOF'",
		"not a command",
		"EOF",
		"$ wharf status",
		"```",
	))[0]
	cmds, problems := ShellCommands(b)
	require.Equal(t, []Command{
		{Line: 3, Text: "export X=1"},
		{Line: 4, Text: "wharf relay  --sink stdout:  --drain   # until empty"},
		{Line: 8, Text: "cat > roles.sql <<'EOF'"},
		{Line: 11, Text: "wharf status"},
	}, cmds)
	require.Len(t, problems, 1)
	require.Equal(t, 11, problems[0].Line)
	require.Contains(t, problems[0].Msg, "a `$ ` prompt in a sh block")
}

func TestShellCommandsConsole(t *testing.T) {
	b := ParseMarkdown(md(
		"```console",
		"$ wharf version",
		"wharf v0.1.0 (go1.26 linux/amd64, schema version 9)",
		"$ wharf migrate up \\",
		"> --schema app_outbox",
		"migrated to 9",
		"```",
		"",
		"```console",
		"only output",
		"```",
	))
	cmds, problems := ShellCommands(b[0])
	require.Empty(t, problems)
	require.Equal(t, []Command{{Line: 2, Text: "wharf version"}, {Line: 4, Text: "wharf migrate up  --schema app_outbox"}}, cmds)
	cmds, problems = ShellCommands(b[1])
	require.Empty(t, cmds)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0].Msg, "tag it text")
}

func TestSimpleCommands(t *testing.T) {
	for _, tc := range []struct {
		line string
		want [][]string
	}{
		{`wharf relay --sink 'sqs://x?queue_template=wharf-{{topic|dashes}}.fifo'`, [][]string{{"wharf", "relay", "--sink", "sqs://x?queue_template=wharf-{{topic|dashes}}.fifo"}}},
		{`wharf notify on|off`, [][]string{{"wharf", "notify", "on"}, {"off"}}},
		{`psql "$DATABASE_URL" -v pw="$PW" -f roles.sql 2>&1 | tee log && echo ok; kill %1 &`, [][]string{
			{"psql", "$DATABASE_URL", "-v", "pw=$PW", "-f", "roles.sql"}, {"tee", "log"}, {"echo", "ok"}, {"kill", "%1"}}},
		{`wharf migrate roles > roles.sql # comment`, [][]string{{"wharf", "migrate", "roles"}}},
		{`X=1 Y="a b" wharf status >>out.txt`, [][]string{{"X=1", "Y=a b", "wharf", "status"}}},
		{`ID=$(wharf flow start checkout) || exit 1`, [][]string{{"ID=$(wharf flow start checkout)"}, {"exit", "1"}}},
		{`echo a\ b "say \"hi\""`, [][]string{{"echo", "a b", `say "hi"`}}},
		{`cat <<EOF`, [][]string{{"cat"}}},
		{`(cd x && make build)`, [][]string{{"cd", "x"}, {"make", "build"}}},
	} {
		got, err := SimpleCommands(tc.line)
		require.NoError(t, err, tc.line)
		require.Equal(t, tc.want, got, tc.line)
	}
	for _, bad := range []string{`echo 'open`, `echo "open`, `echo $(open`, `echo >`} {
		_, err := SimpleCommands(bad)
		require.Error(t, err, bad)
	}
}

func TestCheckCommandLine(t *testing.T) {
	for _, ok := range []string{
		`wharf relay --sink stdout: --drain`,
		`wharf --schema app migrate up`,
		`WHARF_SINK=nats://nats:4222 wharf config validate --offline`,
		`./wharf status --help`,
		`go run ./cmd/wharf demo`,
		`go run github.com/wharfhq/wharf/cmd/wharf@latest version`,
		`go test -count=1 -run 'TestDocsCodeBlocks$' ./internal/docstest`,
		`go test -race -timeout 30m ./...`,
		`go build -o wharf ./cmd/wharf`,
		`go tool pprof -top cpu.prof`,
		`make test`,
		`sudo apt-get install -y postgresql`,
		`psql "$DATABASE_URL" -f roles.sql`,
		`scripts/test.sh`,
		`export DATABASE_URL=postgres://localhost/app`,
	} {
		require.Equal(t, "", checkCommandLine(ok), ok)
	}
	for line, want := range map[string]string{
		`wharf relya`:                        `unknown command "relya" for "wharf": did you mean relay?`,
		`wharf relay --no-such-flag`:         `unknown flag: --no-such-flag`,
		`wharf outbox lsit`:                  `unknown command "lsit" for "wharf outbox"`,
		`wharf version extra`:                `takes no arguments`,
		`go run ./cmd/wharf migrate --bogus`: `unknown flag: --bogus`,
		`go run ./cmd/nope`:                  `./cmd/nope does not exist`,
		`go test -nosuchflag ./...`:          `flag provided but not defined: -nosuchflag`,
		`go test ./nope/...`:                 `./nope/... does not exist`,
		`go frobnicate`:                      "`go frobnicate` is not a go command",
		`make nope`:                          `the Makefile has no target "nope"`,
		`frobnicate --now`:                   `unknown program "frobnicate"`,
		`wharf notify on|off`:                `unknown program "off"`,
		`scripts/nope.sh`:                    `scripts/nope.sh is not a file of the repository`,
		`echo 'open`:                         `does not parse as a shell command`,
	} {
		require.Contains(t, checkCommandLine(line), want, line)
	}
}

func TestCheckGo(t *testing.T) {
	found := Block{Line: 1, BodyLine: 2, Tag: "go", Body: []string{
		"\tfor len(words) > 0 && (assignmentRE.MatchString(words[0]) || shellKeywords[words[0]]) {",
		"",
		"\t\twords = words[1:]",
		"\t}",
	}}
	require.Equal(t, "", checkGo(t, found), "found in docs_test.go, blank lines and indentation ignored")

	changed := found
	changed.Body = append(append([]string(nil), found.Body[:3]...), "\t\twords = nil", "\t}")
	msg := checkGo(t, changed)
	require.Contains(t, msg, "its first 2 lines match internal/docstest/docs_test.go:")
	require.Contains(t, msg, `its line 5 ("words = nil") does not follow there`)

	require.Contains(t, checkGo(t, Block{Line: 1, BodyLine: 2, Body: []string{"undefinedEverywhere()"}}),
		`its first line "undefinedEverywhere()" is in no .go file of the module`)
}

func TestSQLBlocks(t *testing.T) {
	blocks := ParseMarkdown(md(
		"```sql", // 1
		"CREATE TABLE orders (id int PRIMARY KEY, status text);",
		"```",
		"<!-- docs-test: error -->", // 4
		"```sql",
		"SELECT wharf.enqueue('', 'k', '{}');",
		"```",
		"```sql", // 8
		"BEGIN;",
		"UPDATE orders SET status = 'paid' WHERE id = 42;",
		"SELECT wharf.enqueue('orders.paid', '42', '{\"order\": 42}', nosuchcolumn);",
		"COMMIT;",
		"```",
		"```sql", // 14: runs, after the harness rolled the failed transaction back
		"SELECT wharf.start_flow('checkout', '{\"id\": \"o-1\"}', 'o-1');",
		"SELECT wharf.signal('checkout', 'o-1', 'payment-captured', '{}');",
		"```",
		"<!-- docs-test: error -->", // 18, the fence on 19
		"```sql",
		"SELECT 1;",
		"```",
		"<!-- docs-test: error -->", // 22, the fence on 23
		"```sql",
		"BEGIN;",
		"SELECT 1/0;",
		"```",
		"```sql", // 27, the error on 28
		`\d wharf.outbox`,
		"```",
	))
	var got []string
	fail := func(line int, format string, args ...any) {
		got = append(got, fmt.Sprintf("%d: ", line)+fmt.Sprintf(format, args...))
	}
	runSQL(t, "x.md", blocks, fail)
	require.Len(t, got, 4, "%q", got)
	require.Contains(t, got[0], `11: sql block (run in order after the file's earlier blocks, on schema wharf with the checkout flow registered) fails: column "nosuchcolumn" does not exist (SQLSTATE 42703)`)
	require.Contains(t, got[1], "19: the sql block is marked `<!-- docs-test: error -->` but ran without error")
	require.Contains(t, got[2], "23: the sql block fails as marked (division by zero (SQLSTATE 22012)) but leaves the session in a failed transaction")
	require.Contains(t, got[3], "28: sql block")
	require.Contains(t, got[3], "psql meta-commands such as \\d are not SQL")
}

func TestYAMLAndJSONBlocks(t *testing.T) {
	blocks := ParseMarkdown(md(
		"```yaml",
		"sink: 'stdout:'",
		"routes:",
		"  - {topic: orders, sink: 'nats://127.0.0.1:4222'}",
		"```",
		"```yaml",
		"a: [1, 2",
		"```",
		"```yaml",
		"groups:",
		"  - name: wharf",
		"    rules:",
		"      - alert: WharfBacklog",
		"        expr: wharf_outbox_due > 1000",
		"```",
		"```json",
		`{"id": 1}`,
		`{"id": 2}`,
		"```",
		"```json",
		`{"id": 1, ...}`,
		"```",
	))
	msg, rules := checkYAML(blocks[0])
	require.Equal(t, "", msg)
	require.Equal(t, "", rules)
	msg, _ = checkYAML(blocks[1])
	require.Contains(t, msg, "yaml block does not parse")
	msg, rules = checkYAML(blocks[2])
	require.Equal(t, "", msg)
	require.Contains(t, rules, "WharfBacklog", "Prometheus rules go to promtool")
	require.Equal(t, "", checkJSON(blocks[3]), "a stream of JSON values parses")
	require.Contains(t, checkJSON(blocks[4]), "json block does not parse")
	require.Contains(t, promQLRules(Block{Body: []string{"sum(rate(wharf_delivered_total[5m]))"}}), "expr: sum(rate(wharf_delivered_total[5m]))")
}
