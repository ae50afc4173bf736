//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/testdb"
)

// walCheck says how checkWAL judges a WAL scenario whose fault takes
// messages away with it (a history thrown away, a slot dropped): which
// committed messages must arrive, and which delivered messages that the
// database does not hold are no error.
type walCheck struct {
	// required reports whether the committed message at seq must reach the
	// destination; nil: every committed message must.
	required func(seq int64) bool
	// abandoned holds the ids of messages whose commit a producer attempted
	// on a history the database no longer has: delivering one is no error
	// (it committed, or may have, where the relay read it), and it is not
	// expected either.
	abandoned map[msgID]bool
}

// walTally is what checkWAL found besides the row.
type walTally struct {
	res result
	// counts is how often each committed message (of the database's
	// ledger) was delivered.
	counts map[msgID]int
	// optionalMissing counts the committed messages that walCheck.required
	// excused and that were not delivered.
	optionalMissing int
	// abandonedDelivered counts the distinct messages of an abandoned
	// history that were delivered.
	abandonedDelivered int
}

// checkWAL is verify keyed by message id (seq and nonce) rather than seq: on
// a WAL outbox a seq is a WAL position, and after the database went back in
// time the new history hands out positions the abandoned one had used. It
// stops the producers, waits (up to timeout) until every required committed
// message reached the destination, requires the outbox table to end empty,
// and checks that nothing delivered was rolled back or written by nobody and
// that first deliveries of committed messages are in per-key order. The
// caller adds its notes and prints the row (printRow).
func checkWAL(t *testing.T, name string, o *outbox, l *load, col collector, cleared time.Time, timeout time.Duration, chk walCheck) *walTally {
	t.Helper()
	l.stop()
	stopped := time.Now()
	led := o.ledger(t)
	rolled := l.rolledBack()
	want := map[msgID]bool{}
	for seq, r := range led {
		if !r.poison && (chk.required == nil || chk.required(seq)) {
			want[msgID{seq, r.nonce}] = true
		}
	}
	var streams [][]delivery
	var lastErr error
	done := within(timeout, func() bool {
		s, err := col.streams()
		if err != nil {
			lastErr = err
			return false
		}
		streams = s
		seen := map[msgID]bool{}
		for _, st := range s {
			for _, d := range st {
				seen[msgID{d.seq, d.nonce}] = true
			}
		}
		for id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	tl := &walTally{counts: map[msgID]int{}}
	res := &tl.res
	*res = result{scenario: name, messages: len(want), recovery: time.Since(cleared), tail: time.Since(stopped)}
	if !done {
		res.recovery, res.tail = -1, -1
		if lastErr != nil {
			t.Errorf("%s: reading the destination: %v", name, lastErr)
		}
	}
	var pending int
	if !within(pick(60*time.Second, 120*time.Second), func() bool {
		pending = o.count(t, "outbox")
		return pending == 0
	}) {
		t.Errorf("%s: %d messages still in the outbox table after the destination had them all", name, pending)
	}
	if s, err := col.streams(); err == nil {
		streams = s
	} else {
		t.Errorf("%s: reading the destination: %v", name, err)
	}

	abandoned := map[msgID]bool{}
	for si, st := range streams {
		first := map[[2]string]int64{}
		inStream := map[msgID]bool{}
		for i, d := range st {
			id := msgID{d.seq, d.nonce}
			r, ok := led[d.seq]
			if !ok || r.nonce != d.nonce {
				switch n, rb := rolled[d.seq]; {
				case rb && n == d.nonce:
					res.rolledBack++
					t.Errorf("%s: rolled-back message %d delivered", name, d.seq)
				case chk.abandoned[id]:
					abandoned[id] = true
				default:
					res.phantom++
					if res.phantom <= 5 {
						t.Errorf("%s: message %d (nonce %d, %q/%q) delivered, but no producer committed it", name, d.seq, d.nonce, d.topic, d.key)
					}
				}
				continue
			}
			tl.counts[id]++
			if r.topic != d.topic || r.key != d.key {
				t.Errorf("%s: message %d delivered as (%q, %q), enqueued as (%q, %q)", name, d.seq, d.topic, d.key, r.topic, r.key)
			}
			if inStream[id] {
				continue
			}
			inStream[id] = true
			k := [2]string{d.topic, d.key}
			if prev := first[k]; d.seq < prev {
				res.reordered++
				if res.reordered <= 5 {
					t.Errorf("%s: stream %d entry %d: (%q, %q) message %d first delivered after message %d", name, si, i, d.topic, d.key, d.seq, prev)
				}
			} else {
				first[k] = d.seq
			}
		}
	}
	tl.abandonedDelivered = len(abandoned)
	if res.phantom > 0 {
		t.Errorf("%s: %d delivered messages that no producer committed", name, res.phantom)
	}
	for _, n := range tl.counts {
		if n > 1 {
			res.dups += n - 1
		}
	}
	var missing []int64
	for id := range want {
		if tl.counts[id] == 0 {
			missing = append(missing, id.seq)
		}
	}
	for seq, r := range led {
		if !r.poison && !want[msgID{seq, r.nonce}] && tl.counts[msgID{seq, r.nonce}] == 0 {
			tl.optionalMissing++
		}
	}
	res.lost = len(missing)
	if res.lost > 0 {
		slices.Sort(missing)
		t.Errorf("%s: %d of %d committed messages never delivered; first: %v", name, res.lost, len(want), missing[:min(len(missing), 10)])
	}
	if res.reordered > 0 {
		t.Errorf("%s: %d messages first delivered out of per-key order", name, res.reordered)
	}
	return tl
}

// finishRow prints tl's row with the test's notes after extra.
func finishRow(t *testing.T, tl *walTally, l *load, extra string) {
	t.Helper()
	note := extra
	if n, ok := notes.Load(t.Name()); ok {
		if note != "" {
			note += "; "
		}
		note += n.(string)
	}
	tl.res.note = note
	printRow(t, tl.res, l)
}

// walLSN returns the server's current WAL insert position as a number (a
// WAL outbox's seqs are WAL positions). The insert position, not
// pg_current_wal_lsn (the write position, which may lag it): every record
// inserted before the call ends at or below it.
func walLSN(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var lsn int64
	var err error
	if !within(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = pool.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").Scan(&lsn)
		return err == nil
	}) {
		t.Fatalf("current WAL position: %v", err)
	}
	return lsn
}

// wharfCmd runs the wharf binary with args and returns its combined output.
func wharfCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, wharfBin, args...)
	cmd.Env = testdb.CleanEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// peakRSS returns the peak resident set size of process pid (VmHWM), in
// bytes.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// countDelivered is how many deliveries (copies included) col holds.
func countDelivered(col collector) int {
	s, err := col.streams()
	if err != nil {
		return 0
	}
	n := 0
	for _, st := range s {
		n += len(st)
	}
	return n
}
