// Command gendocs writes the command-line reference, docs/cli.md, from the
// wharf command tree: `make docs`, or from the repository root
//
//	go run ./internal/cli/gendocs docs/cli.md
package main

import (
	"fmt"
	"os"

	"github.com/wharfhq/wharf/internal/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/cli/gendocs FILE (the reference is docs/cli.md: run make docs)")
		os.Exit(2)
	}
	if err := os.WriteFile(os.Args[1], cli.ReferenceMarkdown(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gendocs:", err)
		os.Exit(1)
	}
}
