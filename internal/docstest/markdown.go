// Package docstest checks the code blocks of README.md and docs/**/*.md: Go
// must be compiled code, SQL must run on a migrated schema, shell commands
// must name real commands and flags, YAML and JSON must parse. The checks
// are its test, TestDocsCodeBlocks; run it alone with
//
//	go test -count=1 -run TestDocsCodeBlocks ./internal/docstest
//
// This file and shell.go parse Markdown and shell lines; docs_test.go holds
// the rules (which tags exist, what each checks).
package docstest

import (
	"regexp"
	"strings"
)

// Block is one code block of a Markdown file.
type Block struct {
	// Line is the 1-based line of the opening fence, or of the first line
	// of an indented code block.
	Line int
	// Tag is the first word of the fence's info string, in lower case; ""
	// for an untagged fence and for an indented code block.
	Tag string
	// Indented: an indented code block (four spaces), which has no tag.
	Indented bool
	// Body holds the block's lines with their common leading indentation
	// removed. BodyLine is the file line of Body[0].
	Body     []string
	BodyLine int
	// Directive is the `<!-- docs-test: ... -->` comment on the last
	// non-blank line before the block: "error" or "skip"; Reason is the
	// text in parentheses after skip. DirectiveErr says what is wrong with
	// a directive that is neither.
	Directive    string
	Reason       string
	DirectiveErr string
	// Unclosed: the file ended inside the block.
	Unclosed bool
	// Orphan: not a block but a docs-test directive that no block
	// follows, at Line; DirectiveErr says so.
	Orphan bool
}

var (
	fenceRE     = regexp.MustCompile("^([ \t]*)(`{3,}|~{3,})(.*)$")
	listItemRE  = regexp.MustCompile(`^([ \t]*)([-*+]|[0-9]{1,9}[.)])([ \t]+|$)`)
	directiveRE = regexp.MustCompile(`^<!--\s*docs-test:\s*(.*?)\s*-->$`)
	skipRE      = regexp.MustCompile(`^skip\s*\((.*\S.*)\)$`)
)

// indentWidth is the width of s's leading whitespace, a tab counting to the
// next multiple of four.
func indentWidth(s string) int {
	w := 0
	for _, r := range s {
		switch r {
		case ' ':
			w++
		case '\t':
			w += 4 - w%4
		default:
			return w
		}
	}
	return w
}

func isBlank(s string) bool { return strings.TrimSpace(s) == "" }

// ParseMarkdown returns the code blocks of a Markdown document: fenced blocks
// (``` and ~~~, at any indentation, as in list items) and indented code
// blocks (four spaces more than the enclosing list item's text, after a
// blank line).
func ParseMarkdown(src string) []Block {
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	var blocks []Block
	prevBlank := true // the previous line is blank (or the file starts)
	lastText := ""    // the last non-blank line outside code blocks
	lastLine := 0     // its line
	// orphan reports a docs-test directive that no code block follows.
	orphan := func() {
		if directiveRE.MatchString(lastText) {
			blocks = append(blocks, Block{Line: lastLine, Orphan: true,
				DirectiveErr: "`" + lastText + "` is not followed by a code block: put it on the line before the block's fence (blank lines between are fine), or remove it"})
		}
	}
	listContent := -1  // the text column of the list item we are in, or -1
	inComment := false // inside a multi-line HTML comment
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if inComment {
			if strings.Contains(line, "-->") {
				inComment = false
			}
			lastText, lastLine = strings.TrimSpace(line), i+1
			prevBlank = false
			continue
		}
		if isBlank(line) {
			prevBlank = true
			continue
		}
		indent := indentWidth(line)
		// A backtick fence's info string has no backtick (else it is inline code).
		if m := fenceRE.FindStringSubmatch(line); m != nil && (m[2][0] != '`' || !strings.Contains(m[3], "`")) {
			b := Block{Line: i + 1, BodyLine: i + 2}
			if f := strings.Fields(m[3]); len(f) > 0 {
				b.Tag = strings.ToLower(strings.Trim(f[0], "{}."))
			}
			b.applyDirective(lastText)
			fence := m[2]
			fenceIndent := indentWidth(m[1])
			var body []string
			closed := false
			for i++; i < len(lines); i++ {
				l := lines[i]
				t := strings.TrimLeft(l, " \t")
				if strings.HasPrefix(t, fence[:1]) && strings.Trim(strings.TrimRight(t, " \t"), fence[:1]) == "" &&
					len(strings.TrimRight(t, " \t")) >= len(fence) {
					closed = true
					break
				}
				body = append(body, stripIndent(l, fenceIndent))
			}
			b.Unclosed = !closed
			b.Body = dedent(body)
			blocks = append(blocks, b)
			lastText = ""
			prevBlank = false
			continue
		}
		base := 0
		if listContent >= 0 {
			base = listContent
		}
		item := listItemRE.FindStringSubmatch(line)
		if item != nil && indent < base+4 {
			listContent = indentWidth(item[1]) + len(item[2]) + 1
			if w := indentWidth(item[1] + item[2] + item[3]); w > listContent && w <= listContent+4 {
				listContent = w
			}
		} else if prevBlank && listContent >= 0 && indent < listContent {
			listContent = -1
			base = 0
		}
		if prevBlank && indent >= base+4 {
			b := Block{Line: i + 1, BodyLine: i + 1, Indented: true}
			b.applyDirective(lastText)
			var body []string
			j := i
			for ; j < len(lines); j++ {
				if !isBlank(lines[j]) && indentWidth(lines[j]) < base+4 {
					break
				}
				body = append(body, lines[j])
			}
			for len(body) > 0 && isBlank(body[len(body)-1]) {
				body = body[:len(body)-1]
				j--
			}
			b.Body = dedent(body)
			blocks = append(blocks, b)
			i = j - 1
			lastText = ""
			prevBlank = false
			continue
		}
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "<!--") && !strings.Contains(t, "-->") {
			inComment = true
		}
		orphan()
		lastText, lastLine = t, i+1
		prevBlank = false
	}
	orphan()
	return blocks
}

func (b *Block) applyDirective(prev string) {
	m := directiveRE.FindStringSubmatch(prev)
	if m == nil {
		if strings.HasPrefix(prev, "<!--") && strings.Contains(prev, "docs-test") {
			b.DirectiveErr = "the comment before the block mentions docs-test but is not `<!-- docs-test: error -->` or `<!-- docs-test: skip (reason) -->` on one line"
		}
		return
	}
	switch d := m[1]; {
	case d == "error":
		b.Directive = "error"
	case skipRE.MatchString(d):
		b.Directive = "skip"
		b.Reason = strings.TrimSpace(skipRE.FindStringSubmatch(d)[1])
	case strings.HasPrefix(d, "skip"):
		b.DirectiveErr = "`<!-- docs-test: skip -->` needs a reason: `<!-- docs-test: skip (why this block cannot be checked) -->`"
	default:
		b.DirectiveErr = "unknown directive `docs-test: " + d + "`: the directives are `<!-- docs-test: error -->` and `<!-- docs-test: skip (reason) -->`"
	}
}

// stripIndent removes up to n columns of leading whitespace.
func stripIndent(s string, n int) string {
	w := 0
	for i, r := range s {
		if w >= n || (r != ' ' && r != '\t') {
			return s[i:]
		}
		if r == '\t' {
			w += 4 - w%4
		} else {
			w++
		}
	}
	return ""
}

// dedent removes the leading whitespace all non-blank lines share.
func dedent(lines []string) []string {
	common := -1
	for _, l := range lines {
		if isBlank(l) {
			continue
		}
		if w := indentWidth(l); common < 0 || w < common {
			common = w
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if isBlank(l) {
			out[i] = ""
			continue
		}
		out[i] = stripIndent(l, common)
	}
	return out
}
