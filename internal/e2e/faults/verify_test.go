//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// delivery is one message as a destination received it.
type delivery struct {
	seq        int64
	nonce      int64 // the id's random part: a seq alone can repeat after a crash (below)
	topic, key string
}

// collector reads what a destination received so far: one or more streams,
// each in the order the destination received it (a JSON-lines file, a
// JetStream stream, a Redis stream, a webhook receiver). Order is checked
// within a stream; completeness over all of them.
type collector interface {
	streams() ([][]delivery, error)
}

// jsonLine is the part of a JSON-lines sink's line the verifier reads.
type jsonLine struct {
	ID    string  `json:"id"`
	Seq   int64   `json:"seq"`
	Topic string  `json:"topic"`
	Key   *string `json:"key"`
}

func decodeLine(b []byte) (delivery, error) {
	var l jsonLine
	if err := json.Unmarshal(b, &l); err != nil {
		return delivery{}, err
	}
	seq, nonce, err := wharf.ParseID(l.ID)
	if err != nil || seq != l.Seq || seq <= 0 {
		return delivery{}, fmt.Errorf("no valid id/seq in %.120q", b)
	}
	d := delivery{seq: seq, nonce: nonce, topic: l.Topic}
	if l.Key != nil {
		d.key = *l.Key
	}
	return d, nil
}

// parseLines parses JSON lines. A relay SIGKILLed in the middle of a write
// leaves a torn line: either the file's unterminated end, or a fragment that
// another writer's complete line follows on the same line (then that line is
// recovered). torn counts them; the caller decides how many are acceptable.
func parseLines(data []byte) (out []delivery, torn int, err error) {
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			return out, torn + 1, nil
		}
		line := data[:nl]
		data = data[nl+1:]
		d, perr := decodeLine(line)
		if perr != nil {
			torn++
			at := bytes.LastIndex(line, []byte(`{"id":`))
			if at <= 0 {
				return out, torn, fmt.Errorf("unparseable line: %w", perr)
			}
			if d, perr = decodeLine(line[at:]); perr != nil {
				return out, torn, fmt.Errorf("unrecoverable torn line: %w", perr)
			}
		}
		out = append(out, d)
	}
	return out, torn, nil
}

// fileCollector reads JSON-lines files incrementally (complete lines only;
// an unterminated end is left for the next read and counted as torn while it
// lasts); maxTorn is how many torn lines SIGKILLed writers may have left in
// all of them together.
type fileCollector struct {
	paths   []string
	maxTorn int
	state   map[string]*fileState
}

type fileState struct {
	off  int64
	ds   []delivery
	torn int
}

func (c *fileCollector) streams() ([][]delivery, error) {
	if c.state == nil {
		c.state = map[string]*fileState{}
	}
	var out [][]delivery
	torn := 0
	for _, p := range c.paths {
		st := c.state[p]
		if st == nil {
			st = &fileState{}
			c.state[p] = st
		}
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			out = append(out, nil)
			continue
		}
		if err != nil {
			return nil, err
		}
		data, err := readFrom(f, st.off)
		_ = f.Close()
		if err != nil {
			return nil, err
		}
		if nl := bytes.LastIndexByte(data, '\n'); nl >= 0 {
			ds, n, err := parseLines(data[:nl+1])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			st.ds = append(st.ds, ds...)
			st.torn += n
			st.off += int64(nl + 1)
			data = data[nl+1:]
		}
		torn += st.torn
		if len(data) > 0 {
			torn++ // being written, or the end a killed writer left
		}
		out = append(out, slices.Clone(st.ds))
	}
	if torn > c.maxTorn {
		return out, fmt.Errorf("%d torn lines in %v, but only %d writers were killed", torn, c.paths, c.maxTorn)
	}
	return out, nil
}

func readFrom(f *os.File, off int64) ([]byte, error) {
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// listCollector is a destination the test receives itself (a webhook).
type listCollector struct {
	mu sync.Mutex
	ds []delivery
	at []time.Time // when each was received
}

func (c *listCollector) add(d delivery) {
	c.mu.Lock()
	c.ds = append(c.ds, d)
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
}

// firstCopiesBy returns when the destination held frac of n distinct
// messages (zero time if it never did).
func (c *listCollector) firstCopiesBy(n int, frac float64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[int64]bool{}
	want := int(float64(n) * frac)
	for i, d := range c.ds {
		seen[d.seq] = true
		if len(seen) >= want {
			return c.at[i]
		}
	}
	return time.Time{}
}

func (c *listCollector) streams() ([][]delivery, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return [][]delivery{slices.Clone(c.ds)}, nil
}

// result is one row of the fault matrix.
type result struct {
	scenario   string
	messages   int // committed messages expected at the destination
	lost       int
	reordered  int
	dups       int
	rolledBack int           // rolled-back messages delivered
	phantom    int           // delivered messages that never committed nor were rolled back
	dead       int           // poison messages dead-lettered
	recovery   time.Duration // fault cleared -> every committed message delivered
	tail       time.Duration // producers stopped -> every committed message delivered
	note       string
}

// verify waits (up to timeout) until every committed message reached the
// destination, counting from cleared (the moment the fault ended), then
// checks everything and prints the scenario's row. The producers must have
// been stopped.
func verify(t *testing.T, name string, o *outbox, l *load, col collector, cleared time.Time, timeout time.Duration) result {
	t.Helper()
	l.stop()
	stopped := time.Now()
	led := o.ledger(t)
	rolled := l.rolledBack()
	want := map[int64]ledgerRow{}
	poison := map[int64]bool{}
	for seq, r := range led {
		if r.poison {
			poison[seq] = true
		} else {
			want[seq] = r
		}
	}

	var streams [][]delivery
	var lastErr error
	complete := func() bool {
		s, err := col.streams()
		if err != nil {
			lastErr = err
			return false
		}
		streams = s
		seen := map[int64]bool{}
		for _, st := range s {
			for _, d := range st {
				seen[d.seq] = true
			}
		}
		for seq := range want {
			if !seen[seq] {
				return false
			}
		}
		return true
	}
	done := within(timeout, complete)
	res := result{scenario: name, messages: len(want), recovery: time.Since(cleared), tail: time.Since(stopped)}
	if !done {
		res.recovery, res.tail = -1, -1
		if lastErr != nil {
			t.Errorf("%s: reading the destination: %v", name, lastErr)
		}
	}
	// The outbox must end empty: nothing left pending or retrying.
	var pending int
	if !within(pick(30*time.Second, 120*time.Second), func() bool {
		pending = o.count(t, "outbox")
		return pending == 0
	}) {
		t.Errorf("%s: %d messages still in the outbox after the destination had them all", name, pending)
	}
	if s, err := col.streams(); err == nil {
		streams = s
	} else {
		t.Errorf("%s: reading the destination: %v", name, err)
	}

	seen := map[int64]int{}
	for _, st := range streams {
		first := map[[2]string]int64{}
		inStream := map[int64]bool{}
		for i, d := range st {
			seen[d.seq]++
			// After a crash the identity sequence can hand out again the
			// seqs of a transaction that rolled back (an abort's WAL is not
			// flushed, so the sequence's advance may be lost): the id's
			// nonce tells that message from the committed one.
			if n, ok := rolled[d.seq]; ok && n == d.nonce {
				res.rolledBack++
				t.Errorf("%s: rolled-back message %d delivered", name, d.seq)
				continue
			}
			r, ok := led[d.seq]
			if !ok {
				res.phantom++
				t.Errorf("%s: message %d delivered but never committed", name, d.seq)
				continue
			}
			if r.topic != d.topic || r.key != d.key {
				t.Errorf("%s: message %d delivered as (%q, %q), enqueued as (%q, %q)", name, d.seq, d.topic, d.key, r.topic, r.key)
			}
			if inStream[d.seq] {
				continue
			}
			inStream[d.seq] = true
			k := [2]string{d.topic, d.key}
			if prev := first[k]; d.seq < prev {
				res.reordered++
				if res.reordered <= 5 {
					t.Errorf("%s: stream %d entry %d: (%q, %q) message %d first delivered after message %d", name, i, i, d.topic, d.key, d.seq, prev)
				}
			} else {
				first[k] = d.seq
			}
		}
	}
	for _, n := range seen {
		if n > 1 {
			res.dups += n - 1
		}
	}
	var missing []int64
	for seq := range want {
		if seen[seq] == 0 {
			missing = append(missing, seq)
		}
	}
	res.lost = len(missing)
	if res.lost > 0 {
		slices.Sort(missing)
		t.Errorf("%s: %d of %d committed messages never delivered; first: %v", name, res.lost, len(want), missing[:min(len(missing), 10)])
	}
	if len(poison) > 0 {
		res.dead = o.deadCount(t, poison)
		if res.dead != len(poison) {
			t.Errorf("%s: %d poison messages committed, %d dead-lettered", name, len(poison), res.dead)
			res.lost += len(poison) - res.dead
		}
	}
	if res.reordered > 0 {
		t.Errorf("%s: %d messages first delivered out of per-key order", name, res.reordered)
	}
	if n, ok := notes.Load(t.Name()); ok {
		res.note = n.(string)
	}
	printRow(t, res, l)
	return res
}

func (o *outbox) deadCount(t *testing.T, seqs map[int64]bool) int {
	t.Helper()
	ids := make([]int64, 0, len(seqs))
	for s := range seqs {
		ids = append(ids, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	must(t, o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".dead_letters WHERE id = ANY($1)", ids).Scan(&n), "dead letters")
	return n
}

var rowsMu sync.Mutex

func printRow(t *testing.T, r result, l *load) {
	t.Helper()
	rec, tail := "not drained", "-"
	if r.recovery >= 0 {
		rec = r.recovery.Round(10 * time.Millisecond).String()
		tail = r.tail.Round(10 * time.Millisecond).String()
	}
	form := "short"
	if long {
		form = "long"
	}
	row := fmt.Sprintf("FAULTROW | %s | %s | %d | %d | %d | %d | %s | %s | rolled back delivered %d, dead-lettered %d, rolled back %d, producer errors %d | %s",
		r.scenario, form, r.messages, r.lost, r.reordered, r.dups, rec, tail, r.rolledBack, r.dead, len(l.rolledBack()), l.errors.Load(), r.note)
	t.Log(row)
	fmt.Println(row)
	if path := os.Getenv("WHARF_FAULTS_ROWS"); path != "" {
		rowsMu.Lock()
		defer rowsMu.Unlock()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err == nil {
			_, _ = fmt.Fprintln(f, row)
			_ = f.Close()
		}
	}
}

// waitDelivered waits until the destination holds at least n messages, so
// a fault starts under load.
func waitDelivered(t *testing.T, col collector, n int, timeout time.Duration) {
	t.Helper()
	got := 0
	if !within(timeout, func() bool {
		s, err := col.streams()
		if err != nil {
			return false
		}
		got = 0
		for _, st := range s {
			got += len(st)
		}
		return got >= n
	}) {
		t.Fatalf("only %d messages delivered within %s before the fault", got, timeout)
	}
}
