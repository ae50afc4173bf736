//go:build faults

// Package faults runs wharf relays as processes under load while something
// breaks (a relay is killed or paused, PostgreSQL restarts or crashes, the
// network stalls, a broker goes away, the disk fills up; for a WAL outbox
// also: the database goes back in time, its replication slot is dropped,
// records are forged, one transaction outgrows the relay's memory) and
// checks, with one verifier, that the README's guarantees held: every
// committed message delivered, no rolled-back one, per-(topic, key) order of
// first deliveries.
//
// The short form runs with
//
//	go test -race -tags faults -count=1 ./internal/e2e/faults/
//
// and the long form (minute-long outages, twenty kills) with WHARF_FAULTS=long.
// WHARF_FAULTS_BIN=PATH tests that wharf binary instead of building one.
// Every scenario prints one FAULTROW line; WHARF_FAULTS_ROWS=FILE also appends
// it to FILE.
package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/wharfhq/wharf/internal/testdb"
)

var (
	// databaseURL is TEST_DATABASE_URL, or a throwaway cluster's.
	databaseURL string
	// wharfBin is the wharf binary built for the run.
	wharfBin string
	// long selects the long form of every scenario.
	long = os.Getenv("WHARF_FAULTS") == "long"
)

func TestMain(m *testing.M) { os.Exit(mainRun(m)) }

func mainRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "wharf-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	wharfBin = filepath.Join(dir, "wharf")
	if bin := os.Getenv("WHARF_FAULTS_BIN"); bin != "" {
		wharfBin = bin // a prebuilt binary, e.g. of a release under test
	} else if err := build(wharfBin); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	return testdb.Run(m, &databaseURL)
}

// build compiles ./cmd/wharf from the module root (three levels up).
// WHARF_E2E_RACE=1 builds it with the race detector.
func build(out string) error {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("no go.mod at %s: run the tests from internal/e2e/faults", root)
	}
	args := []string{"build"}
	if os.Getenv("WHARF_E2E_RACE") != "" {
		args = append(args, "-race")
	}
	args = append(args, "-o", out, "./cmd/wharf")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/wharf: %w\n%s", err, b)
	}
	return nil
}

// pick returns the short or the long value.
func pick[T any](short, longV T) T {
	if long {
		return longV
	}
	return short
}

// needBinary returns the path of an external program. Without it the test
// fails under CI=true and is skipped otherwise.
func needBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found on PATH: install it (it is required with CI=true)", name)
	}
	t.Skipf("%s not found on PATH; install it to run this scenario", name)
	return ""
}

// freePort returns a TCP port on 127.0.0.1 nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
