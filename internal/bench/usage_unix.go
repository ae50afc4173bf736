//go:build unix

package bench

import (
	"os"
	"runtime"
	"syscall"
	"time"
)

// selfUsage returns this process's CPU time and peak RSS in bytes.
func selfUsage() (time.Duration, int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return cpu(&ru), rssBytes(int64(ru.Maxrss)), true //nolint:unconvert // int32 on 32-bit platforms
}

// processUsage returns an exited child's CPU time and peak RSS in bytes.
func processUsage(ps *os.ProcessState) (time.Duration, int64, bool) {
	if ps == nil {
		return 0, 0, false
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return 0, 0, false
	}
	return cpu(ru), rssBytes(int64(ru.Maxrss)), true //nolint:unconvert // int32 on 32-bit platforms
}

func cpu(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssBytes converts ru_maxrss: kilobytes on Linux and the BSDs, bytes on macOS.
func rssBytes(maxrss int64) int64 {
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return maxrss
	}
	return maxrss * 1024
}

func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
