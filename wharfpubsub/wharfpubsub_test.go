package wharfpubsub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/tcpgate"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// The clients stop their goroutines at Close (leakcheck ignores the one
// worker opencensus, a dependency of the client, starts per process).
func TestMain(m *testing.M) { leakcheck.Main(m) }

const project = "wharf-test"

func randomID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// world is one test's Pub/Sub: pstest, the library's own in-process server,
// reached over gRPC (directly, or through a gate for the outage case).
type world struct {
	srv    *pstest.Server
	client *pubsub.Client // the sink's
	gate   *tcpgate.Gate
	prefix string // of the conformance sink's topic IDs
}

// newClient dials addr and returns a client that is closed at t's cleanup.
func newClient(t testing.TB, addr string) *pubsub.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pubsub.NewClient(context.Background(), project, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = conn.Close() })
	return c
}

func newWorld(t testing.TB, gated bool, topics ...string) *world {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	w := &world{srv: srv}
	addr := srv.Addr
	if gated {
		w.gate = tcpgate.New(t, srv.Addr)
		addr = w.gate.Addr()
	}
	w.client = newClient(t, addr)
	admin := newClient(t, srv.Addr)
	for _, topic := range topics {
		createTopic(t, admin, topic)
	}
	return w
}

func createTopic(t testing.TB, c *pubsub.Client, id string) {
	t.Helper()
	_, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: "projects/" + project + "/topics/" + id})
	if err != nil {
		t.Fatalf("create topic %s: %v", id, err)
	}
}

// received returns what the server stored for the topic IDs, in the order
// it stored them.
func (w *world) received(topicIDs ...string) []wharfsinktest.Received {
	want := map[string]bool{}
	for _, id := range topicIDs {
		want["projects/"+project+"/topics/"+id] = true
	}
	var out []wharfsinktest.Received
	for _, m := range w.srv.Messages() {
		if !want[m.Topic] {
			continue
		}
		r := wharfsinktest.Received{Payload: m.Data}
		for k, v := range m.Attributes {
			switch k {
			case AttrID:
				r.ID = v
			case AttrTopic:
				r.Topic = v
			case AttrKey:
				r.Key = v
			default:
				if r.Headers == nil {
					r.Headers = map[string]string{}
				}
				r.Headers[k] = v
			}
		}
		if r.Key != "" && m.OrderingKey != r.Key {
			r.Key = "ordering key " + m.OrderingKey + " does not match " + r.Key
		}
		out = append(out, r)
	}
	return out
}

type harness struct {
	worlds wharfsinktest.PerTest[*world]
}

func (h *harness) open(t *testing.T, gated bool) wharf.Sink {
	prefix := "w" + randomID() + "-"
	var ids []string
	for _, topic := range wharfsinktest.Topics() {
		ids = append(ids, prefix+topic)
	}
	w := newWorld(t, gated, ids...)
	w.prefix = prefix
	h.worlds.Set(t, w)
	s, err := New(w.client, Options{TopicTemplate: prefix + "{{topic}}", PublishTimeout: 20 * time.Second, MaxMessageBytes: maxPayload + 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

const maxPayload = 2_000_000

func TestConformance(t *testing.T) {
	t.Parallel()
	h := &harness{}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          func(t *testing.T) wharf.Sink { return h.open(t, false) },
		NewBreakableSink: func(t *testing.T) wharf.Sink { return h.open(t, true) },
		Consume: func(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
			w := h.worlds.Get(t)
			// Publish acknowledged only what the server stored, so what
			// it holds now is what it received: no waiting is needed.
			var ids []string
			for _, topic := range topics {
				ids = append(ids, w.prefix+topic)
			}
			return w.received(ids...)
		},
		BreakBroker: func(t *testing.T) { h.worlds.Get(t).gate.Shut() },
		HealBroker:  func(t *testing.T) { h.worlds.Get(t).gate.Open(t) },
		Features:    wharfsinktest.Features{MaxPayload: maxPayload, SupportsHeaders: true},
	})
}

func msg(id int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(id, id*7919), Seq: id, Topic: topic, Key: key, Payload: []byte(payload), Attempt: 1}
}

// TestPauseAndResume checks the client's pause of a failed ordering key:
// the first failure is reported as it came, the key's later messages fail
// too (in the same request, or not attempted once the key is paused), and
// the sink resumes the key so that the relay's retry of the same batch goes
// through once the cause is gone (here: the topic is created); without the
// resume the client would fail the key's messages at once.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	s, err := New(w.client, Options{TopicTemplate: "late-{{topic}}"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	msgs := []*wharf.Message{msg(1, "orders", "k", "1"), msg(2, "orders", "k", "2"), msg(3, "orders", "k", "3"), msg(4, "orders", "j", "4")}
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	if errs[0] == nil || wharf.IsPermanent(errs[0]) || errors.Is(errs[0], wharf.ErrNotAttempted) || !strings.Contains(errs[0].Error(), "does not exist") {
		t.Fatalf("the first message of a missing topic: %v, want a retryable error saying the topic does not exist", errs[0])
	}
	for _, i := range []int{1, 2} {
		if errs[i] == nil || wharf.IsPermanent(errs[i]) {
			t.Fatalf("message %d behind the failed one of its key: %v, want a retryable failure", i, errs[i])
		}
	}
	if errs[3] == nil {
		t.Fatal("the other key's message was acknowledged without a topic")
	}
	createTopic(t, newClient(t, w.srv.Addr), "late-orders")
	if errs := s.Publish(ctx, msgs); errs != nil {
		t.Fatalf("the retried batch after the topic was created: %v (was the key resumed?)", errs)
	}
	got := w.received("late-orders")
	var k []string
	for _, r := range got {
		if r.Key == "k" {
			k = append(k, r.ID)
		}
	}
	if len(got) != 4 || len(k) != 3 || k[0] != msgs[0].ID || k[1] != msgs[1].ID || k[2] != msgs[2].ID {
		t.Fatalf("the topic holds %+v, want the 3 messages of key k in order and the one of key j", got)
	}
}

// TestRefused checks what Pub/Sub cannot take fails permanently before
// sending, with the key's later messages not attempted; a key of 1,024
// bytes, Pub/Sub's limit, goes through.
func TestRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false, "refused")
	s, err := New(w.client, Options{TopicTemplate: "{{topic}}", MaxMessageBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bad := []*wharf.Message{
		msg(1, "refused", "a", strings.Repeat("x", 5000)),
		msg(3, "refused", "b", "x"),
		msg(5, "refused", "c", "x"),
		msg(7, "no", "d", "x"),
		msg(9, "refused", strings.Repeat("k", 1025), "x"),
	}
	bad[1].Headers = map[string]string{"googclient_x": "1"}
	bad[2].Headers = map[string]string{"wharf-id": "forged"}
	var msgs []*wharf.Message
	for i, m := range bad {
		msgs = append(msgs, m, msg(int64(2*i+2), m.Topic, m.Key, "behind"))
	}
	long := msg(100, "refused", strings.Repeat("k", 1024), "long key")
	msgs = append(msgs, long)
	errs := s.Publish(context.Background(), msgs)
	for i := range bad {
		if !wharf.IsPermanent(errs[2*i]) {
			t.Errorf("message %d: %v, want permanent", 2*i, errs[2*i])
		}
		if !errors.Is(errs[2*i+1], wharf.ErrNotAttempted) {
			t.Errorf("message %d: %v, want ErrNotAttempted", 2*i+1, errs[2*i+1])
		}
	}
	if errs[len(errs)-1] != nil {
		t.Fatalf("the long key: %v", errs[len(errs)-1])
	}
	got := w.received("refused")
	if len(got) != 1 || got[0].ID != long.ID || got[0].Key != long.Key {
		t.Fatalf("the topic holds %+v", got)
	}
}

// TestOpen opens the sink from a URL against pstest and pings it.
func TestOpen(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false, "opened")
	ctx := context.Background()
	s, err := Open(ctx, mustURL(t, "pubsub://"+project+"?endpoint="+w.srv.Addr+"&topic_template=opened"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.(wharf.Pinger).Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if errs := s.Publish(ctx, []*wharf.Message{msg(1, "x", "k", "hi")}); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	if got := w.received("opened"); len(got) != 1 || string(got[0].Payload) != "hi" {
		t.Fatalf("topic holds %+v", got)
	}
	if _, err := Open(ctx, mustURL(t, "pubsub://"+project+"?endpoint="+w.srv.Addr+"&topic_template=missing")); err == nil {
		t.Fatal("Open with a missing fixed topic succeeded")
	}
}

func mustURL(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestURLErrors(t *testing.T) {
	t.Parallel()
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURLEnv(u, ""); return err }, map[string]string{
		"pubsub://":                      "the project ID is empty",
		"pubsub://?endpoint=127.0.0.1:1": "the project ID is empty",
		"pubsub://Bad_Project":           "not a Google Cloud project ID",
		"pubsub://user:" + wharfsinktest.Secret + "@my-proj": "Application Default Credentials",
		"pubsub://my-project?bogus=1":                        `unknown option "bogus"`,
		"pubsub://my-project?topic_template=ab":              "3 to 255",
		"pubsub://my-project?topic_template=goog{{topic}}":   `"goog"`,
		"pubsub://my-project?endpoint=localhost":             `endpoint="localhost"`,
		"pubsub://my-project?publish_timeout=soon":           `publish_timeout="soon"`,
		"pubsub://my-project?max_message_bytes=20000000":     `max_message_bytes="20000000"`,
		"pubsub://my-project/path":                           "write pubsub://PROJECT",
		"pubsub://my-project?ce=json":                        `ce="json": want binary or structured`,
		"pubsub://my-project?ce_source=/s":                   "no content mode",
		"pubsub://my-project?ce=binary&ce_source=a%20b":      "white space",
	})
}

// TestEmulatorProject checks that with an emulator, named by endpoint or by
// PUBSUB_EMULATOR_HOST, the project ID need not be a Google Cloud one:
// pubsub://test opens against pstest and publishes to projects/test.
func TestEmulatorProject(t *testing.T) {
	for raw, env := range map[string]string{
		"pubsub://test?endpoint=127.0.0.1:1": "",
		"pubsub://test":                      "127.0.0.1:1",
		"pubsub://Emu_Project":               "127.0.0.1:1",
	} {
		cfg, err := parseURLEnv(mustURL(t, raw), env)
		if err != nil {
			t.Fatalf("%s with PUBSUB_EMULATOR_HOST=%q: %v", raw, env, err)
		}
		if want := strings.TrimPrefix(strings.Split(raw, "?")[0], "pubsub://"); cfg.project != want {
			t.Fatalf("%s: project %q, want %q", raw, cfg.project, want)
		}
	}
	if _, err := parseURLEnv(mustURL(t, "pubsub://test"), ""); err == nil || !strings.Contains(err.Error(), "an emulator, named by endpoint or PUBSUB_EMULATOR_HOST, takes any ID") {
		t.Fatalf("pubsub://test without an emulator: %v, want the project ID refused", err)
	}

	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	admin := newClient(t, srv.Addr)
	if _, err := admin.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: "projects/test/topics/w-orders-paid"}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := Open(ctx, mustURL(t, "pubsub://test?endpoint="+srv.Addr+"&topic_template="+url.QueryEscape("w-{{topic|dashes}}")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if errs := s.Publish(ctx, []*wharf.Message{msg(1, "orders.paid", "k", "hi")}); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	if got := srv.Messages(); len(got) != 1 || got[0].Topic != "projects/test/topics/w-orders-paid" || string(got[0].Data) != "hi" {
		t.Fatalf("pstest holds %+v", got)
	}

	// PUBSUB_EMULATOR_HOST itself, as the client reads it.
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	if _, err := parseURL(mustURL(t, "pubsub://test")); err != nil {
		t.Fatalf("pubsub://test with PUBSUB_EMULATOR_HOST set: %v", err)
	}
}

// BenchmarkPublish measures the sink against pstest, in process: the
// client's bundling and the fake's rate, not Pub/Sub's.
func BenchmarkPublish(b *testing.B) {
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		w := newWorld(b, false, "bench-"+wharfsinktest.TopicOrders)
		s, err := New(w.client, Options{TopicTemplate: "bench-{{topic}}"})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}
