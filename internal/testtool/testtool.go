// Package testtool handles the tests that need a program or a server the
// machine may lack (chromium, promtool, pgbouncer, nats-server, Redis,
// RabbitMQ, the PostgreSQL server binaries).
//
// Without the tool such a test fails under CI=true, where everything must
// run, and is skipped otherwise with a message of a fixed form:
//
//	wharf-skip: needs <tool>: <why, and how to install it>
//
// Long tests (soaks, sweeps, the long forms of fault and load tests) run
// only with WHARF_LONG_TESTS=1, which CI sets (.ci/run); without it they
// skip with "wharf-long: ...".
//
// When the environment variable WHARF_SKIP_LOG names a file, each such skip
// also appends a line to it: scripts/test.sh (make test) sets it and ends
// the run with one line listing what was skipped for lack of a tool and how
// many long tests were left to CI.
package testtool

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// SkipLogEnv names the environment variable holding the file that skips
// for a missing tool are appended to.
const SkipLogEnv = "WHARF_SKIP_LOG"

// SkipPrefix starts the message of every skip for a missing tool.
const SkipPrefix = "wharf-skip: "

// LongEnv names the environment variable that, set to 1, runs the long
// tests.
const LongEnv = "WHARF_LONG_TESTS"

// IsLong reports whether the long tests run (WHARF_LONG_TESTS=1): a test
// may then also check what depends on the machine being quiet.
func IsLong() bool { return os.Getenv(LongEnv) == "1" }

// Long skips t unless WHARF_LONG_TESTS=1: t is one of the long tests that
// the default run (make test) leaves to CI. why says what makes it long.
func Long(t testing.TB, why string) {
	t.Helper()
	if IsLong() {
		return
	}
	record(t, "long", "")
	t.Skipf("wharf-long: %s; %s=1 runs it (CI does)", why, LongEnv)
}

// Missing ends t for lack of tool: it fails t under CI=true and skips it
// otherwise. why says what the test needed it for and how to get it.
func Missing(t testing.TB, tool, why string) {
	t.Helper()
	msg := fmt.Sprintf("%sneeds %s: %s", SkipPrefix, tool, why)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: a missing tool fails the test)")
	}
	record(t, "tool", tool)
	t.Skip(msg)
}

// Path returns the path of the program name, looked up on PATH and then in
// the extra locations given (e.g. /usr/sbin/pgbouncer); without it, it
// calls Missing with install as the reason.
func Path(t testing.TB, name, install string, extra ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range extra {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	Missing(t, name, install)
	return ""
}

// ExamplesNeed is Missing for the examples of a test binary, which cannot
// skip themselves: call it from TestMain before m.Run. When nothing answers
// on the TCP address addr, the examples named (their full function names)
// are skipped (added to -test.skip, and recorded like Missing's skips), or,
// under CI=true, left to run and fail. why says how to start the server.
func ExamplesNeed(tool, addr, why string, examples ...string) {
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		_ = c.Close()
		return
	}
	msg := fmt.Sprintf("%sneeds %s: nothing answers on %s: %s", SkipPrefix, tool, addr, why)
	if os.Getenv("CI") == "true" {
		fmt.Fprintln(os.Stderr, msg+" (CI=true: its examples run and fail)")
		return
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	pattern := "^(" + strings.Join(examples, "|") + ")$"
	if old := flag.Lookup("test.skip").Value.String(); old != "" {
		pattern = old + "|" + pattern
	}
	if err := flag.Set("test.skip", pattern); err != nil {
		panic(err)
	}
	run := flag.Lookup("test.run").Value.String()
	for _, name := range examples {
		if ok, err := regexp.MatchString(run, name); run != "" && (err != nil || !ok) {
			continue // not selected by -run: nothing to report
		}
		fmt.Printf("--- SKIP: %s\n    %s\n", name, msg)
		recordName(func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }, "tool", tool, name)
	}
}

// record appends "<kind>\t<tool>\t<package dir>\t<test>" to
// $WHARF_SKIP_LOG; kind is "tool" (a missing tool) or "long".
func record(t testing.TB, kind, tool string) { recordName(t.Logf, kind, tool, t.Name()) }

func recordName(logf func(format string, args ...any), kind, tool, name string) {
	file := os.Getenv(SkipLogEnv)
	if file == "" {
		return
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		logf("cannot record the skip in %s: %v", file, err)
		return
	}
	defer f.Close()
	// One write per line: concurrent test binaries append whole lines.
	clean := strings.NewReplacer("\t", " ", "\n", " ").Replace
	line := kind + "\t" + clean(tool) + "\t" + packageDir() + "\t" + name + "\n"
	if _, err := f.WriteString(line); err != nil {
		logf("cannot record the skip in %s: %v", file, err)
	}
}

// packageDir is the test's package directory relative to the module root
// (a test binary runs in its package's directory).
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "?"
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}
