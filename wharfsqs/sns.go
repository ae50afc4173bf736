package wharfsqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awsurl"
)

// TopicSink is a [wharf.Sink] that publishes to Amazon SNS topics. It is
// safe for concurrent use.
type TopicSink struct {
	client *sns.Client
	opts   Options
	names  wharf.TopicTemplate
	b      batcher
	last   atomic.Value
	closed atomic.Bool
	// transport is the HTTP transport of the client Open made (nil for New).
	transport *awsurl.Transport
}

var (
	_ wharf.Sink   = (*TopicSink)(nil)
	_ wharf.Pinger = (*TopicSink)(nil)
)

// NewSNS returns a sink publishing with client; Options.Template names the
// topic ARN.
func NewSNS(client *sns.Client, opts Options) (*TopicSink, error) {
	if client == nil {
		return nil, errors.New("wharfsqs: NewSNS: nil client")
	}
	names, ce, err := opts.validate("topic ARN")
	if err != nil {
		return nil, err
	}
	if err := checkTopicARN(names.Expand("t")); err != nil {
		return nil, fmt.Errorf("wharfsqs: Options.Template %q: %w", opts.Template, err)
	}
	s := &TopicSink{client: client, opts: opts, names: names}
	s.b = batcher{
		enc:    encoder{body: opts.Body, maxBytes: opts.MaxMessageBytes, what: "SNS", ce: ce, binding: bindingSNS},
		strict: opts.StrictOrder,
		send:   s.send,
		what:   "topic",
	}
	return s, nil
}

// TopicARN returns the topic ARN a message of the wharf topic goes to.
func (s *TopicSink) TopicARN(topic string) string { return s.names.Expand(topic) }

// Publish publishes msgs and returns one result per message, or nil when
// SNS accepted all of them. It sends nothing more once ctx is done.
func (s *TopicSink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if s.closed.Load() {
		return wharf.FailAll(len(msgs), errClosed)
	}
	return s.b.publish(ctx, msgs, s.resolve)
}

func (s *TopicSink) resolve(_ context.Context, m *wharf.Message) (target, error) {
	a := s.TopicARN(m.Topic)
	if err := checkTopicARN(a); err != nil {
		return target{}, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: wharf topic %q gives topic ARN %q: %w%s", m.ID, m.Topic, a, err, dashesHint(s.names, m.Topic, checkTopicARN)))
	}
	s.last.Store(a)
	return target{dest: a, name: a, fifo: strings.HasSuffix(a, ".fifo")}, nil
}

// checkTopicARN accepts an SNS topic ARN: arn:PARTITION:sns:REGION:ACCOUNT:NAME
// with a name of 1 to 256 letters, digits, '-' and '_' (and ".fifo").
func checkTopicARN(s string) error {
	a, err := arn.Parse(s)
	if err != nil || a.Service != "sns" || a.Resource == "" {
		return errors.New("not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)")
	}
	base := strings.TrimSuffix(a.Resource, ".fifo")
	if base == "" || len(a.Resource) > 256 {
		return errors.New("a topic name has 1 to 256 characters")
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if !isAlnum(c) && c != '-' && c != '_' {
			return errors.New("a topic name has only letters, digits, '-' and '_' (and the .fifo suffix)")
		}
	}
	return nil
}

// send sends one PublishBatch request.
func (s *TopicSink) send(ctx context.Context, topicARN string, entries []*entry) ([]error, error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(topicARN), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(entries))}
	for j, en := range entries {
		e := types.PublishBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(j)),
			Message:           aws.String(en.body),
			MessageAttributes: make(map[string]types.MessageAttributeValue, len(en.attrs)),
		}
		for k, v := range en.attrs {
			e.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		if en.group != "" {
			e.MessageGroupId = aws.String(en.group)
			e.MessageDeduplicationId = aws.String(en.dedup)
		}
		in.PublishBatchRequestEntries[j] = e
	}
	out, err := s.client.PublishBatch(ctx, in)
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
	return batchResults("topic", topicARN, len(entries), ok, failed), nil
}

// Ping checks that SNS answers: it reads the attributes of the topic last
// published to (of the template's topic when it names one), or lists
// topics when there is none yet. It implements [wharf.Pinger].
func (s *TopicSink) Ping(ctx context.Context) error {
	a, _ := s.last.Load().(string)
	if a == "" && s.names.Expand("a") == s.names.Expand("b") {
		a = s.names.Expand("a")
	}
	var err error
	if a != "" {
		_, err = s.client.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: aws.String(a)})
	} else {
		_, err = s.client.ListTopics(ctx, &sns.ListTopicsInput{})
	}
	if err != nil {
		return fmt.Errorf("wharfsqs: SNS does not answer: %w", err)
	}
	return nil
}

// Close stops the sink: later publishes fail. When Open made the client,
// Close closes its idle connections.
func (s *TopicSink) Close() error {
	s.closed.Store(true)
	s.transport.CloseIdle()
	return nil
}

// OpenSNS opens the SNS sink an sns:// URL names (see the package
// documentation). It is the opener the CLI registers for "sns". When the
// template names one topic, OpenSNS checks that it exists.
func OpenSNS(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	c, err := parseSNSURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	cfg, tr, err := c.Load(ctx, "sns")
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	s, err := NewSNS(sns.NewFromConfig(cfg), c.options())
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

func parseSNSURL(u *url.URL) (awsURL, error) {
	c, err := parseAWSURL(u, "sns", "topic_arn_template", noExtra)
	if err != nil {
		return c, err
	}
	tmpl, err := wharf.ParseTopicTemplate(c.template)
	if err != nil {
		return c, fmt.Errorf("sink URL %q: topic_arn_template: %w", u.Redacted(), err)
	}
	if err := checkTopicARN(tmpl.Expand("t")); err != nil {
		return c, fmt.Errorf("sink URL %q: topic_arn_template=%s: %w", u.Redacted(), c.template, err)
	}
	return c, nil
}
