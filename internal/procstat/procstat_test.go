package procstat

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// This process's own entry: its command and a CPU time that only grows.
func TestCPUOfThisProcess(t *testing.T) {
	before, comm, ok := CPU(os.Getpid())
	if runtime.GOOS != "linux" {
		require.False(t, ok, "no /proc here")
		return
	}
	require.True(t, ok)
	want := filepath.Base(os.Args[0])
	if len(want) > 15 {
		want = want[:15] // the kernel keeps 15 characters of the name
	}
	require.Equal(t, want, comm)
	x := 0
	for i := range 50_000_000 {
		x ^= i
	}
	_ = x
	after, _, ok := CPU(os.Getpid())
	require.True(t, ok)
	require.GreaterOrEqual(t, after, before)

	_, _, ok = CPU(-1)
	require.False(t, ok, "no such process")
}
