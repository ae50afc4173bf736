package cli

import (
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/wharfhq/wharf"
)

// knownSettings returns the setting names a config file may hold, with
// underscores, as readConfigFile accepts them.
func knownSettings() map[string]bool {
	known := map[string]bool{}
	root := newRoot(ioStreams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	mark := func(f *pflag.Flag) {
		if isSetting(f) && f.Name != "route" {
			known[strings.ReplaceAll(f.Name, "-", "_")] = true
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(mark)
		c.PersistentFlags().VisitAll(mark)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return known
}

// FuzzReadConfigFile reads fuzzed YAML as a --config file and checks: no
// panic; an error is one line, as the CLI prints it, and names the file; a
// file that is accepted holds only known settings (and routes), each a
// single value; and writing what was read back as YAML reads the same again.
func FuzzReadConfigFile(f *testing.F) {
	for _, s := range []string{
		"", "sink: stdout:\n", "database_url: postgres://u:p@h/db\nmax_attempts: 8\nlease_ttl: 10s\n",
		"routes:\n  - {topic: \"orders.*\", sink: \"kafka://127.0.0.1:9092\"}\n  - topic: '**'\n    sink: stdout:\n",
		"sink: [a, b]\n", "sinkk: x\n", "routes: x\n", "routes:\n  - x\n", "routes:\n  - {topic: a}\n", "routes:\n  - {topic: a, sink: b, c: d}\n",
		"- a\n- b\n", ": :\n", "a: &x 1\nb: *x\n", "sink: !!binary aGVsbG8=\n", "{", "sink: \"\\xff\"\n", "sink: 1\nsink: 2\n",
		"---\nsink: a\n---\nsink: b\n", "log_level: debug\nlog_format: json\nschema: s\n", "max_buffered_bytes: 64MiB\n",
		"yes: no\n", "? [a]\n: b\n", "sink: |\n  multi\n  line\n", "routes: []\n", "routes:\n  - {topic: [a], sink: b}\n",
	} {
		f.Add([]byte(s))
	}
	known := knownSettings()
	root := newRoot(ioStreams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	dir := f.TempDir()
	path := filepath.Join(dir, "wharf.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		values, err := readConfigFile(path, root)
		if err != nil {
			shown := oneLineError(err)
			if strings.ContainsAny(shown, "\r\n") {
				t.Fatalf("config %q: error as printed is not one line: %q", data, shown)
			}
			if !strings.HasPrefix(err.Error(), "config file "+path) {
				t.Fatalf("config %q: error does not name the file: %q", data, err)
			}
			return
		}
		for k, vs := range values {
			if k == "route" {
				for _, r := range vs {
					if p, s, ok := strings.Cut(r, "="); !ok || p == "" || s == "" {
						t.Fatalf("config %q: route %q is not PATTERN=URL", data, r)
					}
				}
				continue
			}
			if !known[k] && !known[strings.ReplaceAll(k, "-", "_")] {
				t.Fatalf("config %q: accepted unknown key %q", data, k)
			}
			if len(vs) != 1 {
				t.Fatalf("config %q: key %q has %d values", data, k, len(vs))
			}
		}
		// What was read, written back, reads the same.
		doc := map[string]any{}
		for k, vs := range values {
			if k == "route" {
				var rs []map[string]string
				for _, r := range vs {
					p, s, _ := strings.Cut(r, "=")
					rs = append(rs, map[string]string{"topic": p, "sink": s})
				}
				if rs == nil {
					rs = []map[string]string{}
				}
				doc["routes"] = rs
				continue
			}
			doc[k] = vs[0]
		}
		out, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatalf("config %q: cannot write back %v: %v", data, values, err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := readConfigFile(path, root)
		if err != nil {
			t.Fatalf("config %q read as %q, written back as %q, is refused: %v", data, values, out, err)
		}
		if !reflect.DeepEqual(normal(values), normal(again)) {
			t.Fatalf("config %q read as %q, written back as %q, reads as %q", data, values, out, again)
		}
	})
}

// normal makes nil and empty route lists compare equal.
func normal(m map[string][]string) map[string][]string {
	out := maps.Clone(m)
	for k, v := range out {
		if len(v) == 0 {
			out[k] = nil
		}
	}
	return out
}

// FuzzRouteFlags checks the --route PATTERN=URL parsing of `config
// validate` and `relay` on fuzzed patterns and URLs holding a distinctive
// password: errors are one line and never show the password; accepted
// routes have a valid pattern and list each distinct URL once, --sink last.
func FuzzRouteFlags(f *testing.F) {
	f.Add("orders.*", "kafka://u:", "pw", "@127.0.0.1:9092", "stdout:")
	f.Add("**", "amqp://guest:", "a/b?c#d", "@h/vh", "")
	f.Add("a..b", "nats://u:", "x", "@h", "null:")
	f.Add("", "x", "", "", "")
	f.Add("a=b", "redis://:", "=", "@h", "kafak://u:x@h")
	f.Add(" orders.* ", " https://u:", "%zz", "@h/x?code=1 ", "file:///x")
	f.Add("x\ny", "bogus://u:", "\n", "@h", "")
	f.Add("x", "bogus://u:", "p", "@h\n", "")
	f.Fuzz(func(t *testing.T, pattern, prefix, mid, suffix, sink string) {
		pw := "Zx8" + mid + "Pq4"
		u := prefix + pw + suffix
		route := pattern + "=" + u
		if strings.Count(route+sink, "Zx8") != 1 || strings.Count(route+sink, "Pq4") != 1 || strings.Contains(pattern, "=") {
			return
		}
		fl := &relayFlags{sink: sink, routes: []string{route}}
		urls, err := sinkURLs(fl)
		if err != nil {
			if msg := oneLineError(err); strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("--route %q: error is not one line: %q", route, msg)
			}
			if strings.Contains(err.Error(), pw) {
				// Shown is fine only where the text is not a password.
				parsed, perr := url.Parse(strings.TrimSpace(u))
				if perr != nil {
					t.Fatalf("--route %q: error shows %q of an unparsable URL: %s", route, pw, err)
				}
				if p, ok := parsed.User.Password(); ok && strings.Contains(p, pw) {
					t.Fatalf("--route %q: error shows the password %q: %s", route, pw, err)
				}
			}
			return
		}
		p, rest, _ := strings.Cut(route, "=")
		if err := wharf.ValidatePattern(strings.TrimSpace(p)); err != nil {
			t.Fatalf("--route %q accepted with an invalid pattern: %v", route, err)
		}
		want := []string{strings.TrimSpace(rest)}
		if sink != "" && sink != want[0] {
			want = append(want, sink)
		}
		if !slices.Equal(urls, want) {
			t.Fatalf("--route %q --sink %q: urls %q, want %q", route, sink, urls, want)
		}
	})
}
