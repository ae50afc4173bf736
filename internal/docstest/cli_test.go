package docstest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/wharfhq/wharf/internal/cli"
)

// docs/cli.md is what `make docs` generates from the command tree now.
func TestCLIReferenceIsCurrent(t *testing.T) {
	got, err := os.ReadFile(filepath.Join(repoRoot, "docs", "cli.md"))
	if err != nil {
		t.Fatalf("docs/cli.md is missing: run make docs (%v)", err)
	}
	if !bytes.Equal(got, cli.ReferenceMarkdown()) {
		t.Fatal("docs/cli.md is stale: run make docs")
	}
}
