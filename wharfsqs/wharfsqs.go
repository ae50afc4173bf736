// Package wharfsqs holds the Amazon SQS and Amazon SNS sinks of Wharf, built
// on the AWS SDK for Go v2.
//
// A [Sink] sends a batch's messages to SQS queues with SendMessageBatch, a
// [TopicSink] to SNS topics with PublishBatch, at most 10 messages per
// request, and acknowledges a message only when the request's result lists
// it as successful, that is once SQS stored it or SNS accepted it. Each
// entry's failure is mapped to its own message: an entry refused for the
// sender's fault fails permanently, any other is retried by the relay.
// docs/sinks/sqs.md in the repository describes the sinks for operators.
//
// # Messages
//
// The payload is the message body: as it is by default (it must then be
// UTF-8 text of the characters SQS allows, as JSON is), or in base64 with
// body=base64. Every message carries three String message attributes:
// wharf-id ([wharf.Message.ID]), wharf-topic and, for a keyed message,
// wharf-key; the message's headers become String message attributes too.
// SQS and SNS take at most 10 attributes, so a message may have 7 headers
// (8 without a key); a header that cannot be an attribute (a name of other
// characters than letters, digits, '-', '_' and '.', or starting with
// "AWS." or "Amazon."; an empty value) fails the message permanently.
//
// # FIFO queues and topics
//
// A queue whose name, or a topic whose ARN, ends in ".fifo" is FIFO: the
// message group id is the message's key (hashed to "wharf-sha256-<hex>"
// when the key is longer than 128 characters or has characters a group id
// cannot have), so SQS keeps each key's messages in order and delivers
// different keys in parallel; an unkeyed message's group id is its own id.
// The deduplication id is the message id, so a redelivery within SQS's
// five-minute deduplication interval is dropped by SQS. Standard queues and
// topics get neither and keep no order.
//
// # Ordering
//
// A Publish call splits each destination's messages into up to 4 lanes by
// ordering key; a lane sends its messages in their order, one request at a
// time, the lanes in parallel; once a message failed, no later message of
// its ordering key is sent. Within one
// request a later message of a key may still be stored although an earlier
// one failed: its result says so truthfully and the relay sends it again
// after the earlier one, as with every pipelining sink. On a FIFO queue
// SQS drops that second copy as a duplicate when it comes within five
// minutes, so the queue keeps the later message before the earlier one.
// Per-entry failures of that kind are rare (the sink checks sizes,
// characters and attributes before sending); strict_order=true rules them
// out by putting at most one message of a key in each request, at the
// cost of one request per message of a hot key.
//
// # URL
//
// From the CLI the sinks are opened with a URL (see [Open] and [OpenSNS]):
//
//	sqs://[ACCESS_KEY_ID:SECRET@][REGION]?queue_template=NAME[&option=value...]
//	sns://[ACCESS_KEY_ID:SECRET@][REGION]?topic_arn_template=ARN[&option=value...]
//
// The host is the AWS region (default: the default chain's, e.g.
// AWS_REGION). Credentials come from the default AWS chain (environment,
// shared files and profiles, SSO, web identity, ECS and EC2 roles) unless
// the URL carries static ones (meant for emulators). Options:
//
//   - queue_template (sqs, required): the queue name of a message, with
//     "{{topic}}" replaced by the wharf topic, e.g. "wharf-{{topic}}.fifo".
//     Queue names cannot have dots: for dotted topics (orders.paid) write
//     "{{topic|dashes}}", the topic with its dots as dashes
//     (wharf-{{topic|dashes}} gives wharf-orders-paid). The queue's URL is
//     looked up once per queue (GetQueueUrl); queues are not created.
//   - topic_arn_template (sns, required): the topic ARN of a message, e.g.
//     "arn:aws:sns:eu-west-1:123456789012:wharf-{{topic|dashes}}" (topic
//     names cannot have dots either).
//   - endpoint: the service's URL, for an emulator (e.g.
//     http://127.0.0.1:4566). Defaults to AWS's.
//   - profile: a profile of the shared AWS config files.
//   - body: raw or base64. Defaults to raw.
//   - max_message_bytes: the largest message (body plus attributes) and
//     request, from 1024 to 1048576. Defaults to 262144, the limit of SNS and
//     of SQS queues not configured for larger messages.
//   - strict_order: "true" to put at most one message of an ordering key in
//     each request (see Ordering). Defaults to "false".
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//
// # CloudEvents
//
// SQS and SNS have no CloudEvents binding. With ce=binary the body is the
// payload (in base64 with body=base64) and the attributes are String
// message attributes "ce-<name>", datacontenttype included
// (ce-datacontenttype), values not percent-encoded. Within the limit of 10
// attributes, wharf-id, wharf-topic and wharf-key are left out (ce-id,
// ce-type and ce-subject hold them), and so are the message's traceparent,
// tracestate and content-type headers (the event carries them). With
// ce=structured the body is the JSON event, a "content-type" attribute
// says "application/cloudevents+json; charset=UTF-8", and the other
// attributes are as without CloudEvents; body=base64 is refused then. A
// message that cannot be a CloudEvent fails permanently.
package wharfsqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awsurl"
	"github.com/wharfhq/wharf/internal/cloudevents"
)

// TopicPlaceholder is replaced by the wharf topic in the templates.
const TopicPlaceholder = wharf.TopicPlaceholder

// Options configures a [Sink] or a [TopicSink].
type Options struct {
	// Template names the destination of a message, TopicPlaceholder
	// replaced by its topic: the queue name for a [Sink], the topic ARN for
	// a [TopicSink]. Required. Queue and topic names cannot have dots:
	// [wharf.TopicDashesPlaceholder] ({{topic|dashes}}) puts the topic with
	// its dots as dashes.
	Template string
	// Body says how payloads become message bodies. Defaults to BodyRaw.
	Body Body
	// MaxMessageBytes is the largest message, body plus attributes, and the
	// largest request. Defaults to 262144.
	MaxMessageBytes int
	// StrictOrder puts at most one message of an ordering key in each
	// request. Defaults to false.
	StrictOrder bool
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see CloudEvents). Defaults to none.
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

func (o *Options) validate(what string) (wharf.TopicTemplate, cloudevents.Config, error) {
	tmpl, err := o.validateTemplate(what)
	if err != nil {
		return tmpl, cloudevents.Config{}, err
	}
	ce, err := cloudevents.NewConfig(o.CloudEvents, o.CloudEventsSource)
	if err != nil {
		return tmpl, ce, fmt.Errorf("wharfsqs: Options.CloudEvents: %w", err)
	}
	if ce.Mode == cloudevents.Structured && o.Body == BodyBase64 {
		return tmpl, ce, fmt.Errorf("wharfsqs: Options: %s", errStructuredBase64)
	}
	return tmpl, ce, nil
}

func (o *Options) validateTemplate(what string) (wharf.TopicTemplate, error) {
	if o.Template == "" {
		return wharf.TopicTemplate{}, fmt.Errorf("wharfsqs: Options.Template is required: the %s of a message, e.g. %q", what, "wharf-"+TopicPlaceholder)
	}
	tmpl, err := wharf.ParseTopicTemplate(o.Template)
	if err != nil {
		return tmpl, fmt.Errorf("wharfsqs: Options.Template: %w", err)
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = defaultMaxBytes
	}
	if o.MaxMessageBytes < 1024 || o.MaxMessageBytes > 1<<20 {
		return tmpl, fmt.Errorf("wharfsqs: Options.MaxMessageBytes %d is not from 1024 to 1048576", o.MaxMessageBytes)
	}
	return tmpl, nil
}

// Sink is a [wharf.Sink] that sends to Amazon SQS queues. It is safe for
// concurrent use.
type Sink struct {
	client *sqs.Client
	opts   Options
	names  wharf.TopicTemplate
	b      batcher
	urls   sync.Map // queue name -> queue URL
	last   atomic.Value
	closed atomic.Bool
	// transport is the HTTP transport of the client Open made (nil for New).
	transport *awsurl.Transport
}

var (
	_ wharf.Sink   = (*Sink)(nil)
	_ wharf.Pinger = (*Sink)(nil)
)

// New returns a sink sending with client.
func New(client *sqs.Client, opts Options) (*Sink, error) {
	if client == nil {
		return nil, errors.New("wharfsqs: New: nil client")
	}
	names, ce, err := opts.validate("queue name")
	if err != nil {
		return nil, err
	}
	s := &Sink{client: client, opts: opts, names: names}
	s.b = batcher{
		enc:    encoder{body: opts.Body, maxBytes: opts.MaxMessageBytes, what: "SQS", ce: ce, binding: bindingSQS},
		strict: opts.StrictOrder,
		send:   s.send,
		what:   "queue",
	}
	return s, nil
}

// Queue returns the queue name a message of the wharf topic goes to.
func (s *Sink) Queue(topic string) string { return s.names.Expand(topic) }

// Publish sends msgs and returns one result per message, or nil when SQS
// stored all of them. It sends nothing more once ctx is done.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if s.closed.Load() {
		return wharf.FailAll(len(msgs), errClosed)
	}
	return s.b.publish(ctx, msgs, s.resolve)
}

var errClosed = errors.New("wharfsqs: the sink is closed")

// resolve returns the queue of m, looking its URL up once.
func (s *Sink) resolve(ctx context.Context, m *wharf.Message) (target, error) {
	name := s.Queue(m.Topic)
	t := target{name: name, fifo: strings.HasSuffix(name, ".fifo")}
	if u, ok := s.urls.Load(name); ok {
		t.dest = u.(string)
		return t, nil
	}
	if err := checkQueueName(name); err != nil {
		return t, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: wharf topic %q gives queue name %q: %w%s", m.ID, m.Topic, name, err, dashesHint(s.names, m.Topic, checkQueueName)))
	}
	out, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		var nq *types.QueueDoesNotExist
		if errors.As(err, &nq) {
			return t, fmt.Errorf("wharfsqs: message %s: queue %q does not exist (%w): create it, or fix queue_template; the message is retried until then", m.ID, name, err)
		}
		return t, fmt.Errorf("wharfsqs: message %s: cannot look up queue %q: %w", m.ID, name, err)
	}
	t.dest = aws.ToString(out.QueueUrl)
	s.urls.Store(name, t.dest)
	s.last.Store(name)
	return t, nil
}

// dashesHint points to TopicDashesPlaceholder when names has the plain
// placeholder and the topic's dots are what make check refuse its
// destination.
func dashesHint(names wharf.TopicTemplate, topic string, check func(string) error) string {
	if names.Fixed() || names.Dashes() || !strings.Contains(topic, ".") || check(names.Expand(strings.ReplaceAll(topic, ".", "-"))) != nil {
		return ""
	}
	return "; use " + wharf.TopicDashesPlaceholder + " in the template to map dots to dashes"
}

// checkQueueName accepts what SQS accepts: 1 to 80 letters, digits, '-'
// and '_', the ".fifo" suffix included.
func checkQueueName(name string) error {
	base := strings.TrimSuffix(name, ".fifo")
	if name == "" || len(name) > 80 || base == "" {
		return errors.New("a queue name has 1 to 80 characters")
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if !isAlnum(c) && c != '-' && c != '_' {
			return errors.New("a queue name has only letters, digits, '-' and '_' (and the .fifo suffix)")
		}
	}
	return nil
}

// send sends one SendMessageBatch request.
func (s *Sink) send(ctx context.Context, queueURL string, entries []*entry) ([]error, error) {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: make([]types.SendMessageBatchRequestEntry, len(entries))}
	for j, en := range entries {
		e := types.SendMessageBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(j)),
			MessageBody:       aws.String(en.body),
			MessageAttributes: make(map[string]types.MessageAttributeValue, len(en.attrs)),
		}
		for k, v := range en.attrs {
			e.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		if en.group != "" {
			e.MessageGroupId = aws.String(en.group)
			e.MessageDeduplicationId = aws.String(en.dedup)
		}
		in.Entries[j] = e
	}
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	ok := make([]string, len(out.Successful))
	for i, e := range out.Successful {
		ok[i] = aws.ToString(e.Id)
	}
	failed := make([]failedEntry, len(out.Failed))
	for i, f := range out.Failed {
		failed[i] = failedEntry{id: aws.ToString(f.Id), code: aws.ToString(f.Code), msg: aws.ToString(f.Message), senderFault: f.SenderFault}
	}
	return batchResults("queue", queueURL, len(entries), ok, failed), nil
}

// Ping checks that SQS answers: it looks up the URL of the queue last
// published to (of the template's queue when it names one queue), or lists
// one queue when there is none yet. It implements [wharf.Pinger].
func (s *Sink) Ping(ctx context.Context) error {
	name, _ := s.last.Load().(string)
	if name == "" && s.names.Expand("a") == s.names.Expand("b") {
		name = s.names.Expand("a")
	}
	var err error
	if name != "" {
		_, err = s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	} else {
		_, err = s.client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	}
	if err != nil {
		return fmt.Errorf("wharfsqs: SQS does not answer: %w", err)
	}
	return nil
}

// Close stops the sink: later publishes fail. When Open made the client,
// Close closes its idle connections.
func (s *Sink) Close() error {
	s.closed.Store(true)
	s.transport.CloseIdle()
	return nil
}

// Open opens the SQS sink an sqs:// URL names (see the package
// documentation). It is the opener the CLI registers for "sqs". When the
// template names one queue, Open checks that it exists.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	c, err := parseSQSURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	cfg, tr, err := c.Load(ctx, "sqs")
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	s, err := New(sqs.NewFromConfig(cfg), c.options())
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	s.transport = tr
	if s.names.Expand("a") == s.names.Expand("b") {
		if err := s.Ping(ctx); err != nil {
			tr.CloseIdle()
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
	}
	return s, nil
}

func (c awsURL) options() Options {
	return Options{Template: c.template, Body: c.body, MaxMessageBytes: c.maxBytes, StrictOrder: c.strict, CloudEvents: c.ce, CloudEventsSource: c.ceSource}
}

func parseSQSURL(u *url.URL) (awsURL, error) {
	c, err := parseAWSURL(u, "sqs", "queue_template", noExtra)
	if err != nil {
		return c, err
	}
	tmpl, err := wharf.ParseTopicTemplate(c.template)
	if err != nil {
		return c, fmt.Errorf("sink URL %q: queue_template: %w", u.Redacted(), err)
	}
	if err := checkQueueName(tmpl.Expand("t")); err != nil {
		return c, fmt.Errorf("sink URL %q: queue_template=%s: %w", u.Redacted(), c.template, err)
	}
	return c, nil
}

func noExtra(string, string) (bool, error) { return false, nil }
