//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wharfhq/wharf/internal/testdb"
)

// Three relays append to one file while producers commit; one relay after
// another is SIGKILLed and replaced by a new process. The relays share the
// file (the file sink makes one O_APPEND write per batch, so the file is the
// global delivery order) and the verifier checks first deliveries per key
// over all of it, tolerating one torn line per kill.
func TestRelayKill9UnderLoad(t *testing.T) {
	relayKill9UnderLoad(t, newOutbox(t, databaseURL), "")
}

// The same in WAL mode: one of the three relays streams the slot and the
// others stand by; a killed streamer's lanes and slot go to a standby after
// the lease TTL.
func TestWALRelayKill9UnderLoad(t *testing.T) {
	url, err := testdb.LogicalURL()
	must(t, err, "start a cluster with wal_level=logical")
	relayKill9UnderLoad(t, newWALOutbox(t, url), ", WAL mode")
}

// relayKill9UnderLoad runs the kill -9 scenario on o; suffix ends the
// scenario's name.
func relayKill9UnderLoad(t *testing.T, o *outbox, suffix string) {
	path := filepath.Join(t.TempDir(), "shared.jsonl")
	col := &fileCollector{paths: []string{path}}
	relays := make([]*relay, 3)
	for i := range relays {
		relays[i] = startRelay(t, o, "", fmt.Sprintf("r%d", i), "", "--sink", sinkFile(path), "--fetch-batch", "500")
	}
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 200, 30*time.Second)

	kills := pick(3, 20)
	every := pick(1500*time.Millisecond, 3*time.Second)
	var lastKill time.Time
	for i := 0; i < kills; i++ {
		n := i % len(relays)
		requireAlive(t, relays...)
		relays[n].kill9(t)
		lastKill = time.Now()
		col.maxTorn++
		time.Sleep(200 * time.Millisecond)
		relays[n] = startRelay(t, o, "", fmt.Sprintf("r%d-g%d", n, i+1), "", "--sink", sinkFile(path), "--fetch-batch", "500")
		time.Sleep(every)
	}
	revive(t, relays)
	// Recovery counts from the last kill: its lanes wait for the 3 s lease.
	verify(t, fmt.Sprintf("relay kill -9 x%d (3 relays, shared file%s)", kills, suffix), o, l, col, lastKill, 90*time.Second)
	for _, r := range relays {
		r.stop(t, 20*time.Second)
	}
}

// A relay is SIGSTOPped past its lease; the other relay takes its lanes over
// and delivers them; then the paused relay gets SIGCONT. Each relay has its
// own file, so what the paused relay wrote after SIGCONT is the tail of its
// file beyond the size it had when it stopped. Two checks:
//
//  1. Between SIGCONT and the moment the database shows it owning a lane
//     again, its file must not grow (polled: the size is read first, then
//     the lanes table; growth seen while it owns no lane is a publish
//     without a lease).
//  2. Nothing it wrote after SIGCONT may be a message of the lanes it lost
//     that the new owner had already delivered (the new owner removes
//     what it delivered before it releases a lane, so such a line can only
//     come from the paused relay's stale memory).
//
// A pause that lands inside a sink call used to let that call's write happen
// after SIGCONT (bug 3, see TestPausedRelayDoesNotWriteAfterLeaseLoss).
func TestRelaySIGSTOPPastLease(t *testing.T) {
	sigstopRounds(t, "relay SIGSTOP past lease", loadShape{producers: 4, pause: 2 * time.Millisecond}, pick(1, 5), true)
}

// sigstopRounds runs the SIGSTOP scenario; strict makes a write after the
// lease was lost fail the test (otherwise it is logged and noted).
func sigstopRounds(t *testing.T, name string, shape loadShape, rounds int, strict bool) (violations, stale int) {
	t.Helper()
	report := t.Errorf
	if !strict {
		report = func(format string, args ...any) { t.Logf("KNOWN BUG: "+format, args...) }
	}
	o := newOutbox(t, databaseURL)
	dir := t.TempDir()
	pPath, qPath := filepath.Join(dir, "paused.jsonl"), filepath.Join(dir, "other.jsonl")
	col := &fileCollector{paths: []string{pPath, qPath}}
	p := startRelay(t, o, "", "paused", "", "--sink", sinkFile(pPath))
	q := startRelay(t, o, "", "other", "", "--sink", sinkFile(qPath))
	l := startLoad(t, o, nil, shape)
	ctx := context.Background()
	var lost map[int]bool
	if !within(20*time.Second, func() bool {
		ps, err1 := o.lanesOf(ctx, p.id)
		qs, err2 := o.lanesOf(ctx, q.id)
		lost = ps
		return err1 == nil && err2 == nil && len(ps) > 0 && len(qs) > 0 && len(ps)+len(qs) == 64
	}) {
		t.Fatal("the two relays did not share the 64 lanes within 20s")
	}
	waitDelivered(t, col, 500, 30*time.Second)

	var postLines int
	for round := 0; round < rounds; round++ {
		requireAlive(t, p, q)
		lost, _ = o.lanesOf(ctx, p.id)
		p.signal(t, syscall.SIGSTOP)
		time.Sleep(50 * time.Millisecond)
		stopSize := fileSize(pPath)
		if !within(30*time.Second, func() bool {
			qs, err := o.lanesOf(ctx, q.id)
			if err != nil {
				return false
			}
			for lane := range lost {
				if !qs[lane] {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("round %d: the other relay did not take over the paused relay's %d lanes within 30s", round, len(lost))
		}
		time.Sleep(pick(time.Second, 3*time.Second)) // the new owner delivers on the taken lanes
		p.signal(t, syscall.SIGCONT)
		contAt := time.Now()
		reacquired := time.Duration(-1)
		for time.Since(contAt) < 5*time.Second {
			size := fileSize(pPath)
			owned, err := o.lanesOf(ctx, p.id)
			if err != nil {
				continue
			}
			if len(owned) > 0 {
				reacquired = time.Since(contAt)
				break
			}
			if size > stopSize {
				violations++
				report("round %d: the paused relay's file grew by %d bytes %s after SIGCONT while it owned no lane", round, size-stopSize, time.Since(contAt).Round(time.Millisecond))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("round %d: %d lanes taken over; paused relay owned lanes again %s after SIGCONT", round, len(lost), reacquired)

		// Check 2, once the paused relay had time to write whatever it held.
		time.Sleep(500 * time.Millisecond)
		data, err := os.ReadFile(pPath)
		must(t, err, "read %s", pPath)
		post, _, err := parseLines(data[stopSize:])
		must(t, err, "parse %s after SIGCONT", pPath)
		postLines += len(post)
		qData, err := os.ReadFile(qPath)
		must(t, err, "read %s", qPath)
		qs, _, err := parseLines(qData)
		must(t, err, "parse %s", qPath)
		byQ := map[int64]bool{}
		for _, d := range qs {
			byQ[d.seq] = true
		}
		for _, d := range post {
			lane := o.laneOf(t, d.key)
			if lost[lane] && byQ[d.seq] {
				stale++
				if stale <= 5 {
					report("round %d: after SIGCONT the paused relay wrote message %d (lane %d), which the new owner had delivered", round, d.seq, lane)
				}
			}
		}
		time.Sleep(time.Second)
	}
	cleared := time.Now()
	if violations+stale > 0 {
		addNote(t, "KNOWN BUG: %d writes by the paused relay without a lease, %d messages it wrote again after the new owner had delivered them", violations, stale)
	}
	res := verify(t, fmt.Sprintf("%s x%d", name, rounds), o, l, col, cleared, 60*time.Second)
	t.Logf("SIGSTOP: %d rounds, %d lines by the paused relay after SIGCONT, %d publishes without a lease, %d stale redeliveries; %d duplicates in all",
		rounds, postLines, violations, stale, res.dups)
	p.stop(t, 20*time.Second)
	q.stop(t, 20*time.Second)
	return violations, stale
}

// laneOf is the lane of a key, as the outbox computes it.
func (o *outbox) laneOf(t *testing.T, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lane int
	must(t, o.pool.QueryRow(ctx, "SELECT hashtext($1) & 63", key).Scan(&lane), "lane of %q", key)
	return lane
}
