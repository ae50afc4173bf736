package wharfsqs

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/leakcheck"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// Every test closes the idle connections of the HTTP clients it made.
func TestMain(m *testing.M) { leakcheck.Main(m) }

const (
	accountID    = "123456789012" // moto's default account
	adminTimeout = 30 * time.Second
)

func randomID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sqsClient(t testing.TB, srv *awstest.Server, endpoint string) *sqs.Client {
	cfg := srv.Config()
	cfg.HTTPClient = srv.HTTPClient(t)
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

func snsClient(t testing.TB, srv *awstest.Server, endpoint string) *sns.Client {
	cfg := srv.Config()
	cfg.HTTPClient = srv.HTTPClient(t)
	return sns.NewFromConfig(cfg, func(o *sns.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

// createQueue creates a queue (FIFO when its name ends in .fifo) and returns
// its URL.
func createQueue(t testing.TB, c *sqs.Client, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	in := &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"MaximumMessageSize": "1048576"}}
	if strings.HasSuffix(name, ".fifo") {
		in.Attributes["FifoQueue"] = "true"
	}
	out, err := c.CreateQueue(ctx, in)
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// received is what a queue returned, with the message system attributes.
type received struct {
	wharfsinktest.Received
	group, dedup string
}

// drain receives and deletes what queueURL holds until it returned want
// messages in all or timeout passed, and returns them in receive order.
func drain(t testing.TB, c *sqs.Client, queueURL string, b64 bool, want int, timeout time.Duration) []received {
	t.Helper()
	var got []received
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+adminTimeout)
	defer cancel()
	for len(got) < want {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(queueURL),
			MaxNumberOfMessages:         10,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			WaitTimeSeconds:             1,
		})
		if err != nil {
			t.Fatalf("receive from %s: %v", queueURL, err)
		}
		var del []types.DeleteMessageBatchRequestEntry
		for j, m := range out.Messages {
			r, err := decode(m, b64)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(string(rune('a' + j))), ReceiptHandle: m.ReceiptHandle})
		}
		if len(del) > 0 {
			if _, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del}); err != nil {
				t.Fatalf("delete from %s: %v", queueURL, err)
			}
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return got
}

// decode reads a received message back.
func decode(m types.Message, b64 bool) (received, error) {
	r := received{group: m.Attributes["MessageGroupId"], dedup: m.Attributes["MessageDeduplicationId"]}
	body := aws.ToString(m.Body)
	r.Payload = []byte(body)
	if b64 {
		p, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return r, fmt.Errorf("body is not base64: %w", err)
		}
		r.Payload = p
	}
	for k, v := range m.MessageAttributes {
		switch k {
		case AttrID:
			r.ID = aws.ToString(v.StringValue)
		case AttrTopic:
			r.Topic = aws.ToString(v.StringValue)
		case AttrKey:
			r.Key = aws.ToString(v.StringValue)
		default:
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers[k] = aws.ToString(v.StringValue)
		}
	}
	return r, nil
}

// subscribe delivers topicARN's messages raw (body and attributes as
// published) to the queue.
func subscribe(t testing.TB, q *sqs.Client, s *sns.Client, topicARN, queueURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatalf("queue ARN: %v", err)
	}
	_, err = s.Subscribe(ctx, &sns.SubscribeInput{
		TopicArn:   aws.String(topicARN),
		Protocol:   aws.String("sqs"),
		Endpoint:   aws.String(attrs.Attributes[string(types.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"},
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
}

func msg(id int64, topic, key, payload string) *wharf.Message {
	return &wharf.Message{ID: wharf.FormatID(id, id*7919), Seq: id, Topic: topic, Key: key, Payload: []byte(payload), Attempt: 1}
}

// TestQueues checks what reaches standard and FIFO queues: the body as it
// was, the attributes, and on FIFO the group id (the key, hashed when SQS
// cannot take it; the id for an unkeyed message) and the dedup id (the
// message id), and that a redelivery within the dedup interval is dropped.
func TestQueues(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	c := sqsClient(t, srv, srv.Endpoint)
	p := "q" + randomID()
	std := createQueue(t, c, p+"-std")
	fifo := createQueue(t, c, p+"-fifo.fifo")
	ctx := context.Background()

	s, err := New(c, Options{Template: p + "-{{topic}}"})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 200)
	msgs := []*wharf.Message{
		msg(1, "std", "a", `{"n":1}`),
		msg(2, "fifo.fifo", "a", `{"n":2}`),
		msg(3, "fifo.fifo", long, `{"n":3}`),
		msg(4, "fifo.fifo", "", `{"n":4}`),
		msg(5, "fifo.fifo", "ключ", `{"n":5}`),
	}
	msgs[0].Headers = map[string]string{"trace-id": "abc", "x.y_z": "héllo"}
	if errs := s.Publish(ctx, msgs); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	got := drain(t, c, std, false, 1, 10*time.Second)
	if len(got) != 1 || got[0].ID != msgs[0].ID || got[0].Topic != "std" || got[0].Key != "a" || string(got[0].Payload) != `{"n":1}` ||
		got[0].Headers["trace-id"] != "abc" || got[0].Headers["x.y_z"] != "héllo" || got[0].group != "" {
		t.Fatalf("standard queue holds %+v", got)
	}
	got = drain(t, c, fifo, false, 4, 10*time.Second)
	if len(got) != 4 {
		t.Fatalf("FIFO queue holds %d messages, want 4", len(got))
	}
	groups := map[string]string{}
	for _, r := range got {
		groups[r.ID] = r.group
		if r.dedup != r.ID {
			t.Errorf("message %s: dedup id %q, want the message id", r.ID, r.dedup)
		}
	}
	if groups[msgs[1].ID] != "a" || groups[msgs[3].ID] != msgs[3].ID || !strings.HasPrefix(groups[msgs[2].ID], "wharf-sha256-") ||
		!strings.HasPrefix(groups[msgs[4].ID], "wharf-sha256-") || groups[msgs[2].ID] == groups[msgs[4].ID] {
		t.Fatalf("group ids %v", groups)
	}

	// Per-key order on a FIFO queue, over several requests, with a
	// redelivery of the first batch (as the relay sends after a lost
	// answer) that SQS drops by its dedup id.
	var ordered []*wharf.Message
	for i := range 45 {
		ordered = append(ordered, msg(int64(100+i), "fifo.fifo", []string{"x", "y", "z"}[i%3], fmt.Sprintf(`{"n":%d}`, i)))
	}
	for _, batch := range [][]*wharf.Message{ordered[:30], ordered[:10], ordered[30:]} {
		if errs := s.Publish(ctx, batch); errs != nil {
			t.Fatalf("Publish: %v", errs)
		}
	}
	got = drain(t, c, fifo, false, len(ordered), 20*time.Second)
	got = append(got, drain(t, c, fifo, false, 1, time.Second)...)
	if len(got) != len(ordered) {
		t.Fatalf("FIFO queue holds %d messages, want %d (redeliveries dropped)", len(got), len(ordered))
	}
	last := map[string]int64{}
	for _, r := range got {
		seq, _, err := wharf.ParseID(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if seq <= last[r.Key] {
			t.Fatalf("key %s: seq %d after %d", r.Key, seq, last[r.Key])
		}
		last[r.Key] = seq
	}
}

// TestRefusedBeforeSending checks the messages SQS cannot take fail
// permanently before anything is sent, and the later ones of their key are
// not attempted.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	c := sqsClient(t, srv, srv.Endpoint)
	p := "r" + randomID()
	q := createQueue(t, c, p+"-t")
	s, err := New(c, Options{Template: p + "-{{topic}}"})
	if err != nil {
		t.Fatal(err)
	}
	bad := []*wharf.Message{
		msg(1, "t", "k1", "\x00binary"),
		msg(3, "t", "k2", ""),
		msg(5, "t", "k3", "ok"),
		msg(7, "t", "k4", "ok"),
		msg(9, "t", "k5", "ok"),
		msg(11, "no such/queue", "k6", "ok"),
	}
	bad[2].Headers = map[string]string{"wharf-id": "forged"}
	bad[3].Headers = map[string]string{"empty": ""}
	bad[4].Headers = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "7", "h": "8"}
	var msgs []*wharf.Message
	for i, m := range bad {
		msgs = append(msgs, m, msg(int64(2*i+2), m.Topic, m.Key, "behind"))
	}
	good := msg(100, "t", "", "fine")
	msgs = append(msgs, good)
	errs := s.Publish(context.Background(), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	for i := range bad {
		if !wharf.IsPermanent(errs[2*i]) {
			t.Errorf("message %d: %v, want a permanent error", 2*i, errs[2*i])
		}
		if !errors.Is(errs[2*i+1], wharf.ErrNotAttempted) {
			t.Errorf("message %d behind a refused one: %v, want ErrNotAttempted", 2*i+1, errs[2*i+1])
		}
	}
	if errs[len(errs)-1] != nil {
		t.Fatalf("the good message: %v", errs[len(errs)-1])
	}
	t.Logf("e.g. %v", errs[0])
	if got := drain(t, c, q, false, 2, 3*time.Second); len(got) != 1 || got[0].ID != good.ID {
		t.Fatalf("the queue holds %+v, want only the good message", got)
	}
}

// TestEntryFailure makes SNS refuse one entry of a batch (a message above
// its 256 KiB limit, let through by a sink configured for 1 MiB): that
// message fails permanently with SNS's reason, the others of the request are
// acknowledged as SNS reports them, and the messages of its key in later
// requests are not attempted.
func TestEntryFailure(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	c := snsClient(t, srv, srv.Endpoint)
	q := sqsClient(t, srv, srv.Endpoint)
	p := "e" + randomID()
	ctx := context.Background()
	out, err := c.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(p + "-t")})
	if err != nil {
		t.Fatal(err)
	}
	queue := createQueue(t, q, p+"-sub")
	subscribe(t, q, c, aws.ToString(out.TopicArn), queue)
	s, err := NewSNS(c, Options{Template: "arn:aws:sns:" + awstest.Region + ":" + accountID + ":" + p + "-{{topic}}", MaxMessageBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*wharf.Message
	for i := range 12 {
		body := "small"
		if i == 1 {
			body = strings.Repeat("x", 300_000)
		}
		msgs = append(msgs, msg(int64(i+1), "t", "k", body))
	}
	msgs = append(msgs, msg(13, "t", "other", "other key"))
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	if !wharf.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "InvalidParameter") {
		t.Fatalf("the refused entry: %v, want a permanent error with SNS's code", errs[1])
	}
	// Entries 0 and 2-9 went in the same request: SNS took them.
	for i := 0; i < 10; i++ {
		if i != 1 && errs[i] != nil {
			t.Fatalf("message %d of the first request: %v, want its real result (taken)", i, errs[i])
		}
	}
	for i := 10; i < 12; i++ {
		if !errors.Is(errs[i], wharf.ErrNotAttempted) {
			t.Fatalf("message %d of the failed key in a later request: %v, want ErrNotAttempted", i, errs[i])
		}
	}
	if errs[12] != nil {
		t.Fatalf("the other key: %v", errs[12])
	}
	got := drain(t, q, queue, false, 10, 10*time.Second)
	if len(got) != 10 {
		t.Fatalf("the subscribed queue holds %d messages, want 10", len(got))
	}
}

// TestStrictOrder checks that with StrictOrder a request holds one message
// per key, so a key's later message is never sent in the request where an
// earlier one fails.
func TestStrictOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var requests [][]int
	b := batcher{
		enc:    encoder{maxBytes: defaultMaxBytes, what: "SQS"},
		strict: true,
		what:   "queue",
		send: func(_ context.Context, _ string, entries []*entry) ([]error, error) {
			mu.Lock()
			defer mu.Unlock()
			var idx []int
			errs := make([]error, len(entries))
			for j, en := range entries {
				idx = append(idx, en.idx)
				if en.idx == 2 {
					errs[j] = errors.New("throttled")
				}
			}
			requests = append(requests, idx)
			return errs, nil
		},
	}
	msgs := []*wharf.Message{msg(1, "t", "a", "1"), msg(2, "t", "b", "2"), msg(3, "t", "a", "3"), msg(4, "t", "a", "4"), msg(5, "t", "b", "5")}
	errs := b.publish(context.Background(), msgs, func(context.Context, *wharf.Message) (target, error) { return target{dest: "q", name: "q"}, nil })
	want := [][]int{{0, 1}, {2, 4}}
	if len(requests) != len(want) || !equal(requests[0], want[0]) || !equal(requests[1], want[1]) {
		t.Fatalf("requests %v, want %v", requests, want)
	}
	if errs[0] != nil || errs[1] != nil || errs[2] == nil || !errors.Is(errs[3], wharf.ErrNotAttempted) || errs[4] != nil {
		t.Fatalf("results %v", errs)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestOpen opens the sinks from URLs against the emulator, publishes, and
// pings; a missing queue named by a fixed template fails Open.
func TestOpen(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	c := sqsClient(t, srv, srv.Endpoint)
	p := "o" + randomID()
	q := createQueue(t, c, p+"-orders")
	ctx := context.Background()
	creds := awstest.AccessKey + ":" + awstest.SecretKey + "@"
	s, err := Open(ctx, mustURL(t, "sqs://"+creds+awstest.Region+"?endpoint="+url.QueryEscape(srv.Endpoint)+"&queue_template="+p+"-{{topic}}"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.(wharf.Pinger).Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if errs := s.Publish(ctx, []*wharf.Message{msg(1, "orders", "k", "hi")}); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	if got := drain(t, c, q, false, 1, 10*time.Second); len(got) != 1 {
		t.Fatalf("queue holds %d messages", len(got))
	}
	_, err = Open(ctx, mustURL(t, "sqs://"+creds+awstest.Region+"?endpoint="+url.QueryEscape(srv.Endpoint)+"&queue_template=nosuchqueue"))
	if err == nil || strings.Contains(err.Error(), awstest.SecretKey) {
		t.Fatalf("Open with a missing queue: %v", err)
	}

	sc := snsClient(t, srv, srv.Endpoint)
	out, err := sc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(p + "-orders")})
	if err != nil {
		t.Fatal(err)
	}
	subscribe(t, c, sc, aws.ToString(out.TopicArn), q)
	ts, err := OpenSNS(ctx, mustURL(t, "sns://"+creds+awstest.Region+"?endpoint="+url.QueryEscape(srv.Endpoint)+"&topic_arn_template="+url.QueryEscape(aws.ToString(out.TopicArn))))
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	if errs := ts.Publish(ctx, []*wharf.Message{msg(2, "orders", "k", "via sns")}); errs != nil {
		t.Fatalf("Publish to SNS: %v", errs)
	}
	if got := drain(t, c, q, false, 1, 10*time.Second); len(got) != 1 || string(got[0].Payload) != "via sns" {
		t.Fatalf("queue holds %+v", got)
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
	sec := wharfsinktest.Secret
	wharfsinktest.CheckURLErrors(t, func(u *url.URL) error {
		if u.Scheme == "sns" {
			_, err := parseSNSURL(u)
			return err
		}
		_, err := parseSQSURL(u)
		return err
	}, map[string]string{
		"sqs://eu-west-1":                                                       "queue_template is required",
		"sqs://eu-west-1?queue_template=a&bogus=1":                              `unknown option "bogus"`,
		"sqs://eu-west-1?queue_template=bad%20name":                             "queue_template=bad name",
		"sqs://eu-west-1:99?queue_template=q":                                   "has no port",
		"sqs://EU_WEST?queue_template=q":                                        "not an AWS region",
		"sqs://key:" + sec + "@eu-west-1?queue_template=q&body=hex":             `body="hex"`,
		"sqs://eu-west-1?queue_template=q&max_message_bytes=5":                  `max_message_bytes="5"`,
		"sqs://eu-west-1?queue_template=q&strict_order=maybe":                   `strict_order="maybe"`,
		"sqs://eu-west-1?queue_template=q&endpoint=localhost:4566":              `endpoint="localhost:4566"`,
		"sqs://:" + sec + "@eu-west-1?queue_template=q":                         "ACCESS_KEY_ID:SECRET_ACCESS_KEY@",
		"sqs://eu-west-1/path?queue_template=q":                                 "write sqs://",
		"sns://eu-west-1?topic_arn_template=wharf-{{topic}}":                    "not an SNS topic ARN",
		"sns://eu-west-1":                                                       "topic_arn_template is required",
		"sns://eu-west-1?topic_arn_template=arn:aws:sqs:eu-west-1:1:q":          "not an SNS topic ARN",
		"sns://eu-west-1?topic_arn_template=arn:aws:sns:eu-west-1:1:a&x=1":      `unknown option "x"`,
		"sns://eu-west-1?topic_arn_template=arn:aws:sns:eu-west-1:1:a%20b":      "a topic name has only",
		"sns://eu-west-1?topic_arn_template=arn:aws:sns:eu-west-1:1:a&profile=": "profile is empty",
		"sqs://eu-west-1?queue_template=q&ce=json":                              `ce="json": want binary or structured`,
		"sqs://eu-west-1?queue_template=q&ce_source=/s":                         "no content mode",
		"sqs://eu-west-1?queue_template=q&ce=structured&body=base64":            "drop body=base64",
		"sns://eu-west-1?topic_arn_template=arn:aws:sns:eu-west-1:1:a&ce=x":     `ce="x"`,
		"sqs://eu-west-1?queue_template=wharf-{{topc}}":                         `queue_template: unknown placeholder {{topc}} in template "wharf-{{topc}}": templates take {{topic}} or {{topic|dashes}}`,
		"sns://eu-west-1?topic_arn_template=arn:aws:sns:eu-west-1:1:w-{{topc}}": `topic_arn_template: unknown placeholder {{topc}}`,
	})
}

// BenchmarkPublish measures the SQS sink against fauxqs (moto's server
// costs time linear in a queue's length per message), with a standard
// queue: the emulator's rate on this machine, not SQS's.
func BenchmarkPublish(b *testing.B) {
	srv := awstest.StartFauxqs(b)
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		c := sqsClient(b, srv, srv.Endpoint)
		p := "b" + randomID()
		createQueue(b, c, p+"-"+wharfsinktest.TopicOrders)
		s, err := New(c, Options{Template: p + "-{{topic}}"})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}

// TestBatchResults checks how a batch request's result maps back to its
// entries: listed as successful, refused (permanently only for the
// sender's fault), or not mentioned at all (retried).
func TestBatchResults(t *testing.T) {
	errs := batchResults("queue", "q", 4, []string{"0", "7", "x"}, []failedEntry{
		{id: "1", code: "InvalidParameterValue", msg: "bad", senderFault: true},
		{id: "2", code: "InternalError", msg: "try again"},
	})
	if len(errs) != 4 {
		t.Fatalf("%d results for 4 entries", len(errs))
	}
	if errs[0] != nil {
		t.Errorf("entry 0, listed as successful: %v", errs[0])
	}
	if !wharf.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "InvalidParameterValue: bad") {
		t.Errorf("entry 1, refused for the sender's fault: %v, want a permanent error with the code", errs[1])
	}
	if errs[2] == nil || wharf.IsPermanent(errs[2]) {
		t.Errorf("entry 2, refused for the service's fault: %v, want an error to retry", errs[2])
	}
	if errs[3] == nil || wharf.IsPermanent(errs[3]) || !strings.Contains(errs[3].Error(), "does not mention") {
		t.Errorf("entry 3, not in the result: %v, want an error to retry", errs[3])
	}
}

// TestDottedTopics checks {{topic|dashes}} against the emulator: a message
// of topic orders.paid lands in queue PREFIX-orders-paid, through SQS and
// through SNS, while a plain {{topic}} fails it permanently with an error
// pointing to {{topic|dashes}}.
func TestDottedTopics(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	c := sqsClient(t, srv, srv.Endpoint)
	p := "d" + randomID()
	q := createQueue(t, c, p+"-orders-paid")
	ctx := context.Background()
	creds := awstest.AccessKey + ":" + awstest.SecretKey + "@"
	base := "sqs://" + creds + awstest.Region + "?endpoint=" + url.QueryEscape(srv.Endpoint) + "&queue_template="

	s, err := Open(ctx, mustURL(t, base+url.QueryEscape(p+"-{{topic|dashes}}")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if errs := s.Publish(ctx, []*wharf.Message{msg(1, "orders.paid", "k", "via sqs")}); errs != nil {
		t.Fatalf("Publish: %v", errs)
	}
	if got := drain(t, c, q, false, 1, 10*time.Second); len(got) != 1 || got[0].Topic != "orders.paid" || string(got[0].Payload) != "via sqs" {
		t.Fatalf("queue %s-orders-paid holds %+v", p, got)
	}

	plain, err := Open(ctx, mustURL(t, base+url.QueryEscape(p+"-{{topic}}")))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	errs := plain.Publish(ctx, []*wharf.Message{msg(2, "orders.paid", "k", "dotted")})
	if len(errs) != 1 || !wharf.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "use {{topic|dashes}} in the template to map dots to dashes") {
		t.Fatalf("Publish of a dotted topic with {{topic}}: %v, want a permanent error pointing to {{topic|dashes}}", errs)
	}

	sc := snsClient(t, srv, srv.Endpoint)
	out, err := sc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(p + "-orders-paid")})
	if err != nil {
		t.Fatal(err)
	}
	subscribe(t, c, sc, aws.ToString(out.TopicArn), q)
	arnTemplate := strings.TrimSuffix(aws.ToString(out.TopicArn), "orders-paid")
	snsBase := "sns://" + creds + awstest.Region + "?endpoint=" + url.QueryEscape(srv.Endpoint) + "&topic_arn_template="
	ts, err := OpenSNS(ctx, mustURL(t, snsBase+url.QueryEscape(arnTemplate+"{{topic|dashes}}")))
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	if errs := ts.Publish(ctx, []*wharf.Message{msg(3, "orders.paid", "k", "via sns")}); errs != nil {
		t.Fatalf("Publish to SNS: %v", errs)
	}
	if got := drain(t, c, q, false, 1, 10*time.Second); len(got) != 1 || string(got[0].Payload) != "via sns" {
		t.Fatalf("queue holds %+v", got)
	}
	plainSNS, err := OpenSNS(ctx, mustURL(t, snsBase+url.QueryEscape(arnTemplate+"{{topic}}")))
	if err != nil {
		t.Fatal(err)
	}
	defer plainSNS.Close()
	errs = plainSNS.Publish(ctx, []*wharf.Message{msg(4, "orders.paid", "k", "dotted")})
	if len(errs) != 1 || !wharf.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "use {{topic|dashes}} in the template to map dots to dashes") {
		t.Fatalf("Publish of a dotted topic with {{topic}} to SNS: %v, want a permanent error pointing to {{topic|dashes}}", errs)
	}
}

// TestOptionsTemplateTypo checks New and NewSNS name a mistyped placeholder
// rather than the characters it gives.
func TestOptionsTemplateTypo(t *testing.T) {
	t.Parallel()
	cfg := aws.Config{Region: awstest.Region}
	_, err := New(sqs.NewFromConfig(cfg), Options{Template: "wharf-{{topc}}"})
	if err == nil || !strings.Contains(err.Error(), `unknown placeholder {{topc}} in template "wharf-{{topc}}"`) {
		t.Fatalf("New: %v, want an error naming {{topc}}", err)
	}
	_, err = NewSNS(sns.NewFromConfig(cfg), Options{Template: "arn:aws:sns:us-east-1:1:wharf-{{topc}}"})
	if err == nil || !strings.Contains(err.Error(), "unknown placeholder {{topc}}") {
		t.Fatalf("NewSNS: %v, want an error naming {{topc}}", err)
	}
}
