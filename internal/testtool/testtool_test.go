package testtool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A skip for a missing tool, and a long test left out, each append one line
// to $WHARF_SKIP_LOG that scripts/test.sh summarises.
func TestSkipsAreRecorded(t *testing.T) {
	log := filepath.Join(t.TempDir(), "skips")
	t.Setenv(SkipLogEnv, log)
	t.Setenv("CI", "")
	t.Setenv(LongEnv, "")
	var skipped []bool
	t.Run("missing", func(t *testing.T) {
		defer func() { skipped = append(skipped, t.Skipped()) }()
		Path(t, "wharf-no-such-tool", "apt-get install nothing")
	})
	t.Run("long", func(t *testing.T) {
		defer func() { skipped = append(skipped, t.Skipped()) }()
		Long(t, "it takes long")
	})
	if len(skipped) != 2 || !skipped[0] || !skipped[1] {
		t.Fatalf("want both subtests skipped, got %v", skipped)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := "tool\twharf-no-such-tool\t./internal/testtool\tTestSkipsAreRecorded/missing\n" +
		"long\t\t./internal/testtool\tTestSkipsAreRecorded/long\n"
	if string(b) != want {
		t.Fatalf("skip log:\n%q\nwant:\n%q", b, want)
	}
}

// Under CI=true a missing tool fails the test; a long test runs with
// WHARF_LONG_TESTS=1.
func TestCIFailsAMissingTool(t *testing.T) {
	t.Setenv("CI", "true")
	t.Setenv(LongEnv, "1")
	t.Setenv(SkipLogEnv, "")
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Missing(ft, "chromium", "for the browser test")
	}()
	if !strings.Contains(ft.fatal, "wharf-skip: needs chromium: for the browser test") {
		t.Fatalf("Missing under CI=true: %q", ft.fatal)
	}
	if !IsLong() {
		t.Fatal("IsLong with WHARF_LONG_TESTS=1")
	}
}

// fatalRecorder records Fatal instead of ending the test, then panics to
// stop the caller as Fatal would.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (f *fatalRecorder) Fatal(args ...any) {
	for _, a := range args {
		if s, ok := a.(string); ok {
			f.fatal += s
		}
	}
	panic("fatal")
}

func (f *fatalRecorder) Helper() {}
