package wharfmigrate

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
)

// releasedSums reads released.sha256: the migrations released to users, with
// the SHA-256 of each file as released.
func releasedSums(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("released.sha256")
	if err != nil {
		t.Fatalf("the list of released migrations: %v", err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 || !fileRE.MatchString(path.Base(name)) || path.Dir(name) != "migrations" {
			t.Fatalf("released.sha256:%d: want \"<sha256>  migrations/NNN_name.up.sql\" (sha256sum's format), got %q", n, line)
		}
		if _, dup := sums[name]; dup {
			t.Fatalf("released.sha256:%d: %s is listed twice", n, name)
		}
		sums[name] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sums
}

// A released migration never changes: a database that applied it must end up
// with the same schema as one that applies it today. Changing one fails here;
// the change belongs in a new migration.
func TestReleasedMigrationsNeverChange(t *testing.T) {
	sums := releasedSums(t)
	if len(sums) == 0 {
		t.Fatal("released.sha256 lists no migration")
	}
	lastReleased := 0
	for name, want := range sums {
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			t.Errorf("%s was released and is gone: released migrations are never removed or renamed; restore it from git history", name)
			continue
		}
		sum := sha256.Sum256(body)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s was released and has changed (sha256 %s, released as %s): restore it and put the change in a new migration, numbered after the last one", name, got, want)
		}
		v, _ := strconv.Atoi(fileRE.FindStringSubmatch(path.Base(name))[1])
		lastReleased = max(lastReleased, v)
	}
	// No file may join a released version after the release, and every
	// migration up to the last released one was released in full.
	entries, err := migrationFS.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := "migrations/" + e.Name()
		parts := fileRE.FindStringSubmatch(e.Name())
		if parts == nil {
			continue // load refuses it, with its own error
		}
		v, _ := strconv.Atoi(parts[1])
		if _, ok := sums[name]; !ok && v <= lastReleased {
			t.Errorf("%s is numbered %d, at or below the last released migration (%d), but was never released: number it after %d", name, v, lastReleased, lastReleased)
		}
	}
}

// The check above reads what is embedded in the binary; make sure that is
// what the repository holds, so the list is checked against the files a
// reviewer sees.
func TestEmbeddedMigrationsAreTheFilesOnDisk(t *testing.T) {
	entries, err := migrationFS.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		embedded, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		onDisk, err := os.ReadFile("migrations/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if string(embedded) != string(onDisk) {
			t.Errorf("migrations/%s differs from its embedded copy", e.Name())
		}
	}
}
