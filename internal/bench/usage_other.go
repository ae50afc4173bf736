//go:build !unix

package bench

import (
	"os"
	"time"
)

func selfUsage() (time.Duration, int64, bool) { return 0, 0, false }

func processUsage(*os.ProcessState) (time.Duration, int64, bool) { return 0, 0, false }

func terminate(p *os.Process) error { return p.Kill() }
