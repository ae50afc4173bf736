package wharfsqs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/tcpgate"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// runConformance runs the suite against FIFO queues (or topics), whose
// per-key order a consumer can check, all of its cases at once against one
// fauxqs: they are isolated by a queue and topic prefix of their own.
//
// The suite ran against moto's server before, and took more than ten
// minutes: moto recounts a queue's messages (three passes over them, each
// reading the clock per message) on every message it sends and receives, so
// its cost per message grows with the queue's length and thousands of
// messages cost it minutes. fauxqs keeps FIFO groups in maps and takes the
// suite's messages in a fraction of a second. Its one Node.js thread serves
// every case of the suite at once on a shared machine, so the suite's
// waits, which are hang guards, are still scaled (Harness.TimeScale).
func runConformance(t *testing.T, useSNS bool) {
	h := &harness{sns: useSNS, srv: awstest.StartFauxqs(t)}
	wharfsinktest.Run(t, wharfsinktest.Harness{
		NewSink: func(t *testing.T) wharf.Sink {
			w := h.newWorld(t)
			return h.open(t, w, w.srv.Endpoint)
		},
		NewBreakableSink: func(t *testing.T) wharf.Sink {
			w := h.newWorld(t)
			w.gate = w.srv.NewGate(t)
			return h.open(t, w, w.gate.Endpoint())
		},
		Consume:     h.consume,
		TimeScale:   10,
		BreakBroker: func(t *testing.T) { h.worlds.Get(t).gate.Shut() },
		HealBroker:  func(t *testing.T) { h.worlds.Get(t).gate.Open(t) },
		Features:    wharfsinktest.Features{MaxPayload: maxPayload, SupportsHeaders: true},
	})
}

// TestConformanceSQS runs the suite against SQS FIFO queues.
func TestConformanceSQS(t *testing.T) {
	t.Parallel()
	runConformance(t, false)
}

// TestConformanceSNS runs the suite against SNS FIFO topics, read through
// FIFO queues subscribed with raw delivery.
func TestConformanceSNS(t *testing.T) {
	t.Parallel()
	runConformance(t, true)
}

// world is one conformance test's destination: a FIFO queue per topic under
// a prefix of its own, fed directly (SQS) or through a FIFO topic per topic
// (SNS), and a consumer per queue that receives and deletes from the start,
// as a real one would.
type world struct {
	srv    *awstest.Server
	prefix string
	admin  *sqs.Client
	gate   *tcpgate.Gate

	mu      sync.Mutex
	got     map[string][]wharfsinktest.Received // per wharf topic, in receive order
	changed chan struct{}                       // closed and replaced on every arrival
	failed  error                               // a consumer's failure
}

type harness struct {
	sns    bool
	srv    *awstest.Server // shared by the cases
	worlds wharfsinktest.PerTest[*world]
}

func (h *harness) newWorld(t *testing.T) *world {
	srv := h.srv
	w := &world{srv: srv, prefix: "w" + randomID(), admin: sqsClient(t, srv, srv.Endpoint), got: map[string][]wharfsinktest.Received{}, changed: make(chan struct{})}
	queues := map[string]string{}
	for _, topic := range wharfsinktest.Topics() {
		queues[topic] = createQueue(t, w.admin, w.prefix+"-"+topic+".fifo")
	}
	if h.sns {
		admin := snsClient(t, srv, srv.Endpoint)
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		for _, topic := range wharfsinktest.Topics() {
			out, err := admin.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(w.prefix + "-" + topic + ".fifo"), Attributes: map[string]string{"FifoTopic": "true"}})
			if err != nil {
				t.Fatalf("create topic: %v", err)
			}
			subscribe(t, w.admin, admin, aws.ToString(out.TopicArn), queues[topic])
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for topic, q := range queues {
		wg.Go(func() { w.consume(ctx, topic, q) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	h.worlds.Set(t, w)
	return w
}

// consume receives and deletes queueURL's messages until ctx ends, ten at
// a time, as the queue's only receiver.
func (w *world) consume(ctx context.Context, topic, queueURL string) {
	for ctx.Err() == nil {
		out, err := w.admin.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:              aws.String(queueURL),
			MaxNumberOfMessages:   10,
			MessageAttributeNames: []string{"All"},
			WaitTimeSeconds:       1,
		})
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("receive from %s: %w", queueURL, err))
			}
			return
		}
		if len(out.Messages) == 0 {
			continue
		}
		var del []types.DeleteMessageBatchRequestEntry
		var rs []wharfsinktest.Received
		for j, m := range out.Messages {
			r, err := decode(m, true)
			if err != nil {
				w.fail(err)
				return
			}
			rs = append(rs, r.Received)
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(j)), ReceiptHandle: m.ReceiptHandle})
		}
		// Recorded before the delete, which lets the groups' next messages
		// out: the record keeps each group's order.
		w.mu.Lock()
		w.got[topic] = append(w.got[topic], rs...)
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
		out2, err := w.admin.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del})
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("delete from %s: %w", queueURL, err))
			}
			return
		}
		if len(out2.Failed) > 0 {
			// A message left undeleted holds its FIFO group back.
			f := out2.Failed[0]
			w.fail(fmt.Errorf("delete from %s: %d of %d entries failed, e.g. %s: %s", queueURL, len(out2.Failed), len(del), aws.ToString(f.Code), aws.ToString(f.Message)))
			return
		}
	}
}

func (w *world) fail(err error) {
	w.mu.Lock()
	if w.failed == nil {
		w.failed = err
	}
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (h *harness) open(t *testing.T, w *world, endpoint string) wharf.Sink {
	var s wharf.Sink
	var err error
	opts := Options{Body: BodyBase64}
	if h.sns {
		opts.Template = "arn:aws:sns:" + awstest.Region + ":" + w.srv.Account + ":" + w.prefix + "-{{topic}}.fifo"
		s, err = NewSNS(snsClient(t, w.srv, endpoint), opts)
	} else {
		opts.Template = w.prefix + "-{{topic}}.fifo"
		s, err = New(sqsClient(t, w.srv, endpoint), opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// consume waits until the consumers of topics received want messages in
// all, or timeout passed, and returns what they received.
func (h *harness) consume(t *testing.T, topics []string, want int, timeout time.Duration) []wharfsinktest.Received {
	w := h.worlds.Get(t)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		var all []wharfsinktest.Received
		for _, topic := range topics {
			all = append(all, w.got[topic]...)
		}
		failed, changed := w.failed, w.changed
		w.mu.Unlock()
		if failed != nil {
			t.Fatalf("consumer: %v", failed)
		}
		if len(all) >= want {
			return all
		}
		select {
		case <-changed:
		case <-timer.C:
			return all
		}
	}
}

// maxPayload is the payload the conformance suite may send: in base64 with
// the suite's attributes it stays under the 256 KiB default, and twice it
// does not.
const maxPayload = 190_000
