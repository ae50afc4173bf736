package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// badFlagValueRE matches pflag's error for a value its type cannot parse.
var badFlagValueRE = regexp.MustCompile(`^invalid argument "(.*)" for "(?:-\w, )?--([a-z0-9-]+)" flag: `)

// wantValue says what a flag of f's type takes, for an error about a value
// it could not parse: no Go parser internals (strconv.ParseInt: ...).
func wantValue(f *pflag.Flag, err error) string {
	switch f.Value.Type() {
	case "int", "int64", "int32", "uint", "uint64":
		return "want a whole number"
	case "duration":
		return "want a duration such as 500ms, 10s or 1m30s"
	case "bool":
		return "want true or false"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// unquotedColonRE finds a top-level "key: value" line whose value holds a
// colon YAML reads as a mapping: "sink: stdout:" or "sink: http://x".
var unquotedColonRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*):\s+([^"'\s#][^#]*?:(\s.*)?)\s*$`)

// yamlHint adds, to a YAML syntax error, the line of the first value with an
// unquoted colon (a URL, typically) and how to fix it, when there is one.
func yamlHint(data []byte, err error) string {
	if !strings.Contains(err.Error(), "mapping values are not allowed") {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		if m := unquotedColonRE.FindStringSubmatch(sc.Text()); m != nil {
			return fmt.Sprintf(" (line %d: the value of %s holds a colon: quote it, e.g. %s: \"%s\")", n, m[1], m[1], strings.TrimSpace(m[2]))
		}
	}
	return ""
}

// configLines maps each top-level key of a YAML file to its line, for error
// messages; a file that cannot be read or parsed gives an empty map.
func configLines(path string) map[string]int {
	out := map[string]int{}
	data, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return out
	}
	m := doc.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		out[m[i].Value] = m[i].Line
	}
	return out
}
