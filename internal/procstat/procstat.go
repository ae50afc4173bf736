// Package procstat reads a process's CPU time from Linux's /proc, for the
// benchmarks that count the database server's side of a relay's work.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU returns the user and system CPU process pid of this machine has
// used, with its command name; false when it cannot be read (no such
// process here, or no /proc). Linux counts in clock ticks of 10 ms.
func CPU(pid int) (used time.Duration, comm string, ok bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	// "pid (comm) state ...": the command may hold spaces and parentheses,
	// so it ends at the last ')'. After it, utime and stime are the 12th
	// and 13th fields.
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return 0, "", false
	}
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 13 {
		return 0, "", false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, "", false
	}
	return time.Duration(u+s) * 10 * time.Millisecond, string(stat[open+1 : end]), true
}
