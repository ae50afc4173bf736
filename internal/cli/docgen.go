package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// ReferenceMarkdown is the command-line reference, docs/cli.md: every
// command that is not hidden, with its usage line, help, flags (defaults
// and help text) and examples, generated from the command tree. `make docs`
// writes it (go run ./internal/cli/gendocs).
func ReferenceMarkdown() []byte {
	root := commandTree()
	var b bytes.Buffer
	b.WriteString("# Command-line reference\n\n")
	b.WriteString("<!-- Generated from the wharf command tree by `make docs`; edit the commands' help in internal/cli, not this file. -->\n\n")
	b.WriteString("`wharf` runs the relay and its tools. `wharf --help` and `wharf COMMAND --help` print the same help in the terminal.\n\n")
	b.WriteString("## Commands\n\n")
	walk(root, func(c *cobra.Command, depth int) {
		if c == root {
			return
		}
		fmt.Fprintf(&b, "%s- [%s](#%s): %s\n", strings.Repeat("  ", depth-1), c.CommandPath(), anchor(c), c.Short)
	})
	b.WriteString("\n## Global flags\n\nEvery command takes these flags:\n\n")
	writeText(&b, root.PersistentFlags().FlagUsagesWrapped(0))
	walk(root, func(c *cobra.Command, depth int) {
		writeCommand(&b, c, depth)
	})
	return append(bytes.TrimRight(b.Bytes(), "\n"), '\n')
}

// walk visits c and its available subcommands, depth first, in the order
// cobra lists them (by name).
func walk(c *cobra.Command, visit func(*cobra.Command, int)) {
	var rec func(*cobra.Command, int)
	rec = func(c *cobra.Command, depth int) {
		visit(c, depth)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				rec(sub, depth+1)
			}
		}
	}
	rec(c, 0)
}

// anchor is GitHub's anchor for the command's heading.
func anchor(c *cobra.Command) string {
	return strings.ReplaceAll(strings.ToLower(c.CommandPath()), " ", "-")
}

func writeCommand(b *bytes.Buffer, c *cobra.Command, depth int) {
	level := "##"
	if depth > 1 {
		level = "###"
	}
	fmt.Fprintf(b, "%s %s\n\n", level, c.CommandPath())
	if c.Short != "" {
		b.WriteString(sentence(c.Short) + "\n\n")
	}
	b.WriteString("Usage:\n\n")
	// A command with subcommands runs only to refuse an unknown one
	// (refuseUnknownSubcommands).
	usage := c.UseLine()
	if c.HasAvailableSubCommands() {
		usage = c.CommandPath() + " COMMAND [flags]"
	}
	writeText(b, usage)
	if long := strings.TrimSpace(c.Long); long != "" {
		writeText(b, long+"\n")
	}
	var subs []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			subs = append(subs, fmt.Sprintf("- [%s](#%s): %s\n", sub.CommandPath(), anchor(sub), sub.Short))
		}
	}
	if len(subs) > 0 && c != c.Root() { // the root's are listed at the top
		b.WriteString("Commands:\n\n" + strings.Join(subs, "") + "\n")
	}
	if flags := c.NonInheritedFlags(); c != c.Root() && flags.HasAvailableFlags() {
		b.WriteString("Flags:\n\n")
		writeText(b, flags.FlagUsagesWrapped(0))
	}
	if ex := strings.TrimSpace(c.Example); ex != "" {
		b.WriteString("Examples:\n\n```sh\n")
		for _, l := range strings.Split(c.Example, "\n") {
			b.WriteString(strings.TrimRight(strings.TrimPrefix(l, "  "), " ") + "\n")
		}
		b.WriteString("```\n\n")
	}
}

// writeText writes s as a text block, without trailing spaces.
func writeText(w io.Writer, s string) {
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		lines = append(lines, strings.TrimRight(l, " \t"))
	}
	fmt.Fprintf(w, "```text\n%s\n```\n\n", strings.Join(lines, "\n"))
}

// sentence ends s with a full stop.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || strings.HasSuffix(s, ".") || strings.HasSuffix(s, "?") || strings.HasSuffix(s, ")") && strings.HasSuffix(strings.TrimSuffix(s, ")"), ".") {
		return s
	}
	return s + "."
}
