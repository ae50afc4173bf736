package wharfmigrate

import (
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
)

// Two branches each add migration 10 under their own name and are merged:
// load must refuse, not keep one up file and the other's down file (or
// one migration's SQL under the other's name).
func TestLoadRefusesTwoMigrationsWithOneVersion(t *testing.T) {
	fsys := fstest.MapFS{}
	for _, e := range mustEntries(t) {
		body, err := migrationFS.ReadFile("migrations/" + e)
		if err != nil {
			t.Fatal(err)
		}
		fsys["migrations/"+e] = &fstest.MapFile{Data: body}
	}
	if _, err := loadFS(fsys, "wharf"); err != nil {
		t.Fatalf("the embedded migrations: %v", err)
	}
	next := len(mustEntries(t))/2 + 1
	for _, name := range []string{"add_a", "add_b"} {
		for _, dir := range []string{"up", "down"} {
			fsys[fmtName(next, name, dir)] = &fstest.MapFile{Data: []byte("SELECT '" + name + " " + dir + "';\n")}
		}
	}
	ms, err := loadFS(fsys, "wharf")
	if err == nil {
		last := ms[len(ms)-1]
		t.Fatalf("two migrations numbered %d loaded as one: %s, up %q, down %q", next, last.Name, strings.TrimSpace(last.Up), strings.TrimSpace(last.Down))
	}
	t.Log(err)
}

func mustEntries(t *testing.T) []string {
	t.Helper()
	entries, err := migrationFS.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func fmtName(v int, name, dir string) string {
	return fmt.Sprintf("migrations/%03d_%s.%s.sql", v, name, dir)
}
