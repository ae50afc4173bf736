//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/internal/faultproxy"
)

// proxied starts a fault proxy in front of the test database and returns it
// with the database URL that goes through it.
func proxied(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	must(t, err, "parse TEST_DATABASE_URL")
	host := u.Host
	if u.Port() == "" {
		host += ":5432"
	}
	p, err := faultproxy.New(host)
	must(t, err, "start the fault proxy")
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// metric reads one unlabelled sample from a relay's /metrics.
func metric(addr, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

// The relay's connection to PostgreSQL goes through a fault proxy; the
// producers and a second relay connect directly.
//
//   - reset: every connection is closed every 500 ms for a while.
//   - stall: bytes are swallowed, connections stay open (a partition or a
//     dead host) for longer than the lease. The cut-off relay must notice on
//     its own (its lanes owned gauge falls to 0 and its database errors
//     rise while the link is still stalled: it timed out, it did not hang),
//     must write nothing while the other relay owns its lanes, and must be
//     back (owning lanes again) after the link heals.
//   - slow: 20 ms added to every chunk in both directions.
func TestNetworkToDatabase(t *testing.T) {
	outage := pick(5*time.Second, 60*time.Second)
	t.Run("reset", func(t *testing.T) {
		o := newOutbox(t, databaseURL)
		proxy, purl := proxied(t)
		path := filepath.Join(t.TempDir(), "out.jsonl")
		col := &fileCollector{paths: []string{path}}
		r := startRelay(t, o, purl, "cut", "", "--sink", sinkFile(path))
		l := startLoad(t, o, nil, loadShape{})
		waitDelivered(t, col, 300, 30*time.Second)
		end := time.Now().Add(outage)
		resets := 0
		for time.Now().Before(end) {
			proxy.Reset()
			resets++
			time.Sleep(500 * time.Millisecond)
		}
		cleared := time.Now()
		rs := []*relay{r}
		revive(t, rs)
		verify(t, fmt.Sprintf("DB link reset every 500ms for %s (%d resets)", outage, resets), o, l, col, cleared, 90*time.Second)
		rs[0].stop(t, 30*time.Second)
	})

	t.Run("stall", func(t *testing.T) {
		o := newOutbox(t, databaseURL)
		proxy, purl := proxied(t)
		dir := t.TempDir()
		cutPath, otherPath := filepath.Join(dir, "cut.jsonl"), filepath.Join(dir, "other.jsonl")
		col := &fileCollector{paths: []string{cutPath, otherPath}}
		admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		cut := startRelay(t, o, purl, "cut", "", "--sink", sinkFile(cutPath), "--admin-addr", admin)
		other := startRelay(t, o, "", "other", "", "--sink", sinkFile(otherPath))
		l := startLoad(t, o, nil, loadShape{})
		ctx := context.Background()
		var cutLanes map[int]bool
		if !within(20*time.Second, func() bool {
			var err error
			cutLanes, err = o.lanesOf(ctx, cut.id)
			return err == nil && len(cutLanes) > 0
		}) {
			t.Fatal("the relay behind the proxy owns no lane after 20s")
		}
		waitDelivered(t, col, 300, 30*time.Second)
		errsBefore, err := metric(admin, "wharf_database_errors_total")
		must(t, err, "read the cut-off relay's metrics")

		proxy.Stall()
		stalled := time.Now()
		// The other relay takes the lanes over once their leases ran out.
		var takenAt time.Time
		var sizeAtTakeover int64
		if !within(30*time.Second, func() bool {
			qs, err := o.lanesOf(ctx, other.id)
			if err != nil || len(qs) < 64 {
				return false
			}
			// Read after the takeover was seen: later growth is certainly
			// a write while another relay owned the lanes.
			takenAt, sizeAtTakeover = time.Now(), fileSize(cutPath)
			return true
		}) {
			t.Fatal("the other relay did not take every lane over within 30s of the stall")
		}
		// The cut-off relay must notice by itself, during the stall: its
		// database round trips time out (they do not hang) and count as
		// errors.
		var errs float64
		noticed := within(outage, func() bool {
			errs, err = metric(admin, "wharf_database_errors_total")
			return err == nil && errs > errsBefore
		})
		if !noticed {
			t.Errorf("during the stall the cut-off relay reports %v database errors (%v before): its round trips did not time out", errs, errsBefore)
		}
		if rest := outage - time.Since(stalled); rest > 0 {
			time.Sleep(rest)
		}
		if grew := fileSize(cutPath) - sizeAtTakeover; grew > 0 {
			t.Errorf("the cut-off relay wrote %d bytes after the other relay took its lanes over", grew)
		}
		proxy.Resume()
		cleared := time.Now()
		if !within(30*time.Second, func() bool {
			ls, err := o.lanesOf(ctx, cut.id)
			return cut.exited() || (err == nil && len(ls) > 0)
		}) {
			t.Errorf("the cut-off relay owns no lane 30s after the link healed")
		}
		back := time.Since(cleared)
		rs := []*relay{cut, other}
		revive(t, rs)
		res := verify(t, fmt.Sprintf("DB link stalled (no RST) for %s", outage), o, l, col, cleared, 90*time.Second)
		t.Logf("stall: takeover %s after the stall began; cut-off relay noticed=%v; owned lanes again %s after the link healed; recovery %s",
			takenAt.Sub(stalled).Round(10*time.Millisecond), noticed, back.Round(10*time.Millisecond), res.recovery)
		for _, r := range rs {
			r.stop(t, 30*time.Second)
		}
	})

	t.Run("slow", func(t *testing.T) {
		o := newOutbox(t, databaseURL)
		proxy, purl := proxied(t)
		path := filepath.Join(t.TempDir(), "out.jsonl")
		col := &fileCollector{paths: []string{path}}
		r := startRelay(t, o, purl, "slow", "", "--sink", sinkFile(path))
		l := startLoad(t, o, nil, loadShape{})
		waitDelivered(t, col, 300, 30*time.Second)
		proxy.Delay(20 * time.Millisecond)
		time.Sleep(outage)
		proxy.Delay(0)
		cleared := time.Now()
		rs := []*relay{r}
		revive(t, rs)
		verify(t, fmt.Sprintf("DB link +20ms per chunk for %s", outage), o, l, col, cleared, 90*time.Second)
		rs[0].stop(t, 30*time.Second)
	})
}

// The producers' connections to PostgreSQL go through a fault proxy; the
// relay connects directly. Connections are reset every 300 ms, then stalled
// for a few seconds: transactions whose COMMIT was cut off have an unknown
// outcome to the producer, and the ledger, written in the same
// transaction, says which committed. Every committed message must be
// delivered in order, and none of a transaction that did not commit.
func TestNetworkProducersToDatabase(t *testing.T) {
	window := pick(4*time.Second, 60*time.Second)
	stall := pick(3*time.Second, 20*time.Second)
	o := newOutbox(t, databaseURL)
	proxy, purl := proxied(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, purl)
	must(t, err, "connect the producers through the proxy")
	t.Cleanup(pool.Close)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	r := startRelay(t, o, "", "direct", "", "--sink", sinkFile(path))
	l := startLoad(t, o, pool, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)
	end := time.Now().Add(window)
	resets := 0
	for time.Now().Before(end) {
		proxy.Reset()
		resets++
		time.Sleep(300 * time.Millisecond)
	}
	proxy.Stall()
	time.Sleep(stall)
	proxy.Resume()
	proxy.Reset() // connections stalled mid-statement are dropped, as a dead peer's would be after a timeout
	cleared := time.Now()
	before := l.committed.Load()
	if !within(10*time.Second, func() bool { return l.committed.Load() > before+100 }) {
		t.Errorf("producers committed nothing within 10s after the link healed")
	}
	rs := []*relay{r}
	requireAlive(t, rs...)
	res := verify(t, fmt.Sprintf("producers' DB link reset every 300ms for %s (%d resets), then stalled %s", window, resets, stall), o, l, col, cleared, 90*time.Second)
	if l.errors.Load() == 0 {
		t.Errorf("no producer transaction failed: the fault did not reach the producers")
	}
	t.Logf("producer errors %d; messages %d", l.errors.Load(), res.messages)
	r.stop(t, 30*time.Second)
}
