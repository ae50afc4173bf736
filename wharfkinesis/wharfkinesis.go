// Package wharfkinesis is the Amazon Kinesis Data Streams sink of Wharf,
// built on the AWS SDK for Go v2.
//
// A [Sink] writes a batch's messages with PutRecords and acknowledges a
// record only when its entry of the result has a sequence number, that is
// once Kinesis stored it. docs/sinks/kinesis.md in the repository describes
// the sink for operators.
//
// # Records
//
// Kinesis records carry data and a partition key only, so by default the
// data is Wharf's JSON envelope (format=envelope):
//
//	{"id":"<uuid>","seq":42,"topic":"orders","key":"k","headers":{...},"payload":{...}}
//
// with the payload as the JSON value itself when it is valid JSON and in
// base64 otherwise (then "payload_encoding":"base64" follows), the form the
// stdout and file sinks write. With format=raw the data is the payload
// alone, and the message id and headers are not sent. The partition key is
// the message key (hashed to "wharf-sha256-<hex>" when it is longer than
// Kinesis's 256 characters), or the message id for an unkeyed message.
//
// # Ordering and failures
//
// Kinesis stores the records of a shard in sequence-number order, but one
// PutRecords request does not promise the order of its records when some
// fail. So a request holds at most one message of each key: a key's next
// message goes in the next request, once the previous one was stored, and
// after a failure none of the key's later messages is sent. Keys go in
// parallel within each request (up to 500 records and 5 MiB). A record
// Kinesis refused (ProvisionedThroughputExceededException, InternalFailure)
// is retried by the relay; a message above max_record_bytes fails
// permanently before sending.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	kinesis://[ACCESS_KEY_ID:SECRET@][REGION][?option=value&...]
//
// The host is the AWS region (default: the default chain's). Credentials
// come from the default AWS chain unless the URL carries static ones
// (meant for emulators). Options:
//
//   - stream_template: the stream name of a message, with "{{topic}}"
//     replaced by the wharf topic. Defaults to "{{topic}}". Streams are not
//     created.
//   - endpoint: the service's URL, for an emulator (e.g.
//     http://127.0.0.1:4567). Defaults to AWS's.
//   - profile: a profile of the shared AWS config files.
//   - format: envelope or raw. Defaults to envelope.
//   - max_record_bytes: the largest record, data plus partition key.
//     Defaults to 1048576, Kinesis's limit.
//   - ce: "structured" to write every message as a CloudEvent (see
//     CloudEvents). Defaults to none. "binary" is refused.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//
// # CloudEvents
//
// Kinesis has no CloudEvents binding, and a record has no attributes, so
// only structured mode exists: with ce=structured the record's data is the
// JSON event (binary payloads in data_base64) in place of the envelope, and
// the partition key is as always. The message's headers other than
// content-type, traceparent and tracestate (which become datacontenttype
// and the distributed-tracing extension) are not written. ce=binary, and
// format=raw with ce=structured, are refused. A message that cannot be a
// CloudEvent fails permanently.
package wharfkinesis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awsurl"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/envelope"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// TopicPlaceholder is replaced by the wharf topic in Options.StreamTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	maxRecords       = 500
	maxRequestBytes  = 5 << 20
	defaultMaxRecord = 1 << 20
	maxPartitionKey  = 256
)

// Format says what a record's data holds.
type Format int

const (
	// FormatEnvelope is Wharf's JSON envelope: id, seq, topic, key,
	// headers and payload.
	FormatEnvelope Format = iota
	// FormatRaw is the payload alone.
	FormatRaw
)

// Options configures a [Sink] built with [New].
type Options struct {
	// StreamTemplate names the stream of a message: TopicPlaceholder is
	// replaced by its topic. Defaults to "{{topic}}".
	StreamTemplate string
	// Format says what a record's data holds. Defaults to FormatEnvelope.
	Format Format
	// MaxRecordBytes is the largest record, data plus partition key.
	// Defaults to 1048576.
	MaxRecordBytes int
	// CloudEvents sends every message as a CloudEvent: "structured" only,
	// as a record has nowhere to put binary mode's attributes (see
	// CloudEvents). Defaults to none.
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// bindingKinesis names Kinesis in CloudEvents errors; only structured mode
// is used, so it needs no attribute naming.
var bindingKinesis = cloudevents.Binding{Name: "Kinesis"}

// errRawCE refuses format=raw with CloudEvents, which make the record the
// JSON event.
const errRawCE = "format=raw with ce=structured: the record is then the JSON event, neither the envelope nor the raw payload; drop format=raw"

// errBinaryCE refuses ce=binary.
const errBinaryCE = "ce=binary: a Kinesis record has no attributes to carry binary mode's; use ce=structured (the record is the JSON event)"

// Sink is a [wharf.Sink] that writes to Kinesis Data Streams. It is safe
// for concurrent use.
type Sink struct {
	client    *kinesis.Client
	opts      Options
	names     wharf.TopicTemplate
	ce        cloudevents.Config
	encoders  sync.Pool
	last      atomic.Value
	closed    atomic.Bool
	transport *awsurl.Transport // of the client Open made (nil for New)
}

var (
	_ wharf.Sink   = (*Sink)(nil)
	_ wharf.Pinger = (*Sink)(nil)
)

// New returns a sink writing with client.
func New(client *kinesis.Client, opts Options) (*Sink, error) {
	if client == nil {
		return nil, errors.New("wharfkinesis: New: nil client")
	}
	names, err := wharf.ParseTopicTemplate(opts.StreamTemplate)
	if err != nil {
		return nil, fmt.Errorf("wharfkinesis: Options.StreamTemplate: %w", err)
	}
	if err := checkStream(names.Expand("topic")); err != nil {
		return nil, fmt.Errorf("wharfkinesis: Options.StreamTemplate %q: %w", opts.StreamTemplate, err)
	}
	if opts.MaxRecordBytes == 0 {
		opts.MaxRecordBytes = defaultMaxRecord
	}
	if opts.MaxRecordBytes < 1024 || opts.MaxRecordBytes > defaultMaxRecord {
		return nil, fmt.Errorf("wharfkinesis: Options.MaxRecordBytes %d is not from 1024 to %d", opts.MaxRecordBytes, defaultMaxRecord)
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfkinesis: Options.CloudEvents: %w", err)
	}
	if ce.Mode == cloudevents.Binary {
		return nil, fmt.Errorf("wharfkinesis: Options.CloudEvents: %s", errBinaryCE)
	}
	if ce.On() && opts.Format == FormatRaw {
		return nil, fmt.Errorf("wharfkinesis: Options: %s", errRawCE)
	}
	s := &Sink{client: client, opts: opts, names: names, ce: ce}
	s.encoders.New = func() any { return new(envelope.Encoder) }
	return s, nil
}

// Stream returns the stream a message of the wharf topic goes to.
func (s *Sink) Stream(topic string) string { return s.names.Expand(topic) }

var errClosed = errors.New("wharfkinesis: the sink is closed")

// record is one message ready for PutRecords.
type record struct {
	idx  int
	data []byte
	pk   string
}

// Publish writes msgs and returns one result per message, or nil when
// Kinesis stored all of them. It sends nothing more once ctx is done.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if s.closed.Load() {
		return wharf.FailAll(len(msgs), errClosed)
	}
	res := wharf.NewResults(msgs)
	byStream := map[string][]int{}
	var order []string
	for i, m := range msgs {
		name := s.Stream(m.Topic)
		if err := checkStream(name); err != nil {
			res.Set(i, wharf.Permanent(fmt.Errorf("wharfkinesis: message %s: wharf topic %q gives stream name %q: %w", m.ID, m.Topic, name, err)))
			continue
		}
		if _, ok := byStream[name]; !ok {
			order = append(order, name)
		}
		byStream[name] = append(byStream[name], i)
	}
	var mu sync.Mutex // guards res
	var wg sync.WaitGroup
	for _, name := range order {
		wg.Go(func() { s.publishTo(ctx, msgs, name, byStream[name], res, &mu) })
	}
	wg.Wait()
	return res.Errors()
}

// publishTo writes the messages idx of msgs to stream name in rounds: each
// request takes the next message of every key.
func (s *Sink) publishTo(ctx context.Context, msgs []*wharf.Message, name string, idx []int, res *wharf.Results, mu *sync.Mutex) {
	s.last.Store(name)
	pending := idx
	for len(pending) > 0 {
		var batch []record
		var rest []int
		size := 0
		seen := map[string]bool{}
		mu.Lock()
		for _, i := range pending {
			if res.Done(i) || res.Blocked(i) {
				continue
			}
			k := msgs[i].OrderingKey()
			if k != "" && seen[k] {
				rest = append(rest, i)
				continue
			}
			if k != "" {
				seen[k] = true
			}
			if len(batch) == maxRecords {
				rest = append(rest, i)
				continue
			}
			r, err := s.encode(msgs[i], i)
			if err != nil {
				res.Set(i, err)
				continue
			}
			if n := len(r.data) + len(r.pk); size+n > maxRequestBytes {
				rest = append(rest, i)
				continue
			} else {
				size += n
			}
			batch = append(batch, r)
		}
		mu.Unlock()
		pending = rest
		if len(batch) == 0 {
			continue
		}
		if ctx.Err() != nil {
			mu.Lock()
			for _, r := range batch {
				res.Set(r.idx, notSent(ctx))
			}
			res.FailRest(notSent(ctx))
			mu.Unlock()
			return
		}
		errs, err := s.put(ctx, name, batch)
		mu.Lock()
		if err != nil {
			err = fmt.Errorf("wharfkinesis: stream %s: %w", name, err)
			for _, r := range batch {
				res.Set(r.idx, err)
			}
			for _, i := range pending {
				if !res.Done(i) {
					res.Set(i, fmt.Errorf("%w: an earlier request to stream %s failed", wharf.ErrNotAttempted, name))
				}
			}
			mu.Unlock()
			return
		}
		for j, r := range batch {
			res.Set(r.idx, errs[j])
		}
		mu.Unlock()
	}
}

// encode builds m's record; a record Kinesis cannot take fails permanently.
func (s *Sink) encode(m *wharf.Message, idx int) (record, error) {
	r := record{idx: idx, pk: partitionKey(m)}
	if s.ce.On() {
		enc, err := s.ce.Encode(m, bindingKinesis)
		if err != nil {
			return r, wharf.Permanent(fmt.Errorf("wharfkinesis: %w", err))
		}
		r.data = enc.Body
	} else if s.opts.Format == FormatRaw {
		r.data = m.Payload
	} else {
		e := s.encoders.Get().(*envelope.Encoder)
		r.data = e.AppendMessage(nil, m, envelope.Extra{})
		s.encoders.Put(e)
	}
	if len(r.data) == 0 {
		return r, wharf.Permanent(fmt.Errorf("wharfkinesis: message %s: empty payload: a Kinesis record with format=raw needs data", m.ID))
	}
	if n := len(r.data) + len(r.pk); n > s.opts.MaxRecordBytes {
		return r, wharf.Permanent(fmt.Errorf("wharfkinesis: message %s: the record has %d bytes (payload %d), above the limit of %d (max_record_bytes)", m.ID, n, len(m.Payload), s.opts.MaxRecordBytes))
	}
	return r, nil
}

// partitionKey is the key, or the message id for an unkeyed message; a key
// longer than Kinesis takes is hashed.
func partitionKey(m *wharf.Message) string {
	if m.Key == "" {
		return m.ID
	}
	if utf8.RuneCountInString(m.Key) <= maxPartitionKey {
		return m.Key
	}
	sum := sha256.Sum256([]byte(m.Key))
	return "wharf-sha256-" + hex.EncodeToString(sum[:])
}

// put sends one PutRecords request and returns each record's result.
func (s *Sink) put(ctx context.Context, stream string, batch []record) ([]error, error) {
	in := &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: make([]types.PutRecordsRequestEntry, len(batch))}
	for j, r := range batch {
		in.Records[j] = types.PutRecordsRequestEntry{Data: r.data, PartitionKey: aws.String(r.pk)}
	}
	out, err := s.client.PutRecords(ctx, in)
	if err != nil {
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("the stream does not exist (%w): create it, or fix stream_template; the messages are retried until then", err)
		}
		return nil, err
	}
	if len(out.Records) != len(batch) {
		return nil, fmt.Errorf("PutRecords answered %d results for %d records", len(out.Records), len(batch))
	}
	errs := make([]error, len(batch))
	for j, e := range out.Records {
		if e.ErrorCode != nil {
			errs[j] = fmt.Errorf("wharfkinesis: stream %s refused the record: %s: %s", stream, aws.ToString(e.ErrorCode), aws.ToString(e.ErrorMessage))
		} else if e.SequenceNumber == nil {
			errs[j] = fmt.Errorf("wharfkinesis: stream %s: the result has neither a sequence number nor an error", stream)
		}
	}
	return errs, nil
}

// checkStream accepts a Kinesis stream name: 1 to 128 letters, digits,
// '_', '-' and '.'.
func checkStream(name string) error {
	if name == "" || len(name) > 128 {
		return errors.New("a stream name has 1 to 128 characters")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !isAlnum(c) && c != '_' && c != '-' && c != '.' {
			return errors.New("a stream name has only letters, digits, '_', '-' and '.'")
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

var errNotSent = errors.New("not sent: the publish was cut short")

func notSent(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && !errors.Is(cause, err) {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	return fmt.Errorf("wharfkinesis: %w: %w", errNotSent, err)
}

// Ping checks that Kinesis answers: it describes the stream last written
// to (the template's stream when it names one), or lists one stream when
// there is none yet. It implements [wharf.Pinger].
func (s *Sink) Ping(ctx context.Context) error {
	name, _ := s.last.Load().(string)
	if name == "" && s.names.Expand("a") == s.names.Expand("b") {
		name = s.names.Expand("a")
	}
	var err error
	if name != "" {
		_, err = s.client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
	} else {
		_, err = s.client.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)})
	}
	if err != nil {
		return fmt.Errorf("wharfkinesis: Kinesis does not answer: %w", err)
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

// urlConfig is what a kinesis:// URL says.
type urlConfig struct {
	awsurl.Common
	opts Options
}

// Open opens the sink a kinesis:// URL names (see the package
// documentation). It is the opener the CLI registers for "kinesis". When
// the template names one stream, Open checks that it exists.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	cfg, tr, err := c.Load(ctx, "kinesis")
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	s, err := New(kinesis.NewFromConfig(cfg), c.opts)
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

func parseURL(u *url.URL) (urlConfig, error) {
	shown := u.Redacted()
	var c urlConfig
	var err error
	if c.Common, err = awsurl.Parse(u, "kinesis", "wharfkinesis", "kinesis://[REGION]?option=value"); err != nil {
		return c, err
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "stream_template":
			c.opts.StreamTemplate = v
		case "endpoint", "profile":
			if _, err := c.Option(shown, k, v, "http://127.0.0.1:4567"); err != nil {
				return c, err
			}
		case "format":
			switch v {
			case "envelope":
				c.opts.Format = FormatEnvelope
			case "raw":
				c.opts.Format = FormatRaw
			default:
				return c, fmt.Errorf("sink URL %q: format=%q: want envelope (JSON with id, topic, key, headers and payload) or raw (the payload alone)", shown, v)
			}
		case "ce":
			mode, err := cloudevents.ParseMode(v)
			if err != nil {
				return c, fmt.Errorf("sink URL %q: ce=%q: want structured (a Kinesis record has no attributes for binary)", shown, v)
			}
			if mode == cloudevents.Binary {
				return c, fmt.Errorf("sink URL %q: %s", shown, errBinaryCE)
			}
			c.opts.CloudEvents = v
		case "ce_source":
			c.opts.CloudEventsSource = v
		case "max_record_bytes":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1024 || n > defaultMaxRecord {
				return c, fmt.Errorf("sink URL %q: max_record_bytes=%q: want a byte count from 1024 to %d", shown, v, defaultMaxRecord)
			}
			c.opts.MaxRecordBytes = n
		default:
			return c, fmt.Errorf("sink URL %q: unknown option %q: the kinesis sink takes stream_template, endpoint, profile, format, max_record_bytes, ce and ce_source", urlmask.Option(u, k), k)
		}
	}
	ce, err := cloudevents.NewConfig(c.opts.CloudEvents, c.opts.CloudEventsSource)
	if err != nil {
		return c, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, c.opts.CloudEvents, c.opts.CloudEventsSource, err)
	}
	if ce.On() && c.opts.Format == FormatRaw {
		return c, fmt.Errorf("sink URL %q: %s", shown, errRawCE)
	}
	names, err := wharf.ParseTopicTemplate(c.opts.StreamTemplate)
	if err != nil {
		return c, fmt.Errorf("sink URL %q: stream_template: %w", shown, err)
	}
	if err := checkStream(names.Expand("topic")); err != nil {
		return c, fmt.Errorf("sink URL %q: stream_template=%s: %w", shown, c.opts.StreamTemplate, err)
	}
	return c, nil
}
