//go:build faults

package faults

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/wharfhq/wharf"
)

// server is a broker process the test owns: it can stop it and start it
// again with the same arguments (same port, same data directory).
type server struct {
	name string
	bin  string
	args []string
	addr string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startServer(t *testing.T, name, bin, addr string, args ...string) *server {
	t.Helper()
	s := &server{name: name, bin: bin, args: args, addr: addr, log: filepath.Join(t.TempDir(), name+".log")}
	s.start(t)
	t.Cleanup(func() {
		if s.cmd != nil {
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Logf("%s log tail:\n%s", name, b)
		}
	})
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	lf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	must(t, err, "open %s", s.log)
	defer lf.Close()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	must(t, cmd.Start(), "start %s", s.name)
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() { _ = cmd.Wait(); close(done) }()
	if !within(20*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}) {
		t.Fatalf("%s does not accept connections on %s after 20s", s.name, s.addr)
	}
}

// stop shuts the server down with SIGTERM (both nats-server and
// redis-server then flush what they acknowledged) and waits for it.
func (s *server) stop(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// brokerOutage runs one broker scenario: relays to sinkURL under load, the
// broker stopped for outage and started again, then the verifier.
func brokerOutage(t *testing.T, name, sinkURL string, srv *server, col collector, outage time.Duration, extra ...string) {
	t.Helper()
	o := newOutbox(t, databaseURL)
	args := append([]string{"--sink", sinkURL}, extra...)
	r1 := startRelay(t, o, "", "a", "", args...)
	r2 := startRelay(t, o, "", "b", "", args...)
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)
	srv.stop(t)
	time.Sleep(outage)
	srv.start(t)
	cleared := time.Now()
	rs := []*relay{r1, r2}
	revive(t, rs)
	time.Sleep(time.Second) // producers commit again before they stop
	verify(t, fmt.Sprintf("%s stopped %s under load", name, outage), o, l, col, cleared, pick(90*time.Second, 5*time.Minute))
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

// natsCollector reads a JetStream stream message by message, in stream order.
type natsCollector struct {
	nc     *nats.Conn
	js     nats.JetStreamContext
	stream string
	next   uint64
	got    []delivery
}

func (c *natsCollector) streams() ([][]delivery, error) {
	info, err := c.js.StreamInfo(c.stream)
	if err != nil {
		return nil, err
	}
	for c.next <= info.State.LastSeq {
		m, err := c.js.GetMsg(c.stream, c.next)
		if err != nil {
			return nil, err
		}
		seq, nonce, err := wharf.ParseID(m.Header.Get("Nats-Msg-Id"))
		if err != nil {
			return nil, fmt.Errorf("stream message %d: %w", c.next, err)
		}
		c.got = append(c.got, delivery{seq: seq, nonce: nonce, topic: strings.TrimPrefix(m.Subject, "wf."), key: m.Header.Get("Wharf-Key")})
		c.next++
	}
	return [][]delivery{c.got}, nil
}

// nats-server with JetStream, own process and store, stopped and started
// again. strict_order=true: first copies must be in per-key order.
func TestNATSOutage(t *testing.T) {
	srv, col := startNATS(t)
	addr := srv.addr
	sink := "nats://" + addr + "?stream=WF&subject_template=wf.{{topic}}&strict_order=true&ack_timeout=2s"
	brokerOutage(t, "nats-server", sink, srv, col, pick(5*time.Second, 60*time.Second))
}

// redisCollector reads the Redis streams wf:<topic> in stream order.
type redisCollector struct {
	rdb    *redis.Client
	topics []string
	last   map[string]string
	got    map[string][]delivery
}

func (c *redisCollector) streams() ([][]delivery, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out [][]delivery
	for _, topic := range c.topics {
		start := "-"
		if l := c.last[topic]; l != "" {
			start = "(" + l
		}
		xs, err := c.rdb.XRange(ctx, "wf:"+topic, start, "+").Result()
		if err != nil {
			return nil, err
		}
		for _, x := range xs {
			id, _ := x.Values["id"].(string)
			seq, nonce, err := wharf.ParseID(id)
			if err != nil {
				return nil, fmt.Errorf("redis entry %s: %w", x.ID, err)
			}
			tp, _ := x.Values["topic"].(string)
			key, _ := x.Values["key"].(string)
			c.got[topic] = append(c.got[topic], delivery{seq: seq, nonce: nonce, topic: tp, key: key})
			c.last[topic] = x.ID
		}
		out = append(out, c.got[topic])
	}
	return out, nil
}

// startRedis starts the test's own redis-server (append-only file fsynced
// on every write) and returns it and a collector reading its streams
// directly.
func startRedis(t *testing.T) (*server, *redisCollector) {
	t.Helper()
	bin := needBinary(t, "redis-server")
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	srv := startServer(t, "redis-server", bin, addr, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", t.TempDir(), "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no")
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, &redisCollector{rdb: rdb, topics: []string{"orders", "users", "audit"}, last: map[string]string{}, got: map[string][]delivery{}}
}

// redisSink is the sink URL of a redis-server at addr.
func redisSink(addr string) string {
	return "redis://" + addr + "/0?stream_template=wf:{{topic}}&timeout=2s"
}

// redis-server, own process, stopped and started again.
func TestRedisOutage(t *testing.T) {
	srv, col := startRedis(t)
	brokerOutage(t, "redis-server", redisSink(srv.addr), srv, col, pick(5*time.Second, 60*time.Second))
}

// webhook is an HTTP receiver that records what it accepted. While failing
// it answers 500 and 429 (Retry-After: 1) in turn; it always answers 500 to
// poison messages.
type webhook struct {
	listCollector
	srv      *httptest.Server
	failing  atomic.Bool
	requests atomic.Int64
	refused  atomic.Int64
}

func newWebhook(t *testing.T) *webhook {
	t.Helper()
	w := &webhook{}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := w.requests.Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			rw.WriteHeader(http.StatusBadRequest)
			return
		}
		if w.failing.Load() {
			w.refused.Add(1)
			if n%2 == 0 {
				rw.Header().Set("Retry-After", "1")
				rw.WriteHeader(http.StatusTooManyRequests)
				return
			}
			rw.WriteHeader(http.StatusInternalServerError)
			return
		}
		if strings.Contains(string(body), poisonMark) {
			rw.WriteHeader(http.StatusInternalServerError)
			return
		}
		seq, nonce, err := wharf.ParseID(r.Header.Get("webhook-id"))
		if err != nil {
			rw.WriteHeader(http.StatusBadRequest)
			return
		}
		w.add(delivery{seq: seq, nonce: nonce, topic: r.Header.Get("wharf-topic"), key: r.Header.Get("wharf-key")})
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *webhook) sinkURL() string {
	return w.srv.URL + "/in/{{topic}}?wharf_allow_private=true"
}

// A webhook receiver answers 500 and 429 with Retry-After for a while, then
// 2xx. Webhooks send a key's messages one at a time, so the receiver's
// arrival order of first copies must be per-key order.
func TestWebhookFailingThenOK(t *testing.T) {
	w := newWebhook(t)
	o := newOutbox(t, databaseURL)
	r1 := startRelay(t, o, "", "a", "", "--sink", w.sinkURL(), "--retry-backoff", "200ms", "--max-retry-backoff", "2s", "--max-attempts", "1000")
	r2 := startRelay(t, o, "", "b", "", "--sink", w.sinkURL(), "--retry-backoff", "200ms", "--max-retry-backoff", "2s", "--max-attempts", "1000")
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, w, 300, 30*time.Second)
	outage := pick(5*time.Second, 60*time.Second)
	w.failing.Store(true)
	time.Sleep(outage)
	w.failing.Store(false)
	cleared := time.Now()
	rs := []*relay{r1, r2}
	revive(t, rs)
	time.Sleep(time.Second)
	res := verify(t, fmt.Sprintf("webhook 500/429+Retry-After for %s", outage), o, l, w, cleared, 90*time.Second)
	t.Logf("webhook: %d requests, %d refused during the outage; recovery %s", w.requests.Load(), w.refused.Load(), res.recovery)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}
