package wharfkinesis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/internal/tcpgate"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// Every test closes the idle connections of the HTTP clients it made.
func TestMain(m *testing.M) { leakcheck.Main(m) }

const adminTimeout = 30 * time.Second

func randomID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func client(t testing.TB, srv *awstest.Server, endpoint string) *kinesis.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := srv.Config()
	cfg.HTTPClient = &http.Client{Transport: tr}
	return kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

// createStream creates a stream of two shards (active at once on
// kinesalite, as the tests start it).
func createStream(t testing.TB, c *kinesis.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(2)}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	for {
		out, err := c.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
		if err != nil {
			t.Fatalf("describe stream %s: %v", name, err)
		}
		if out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream %s is not active", name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// envelopeRecord is the JSON envelope as a consumer reads it.
type envelopeRecord struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
}

func decode(data []byte) (wharfsinktest.Received, error) {
	var e envelopeRecord
	if err := json.Unmarshal(data, &e); err != nil {
		return wharfsinktest.Received{}, fmt.Errorf("record is not the JSON envelope: %w", err)
	}
	r := wharfsinktest.Received{ID: e.ID, Topic: e.Topic, Payload: e.Payload}
	if e.Key != nil {
		r.Key = *e.Key
	}
	if len(e.Headers) > 0 {
		r.Headers = e.Headers
	}
	if e.PayloadEncoding == "base64" {
		var s string
		if err := json.Unmarshal(e.Payload, &s); err != nil {
			return r, err
		}
		p, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return r, err
		}
		r.Payload = p
	}
	return r, nil
}

// readAll returns every record of stream, shard by shard, in each shard's
// order (a key's records are all in one shard).
func readAll(t testing.TB, c *kinesis.Client, stream string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatalf("list shards of %s: %v", stream, err)
	}
	var out [][]byte
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			t.Fatalf("shard iterator: %v", err)
		}
		iter := it.ShardIterator
		for iter != nil {
			recs, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
			if err != nil {
				t.Fatalf("get records: %v", err)
			}
			for _, r := range recs.Records {
				out = append(out, r.Data)
			}
			if len(recs.Records) == 0 {
				break
			}
			iter = recs.NextShardIterator
		}
	}
	return out
}

type world struct {
	srv    *awstest.Server
	admin  *kinesis.Client
	prefix string
	gate   *tcpgate.Gate
}

type harness struct {
	srv    *awstest.Server
	worlds wharfsinktest.PerTest[*world]
}

func (h *harness) open(t *testing.T, gated bool) wharf.Sink {
	w := &world{srv: h.srv, admin: client(t, h.srv, h.srv.Endpoint), prefix: "w" + randomID() + "-"}
	for _, topic := range wharfsinktest.Topics() {
		createStream(t, w.admin, w.prefix+topic)
	}
	endpoint := h.srv.Endpoint
	if gated {
		w.gate = h.srv.NewGate(t)
		endpoint = w.gate.Endpoint()
	}
	h.worlds.Set(t, w)
	s, err := New(client(t, h.srv, endpoint), Options{StreamTemplate: w.prefix + "{{topic}}"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// maxPayload keeps a random payload, in base64 inside the envelope, under
// Kinesis's 1 MiB record; twice it does not fit.
const maxPayload = 700_000

func TestConformance(t *testing.T) {
	t.Parallel()
	h := &harness{srv: awstest.StartKinesalite(t)}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink:          func(t *testing.T) wharf.Sink { return h.open(t, false) },
		NewBreakableSink: func(t *testing.T) wharf.Sink { return h.open(t, true) },
		Consume: func(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
			// Publish acknowledged only what Kinesis stored, so the
			// streams hold it now: no waiting is needed.
			w := h.worlds.Get(t)
			var all []wharfsinktest.Received
			for _, topic := range topics {
				for _, data := range readAll(t, w.admin, w.prefix+topic) {
					r, err := decode(data)
					if err != nil {
						t.Fatal(err)
					}
					all = append(all, r)
				}
			}
			return all
		},
		BreakBroker: func(t *testing.T) { h.worlds.Get(t).gate.Shut() },
		HealBroker:  func(t *testing.T) { h.worlds.Get(t).gate.Open(t) },
		Features:    wharfsinktest.Features{MaxPayload: maxPayload, SupportsHeaders: true},
	})
}

func msg(id int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(id, id*7919), Seq: id, Topic: topic, Key: key, Payload: []byte(payload), Attempt: 1}
}

// TestRecords checks the partition keys, the raw format, a missing stream
// (retried, with the key's later messages not attempted) and one message of
// a key per request.
func TestRecords(t *testing.T) {
	t.Parallel()
	srv := awstest.StartKinesalite(t)
	c := client(t, srv, srv.Endpoint)
	p := "r" + randomID() + "-"
	createStream(t, c, p+"raw")
	ctx := context.Background()
	s, err := New(c, Options{StreamTemplate: p + "{{topic}}", Format: FormatRaw})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 300)
	msgs := []*wharf.Message{msg(1, "raw", "a", "one"), msg(2, "raw", "a", "two"), msg(3, "raw", "", "three"), msg(4, "raw", long, "four"),
		msg(5, "missing", "m", "x"), msg(6, "missing", "m", "y")}
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results", len(errs))
	}
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("message %d: %v", i, errs[i])
		}
	}
	if errs[4] == nil || wharf.IsPermanent(errs[4]) || !strings.Contains(errs[4].Error(), "does not exist") {
		t.Fatalf("a missing stream: %v, want a retryable error saying so", errs[4])
	}
	if !errors.Is(errs[5], wharf.ErrNotAttempted) {
		t.Fatalf("behind a failed request: %v, want ErrNotAttempted", errs[5])
	}
	data := readAll(t, c, p+"raw")
	var got []string
	for _, d := range data {
		got = append(got, string(d))
	}
	if len(got) != 4 || strings.Index(strings.Join(got, ","), "one") > strings.Index(strings.Join(got, ","), "two") {
		t.Fatalf("the stream holds %q", got)
	}
	// The partition keys, read back from the stream's records.
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(p + "raw")})
	if err != nil {
		t.Fatal(err)
	}
	pks := map[string]string{}
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(p + "raw"), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			t.Fatal(err)
		}
		recs, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it.ShardIterator})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs.Records {
			pks[string(r.Data)] = aws.ToString(r.PartitionKey)
		}
	}
	if pks["one"] != "a" || pks["three"] != msgs[2].ID || !strings.HasPrefix(pks["four"], "wharf-sha256-") {
		t.Fatalf("partition keys %v", pks)
	}
}

// TestOpen opens the sink from a URL against kinesalite and pings it.
func TestOpen(t *testing.T) {
	t.Parallel()
	srv := awstest.StartKinesalite(t)
	c := client(t, srv, srv.Endpoint)
	p := "o" + randomID()
	createStream(t, c, p)
	ctx := context.Background()
	creds := awstest.AccessKey + ":" + awstest.SecretKey + "@"
	s, err := Open(ctx, mustURL(t, "kinesis://"+creds+awstest.Region+"?endpoint="+url.QueryEscape(srv.Endpoint)+"&stream_template="+p))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.(wharf.Pinger).Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if errs := s.Publish(ctx, []*wharf.Message{msg(1, "x", "k", `{"a":1}`)}); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	if got := readAll(t, c, p); len(got) != 1 {
		t.Fatalf("stream holds %d records", len(got))
	}
	if _, err := Open(ctx, mustURL(t, "kinesis://"+creds+awstest.Region+"?endpoint="+url.QueryEscape(srv.Endpoint)+"&stream_template=nosuchstream")); err == nil {
		t.Fatal("Open with a missing fixed stream succeeded")
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
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error { _, err := parseURL(u); return err }, map[string]string{
		"kinesis://eu-west-1?bogus=1":                                      `unknown option "bogus"`,
		"kinesis://eu-west-1:1?stream_template=s":                          "has no port",
		"kinesis://key:" + wharfsinktest.Secret + "@eu-west-1?format=avro": `format="avro"`,
		"kinesis://eu-west-1?stream_template=a%20b":                        "stream_template=a b",
		"kinesis://eu-west-1?max_record_bytes=2000000":                     `max_record_bytes="2000000"`,
		"kinesis://eu-west-1?endpoint=localhost":                           `endpoint="localhost"`,
		"kinesis://:" + wharfsinktest.Secret + "@eu-west-1":                "ACCESS_KEY_ID:SECRET_ACCESS_KEY@",
		"kinesis://EU?stream_template=s":                                   "not an AWS region",
		"kinesis://eu-west-1?ce=binary":                                    "use ce=structured",
		"kinesis://eu-west-1?ce=json":                                      `ce="json": want structured`,
		"kinesis://eu-west-1?ce=structured&format=raw":                     "drop format=raw",
		"kinesis://eu-west-1?ce_source=/s":                                 "no content mode",
	})
}

// BenchmarkPublish measures the sink against kinesalite: the emulator's
// rate on this machine (it enforces no shard limits), not Kinesis's.
func BenchmarkPublish(b *testing.B) {
	srv := awstest.StartKinesalite(b)
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		c := client(b, srv, srv.Endpoint)
		p := "b" + randomID() + "-"
		createStream(b, c, p+wharfsinktest.TopicOrders)
		s, err := New(c, Options{StreamTemplate: p + "{{topic}}"})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}
