//go:build awsconformance

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
// per-key order a consumer can check. moto's server takes about a tenth of a
// second a request on a shared two-core machine, up to a second under load,
// so the suite's waits are scaled ten times (Harness.TimeScale) and a run
// takes more than ten minutes there: it is built only with the
// awsconformance tag,
//
//	go test -tags awsconformance -timeout 60m -run Conformance ./wharfsqs
//
// and is not part of make test or CI. The focused tests in wharfsqs_test.go
// and the end-to-end test through wharf relay (internal/e2e) run always.
func runConformance(t *testing.T, useSNS bool) {
	h := &harness{sns: useSNS}
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

// world is one conformance test's destination: an emulator of its own (the
// emulator is single-threaded: one per case lets the cases run in
// parallel), a FIFO queue per topic, fed directly (SQS) or through a FIFO
// topic per topic (SNS), and a consumer per queue that receives and deletes
// from the start, as a real one would: the emulator's cost per message grows
// with the queue's length, so a queue left to fill up would make the suite
// crawl.
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
	worlds wharfsinktest.PerTest[*world]
}

// emulatorSlots bounds the conformance cases running at once: each has an
// emulator of its own, and on two shared cores more of them at once only
// make every one of them slower than the suite's fixed timeouts allow.
var emulatorSlots = make(chan struct{}, 1)

func (h *harness) newWorld(t *testing.T) *world {
	emulatorSlots <- struct{}{}
	t.Cleanup(func() { <-emulatorSlots })
	srv := awstest.Start(t)
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

// consume receives and deletes queueURL's messages until ctx ends.
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
		if _, err := w.admin.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del}); err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("delete from %s: %w", queueURL, err))
			}
			return
		}
		w.mu.Lock()
		w.got[topic] = append(w.got[topic], rs...)
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
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
		opts.Template = "arn:aws:sns:" + awstest.Region + ":" + accountID + ":" + w.prefix + "-{{topic}}.fifo"
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
