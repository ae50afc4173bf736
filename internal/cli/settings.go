package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// signalContext is cancelled by the first SIGINT or SIGTERM. The handler is
// released right after it, so a second signal ends the process at once (Go's
// default handling) even if a graceful stop is stuck.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// errNotConfirmed is returned when the operator answered anything but yes.
var errNotConfirmed = errors.New("not confirmed: nothing was changed (pass --yes to confirm without a prompt)")

// confirm asks question on a terminal and needs "yes"; without a terminal it
// refuses unless --yes was given, so a script never deletes by accident.
func (g *globals) confirm(question, flag string, yes bool) error {
	if yes {
		return nil
	}
	if !g.terminal {
		return usageError{fmt.Errorf("%s needs confirmation: standard input is not a terminal, so pass --yes", flag)}
	}
	fmt.Fprintf(g.stderr, "%s\nType yes to continue: ", question)
	line, err := bufio.NewReader(g.stdin).ReadString('\n')
	if err != nil {
		fmt.Fprintln(g.stderr) // end of input: the terminal printed no newline
	}
	if strings.ToLower(strings.TrimSpace(line)) != "yes" {
		return errNotConfirmed
	}
	return nil
}

// byteSize is a flag holding a number of bytes, written as a plain number or
// with a unit: 512KiB, 64MiB, 1GiB (powers of 1024) or kB, MB, GB (powers of
// 1000).
type byteSize int64

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Type() string { return "bytes" }

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	i := len(s)
	for i > 0 && (s[i-1] < '0' || s[i-1] > '9') {
		i--
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	mult := map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || mult == 0 {
		return fmt.Errorf("want a number of bytes such as 67108864, 64MiB or 1GiB")
	}
	if n > (1<<63-1)/mult {
		return fmt.Errorf("%s is too large", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// minimums are the smallest values the relay's numeric settings accept;
// leaving a setting out means its default, but a given 0 or a negative
// value is refused rather than quietly replaced by the default.
var (
	intMinimums = map[string]int64{
		"fetch-batch":        64, // one row per lane
		"sink-batch":         1,
		"sink-concurrency":   1,
		"max-buffered":       64,
		"max-buffered-bytes": 1 << 20,
		"max-attempts":       1,
	}
	durationMinimums = map[string]time.Duration{
		"poll-interval":      time.Millisecond,
		"fetch-interval":     time.Microsecond,
		"lease-ttl":          time.Millisecond,
		"rebalance-interval": time.Millisecond,
		"retry-backoff":      time.Millisecond,
		"max-retry-backoff":  time.Millisecond,
		"stop-timeout":       time.Millisecond,
		"drain-timeout":      time.Millisecond,
	}
)

// checkRanges refuses a given setting below its minimum, naming the flag, the
// smallest value it takes, the value and where it came from.
func (g *globals) checkRanges(fs *pflag.FlagSet) error { return checkRanges(fs, g.sources) }

func checkRanges(fs *pflag.FlagSet, sources map[string]string) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || !f.Changed {
			return
		}
		from := ""
		if src, ok := sources[f.Name]; ok {
			from = " from " + src
		}
		if lo, ok := intMinimums[f.Name]; ok {
			var n int64
			switch v := f.Value.(type) {
			case *byteSize:
				n = int64(*v)
			default:
				n, _ = strconv.ParseInt(f.Value.String(), 10, 64)
			}
			if n < lo {
				shown := strconv.FormatInt(lo, 10)
				if f.Value.Type() == "bytes" {
					b := byteSize(lo)
					shown = b.String()
				}
				err = usageError{fmt.Errorf("--%s must be at least %s (got %s%s)", f.Name, shown, f.Value.String(), from)}
			}
		}
		if lo, ok := durationMinimums[f.Name]; ok {
			d, _ := time.ParseDuration(f.Value.String())
			if d < lo {
				err = usageError{fmt.Errorf("--%s must be at least %s (got %s%s)", f.Name, lo, d, from)}
			}
		}
	})
	return err
}
