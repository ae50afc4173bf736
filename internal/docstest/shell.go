package docstest

import (
	"errors"
	"regexp"
	"strings"
)

// Command is one command line of a shell or console block, continuation
// lines joined.
type Command struct {
	Line int // the file line it starts on
	Text string
}

var heredocRE = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// ShellCommands returns the commands of a block: for sh and bash every line
// that is not blank or a comment; for console the lines that start with
// "$ " (the rest is output). Lines ending in a backslash continue on the
// next line (in console, after an optional "> " prompt). The lines of a
// here-document are its command's input, not commands. A "$ " prompt in a
// sh or bash block is reported as a problem.
func ShellCommands(b Block) (cmds []Command, problems []Problem) {
	console := b.Tag == "console"
	for i := 0; i < len(b.Body); i++ {
		line := b.Body[i]
		start := b.BodyLine + i
		t := strings.TrimSpace(line)
		if console {
			if !strings.HasPrefix(line, "$ ") && t != "$" {
				continue // output
			}
			t = strings.TrimSpace(strings.TrimPrefix(t, "$"))
		} else {
			if t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			if strings.HasPrefix(t, "$ ") {
				problems = append(problems, Problem{start, "a `$ ` prompt in a " + b.Tag + " block: drop the prompt, or tag the block console if it shows output after the commands"})
				t = strings.TrimSpace(t[1:])
			}
		}
		for strings.HasSuffix(t, `\`) && i+1 < len(b.Body) {
			i++
			next := strings.TrimSpace(b.Body[i])
			if console {
				next = strings.TrimSpace(strings.TrimPrefix(next, ">"))
			}
			t = strings.TrimSuffix(t, `\`) + " " + next
		}
		if t == "" {
			continue
		}
		cmds = append(cmds, Command{Line: start, Text: t})
		if m := heredocRE.FindStringSubmatch(t); m != nil && !strings.Contains(t, "<<<") {
			for i++; i < len(b.Body) && strings.TrimSpace(b.Body[i]) != m[1]; i++ {
			}
		}
	}
	if console && len(cmds) == 0 {
		problems = append(problems, Problem{b.Line, "a console block without a `$ ` command line: tag it text if it shows only output"})
	}
	return cmds, problems
}

// Problem is a mistake found at a line of a Markdown file.
type Problem struct {
	Line int
	Msg  string
}

// SimpleCommands splits a command line into its simple commands (at |, ||,
// &&, ;, &, parentheses), each as its words with quotes removed,
// redirections (> file, 2>&1, < file, <<EOF) and comments dropped. $VAR
// and $(...) stay as written.
func SimpleCommands(line string) ([][]string, error) {
	var (
		cmds    [][]string
		cur     []string
		word    strings.Builder
		inWord  bool
		skipNxt bool // the next word is a redirection's target
	)
	endWord := func() {
		if !inWord {
			return
		}
		if skipNxt {
			skipNxt = false
		} else {
			cur = append(cur, word.String())
		}
		word.Reset()
		inWord = false
	}
	endCmd := func() {
		endWord()
		if len(cur) > 0 {
			cmds = append(cmds, cur)
		}
		cur = nil
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '\\':
			inWord = true
			if i+1 < len(rs) {
				i++
				word.WriteRune(rs[i])
			}
		case r == '\'':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != '\'' {
				j++
			}
			if j == len(rs) {
				return nil, errors.New("unterminated ' quote")
			}
			word.WriteString(string(rs[i+1 : j]))
			i = j
		case r == '"':
			inWord = true
			j := i + 1
			for ; j < len(rs) && rs[j] != '"'; j++ {
				if rs[j] == '\\' && j+1 < len(rs) && strings.ContainsRune("\"\\$`", rs[j+1]) {
					j++
				}
				word.WriteRune(rs[j])
			}
			if j == len(rs) {
				return nil, errors.New(`unterminated " quote`)
			}
			i = j
		case r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			inWord = true
			depth := 0
			j := i + 1
			for ; j < len(rs); j++ {
				if rs[j] == '(' {
					depth++
				} else if rs[j] == ')' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			if j == len(rs) {
				return nil, errors.New("unterminated $( )")
			}
			word.WriteString(string(rs[i : j+1]))
			i = j
		case r == '`':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != '`' {
				j++
			}
			if j == len(rs) {
				return nil, errors.New("unterminated ` quote")
			}
			word.WriteString(string(rs[i : j+1]))
			i = j
		case r == '#' && !inWord:
			i = len(rs)
		case r == ' ' || r == '\t':
			endWord()
		case r == '|' || r == ';' || r == '(' || r == ')':
			endCmd()
			if r == '|' && i+1 < len(rs) && (rs[i+1] == '|' || rs[i+1] == '&') {
				i++
			}
		case r == '&':
			if i+1 < len(rs) && rs[i+1] == '>' { // &> file
				endWord()
				i++
				if i+1 < len(rs) && rs[i+1] == '>' {
					i++
				}
				skipNxt = true
				continue
			}
			endCmd()
			if i+1 < len(rs) && rs[i+1] == '&' {
				i++
			}
		case r == '>' || r == '<':
			// A word of digits just before is the descriptor (2>).
			if inWord && isDigits(word.String()) {
				word.Reset()
				inWord = false
			} else {
				endWord()
			}
			for i+1 < len(rs) && (rs[i+1] == '>' || rs[i+1] == '<' || rs[i+1] == '&' || rs[i+1] == '|' || rs[i+1] == '-') {
				i++
			}
			skipNxt = true
		default:
			inWord = true
			word.WriteRune(r)
		}
	}
	endCmd()
	if skipNxt {
		return nil, errors.New("a redirection without a target")
	}
	return cmds, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
