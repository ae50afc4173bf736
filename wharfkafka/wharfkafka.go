// Package wharfkafka is the Kafka sink of Wharf, built on franz-go.
//
// A [Sink] produces every message of a batch asynchronously with one
// idempotent franz-go client (acks=all) and acknowledges each message only
// when its produce promise reported success, that is once every in-sync
// replica has it. The message key becomes the record key, so the partitioner
// keeps a key's records in one partition, in order; the headers become record
// headers, plus "wharf-message-id" carrying [wharf.Message.MessageID] for
// consumers to deduplicate on.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	kafka://host:port[,host:port...][?option=value&...]
//
// Options, all optional:
//
//   - topic_template: the Kafka topic of a message, with "{{topic}}" replaced
//     by the wharf topic, e.g. "prod.{{topic}}". Defaults to "{{topic}}".
//   - client_id: the Kafka client id. Defaults to "wharf".
//   - max_message_bytes: the largest record batch the client builds; set it to
//     at most the topic's max.message.bytes. A message whose record alone is
//     larger fails permanently. Defaults to 1000012 (franz-go's default).
//   - delivery_timeout: how long a record may wait for acks=all, including
//     the client's internal retries, before it fails and the relay retries it
//     later, e.g. "30s". Defaults to 30s.
//   - compression: "snappy", "lz4", "zstd", "gzip" or "none". Defaults to
//     "snappy" (falling back to none for brokers without it).
//   - tls: "true" to connect with TLS using the system's roots. Defaults to
//     "false".
//
// A URL with a user or password is rejected: for SASL, TLS client
// certificates or any other franz-go setting, build the sink with [New] and
// pass [kgo.Opt] values.
//
// # Failures and ordering
//
// Publish returns the real result of every record. These fail permanently
// (the relay dead-letters them at once): a topic template that yields an
// empty topic, a record larger than max_message_bytes (checked before
// producing, so the later messages of its key in the batch are reported with
// [wharf.ErrNotAttempted] and never sent), and the broker's
// INVALID_TOPIC_EXCEPTION and INVALID_RECORD. Everything else is retried by the
// relay with backoff: timeouts, a broker that is down, authorization errors
// (an operator can fix them without losing messages), and an unknown topic
// when the broker does not create topics (franz-go first retries it
// internally; create the topic and the messages go out; after the relay's
// attempt limit they are dead-lettered). A MESSAGE_TOO_LARGE returned by the
// broker is retried too, because it rejects a whole record batch, not one
// message: it means max_message_bytes is above the topic's max.message.bytes.
//
// When a record of key K fails after it was handed to franz-go, the later
// records of K in the batch were handed over too, and Publish reports each
// record's real result rather than claiming they were not attempted. A
// delivery timeout or a cancelled context fails every record buffered for
// the partition (franz-go never fails a record and then writes a later one of
// its partition), so the later records of K fail with it. A non-retriable
// broker error (INVALID_RECORD, INVALID_TOPIC_EXCEPTION, or MESSAGE_TOO_LARGE
// when max_message_bytes exceeds the topic's limit) fails only its record
// batch: a later record of K that went in another record batch of the same
// partition can still be written, and is then reported acknowledged. Same-key
// records of one Publish usually share a record batch; when they do not,
// such an error breaks K's order, which the dead letter (or, for
// MESSAGE_TOO_LARGE, the redelivery) makes visible.
package wharfkafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wharfhq/wharf"
)

// HeaderMessageID is the record header that carries [wharf.Message.MessageID].
const HeaderMessageID = "wharf-message-id"

// TopicPlaceholder is replaced by the wharf topic in Options.TopicTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	defaultClientID        = "wharf"
	defaultDeliveryTimeout = 30 * time.Second
	defaultMaxMessageBytes = 1000012
)

// Options configures a [Sink].
type Options struct {
	// Brokers are the seed brokers, as host:port. Required.
	Brokers []string
	// TopicTemplate names the Kafka topic of a message: TopicPlaceholder is
	// replaced by the message's topic. Defaults to "{{topic}}".
	TopicTemplate string
	// ClientID is the Kafka client id. Defaults to "wharf".
	ClientID string
	// MaxMessageBytes is the largest record batch the producer builds; it
	// must not exceed the topics' max.message.bytes. A message whose record
	// alone would be larger fails permanently. Defaults to 1000012.
	MaxMessageBytes int32
	// DeliveryTimeout bounds how long a record waits to be acknowledged by
	// all in-sync replicas, the client's internal retries included, before
	// it fails and is left to the relay's retry. Defaults to 30s.
	DeliveryTimeout time.Duration
	// Compression is the preferred batch compression: "snappy", "lz4",
	// "zstd", "gzip" or "none". Defaults to "snappy".
	Compression string
}

// Sink is a [wharf.Sink] that produces to Kafka. It is safe for concurrent use.
type Sink struct {
	cl        *kgo.Client
	topics    wharf.TopicTemplate
	maxBytes  func(string) int32
	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink producing with an idempotent franz-go client that
// requires acks from all in-sync replicas. extra options are applied after
// the sink's own, so they can change anything except that Publish waits for
// every record's promise. The client connects lazily: New does not fail when
// the brokers are down.
func New(opts Options, extra ...kgo.Opt) (*Sink, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	codec, err := codecFor(opts.Compression)
	if err != nil {
		return nil, err
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ClientID(opts.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(opts.MaxMessageBytes),
		kgo.RecordDeliveryTimeout(opts.DeliveryTimeout),
		kgo.ProducerBatchCompression(codec, kgo.NoCompression()),
		// The relay batches already; lingering would only add latency.
		kgo.ProducerLinger(0),
	}
	kopts = append(kopts, extra...)
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("wharfkafka: %w", err)
	}
	s := &Sink{cl: cl}
	s.topics, _ = wharf.ParseTopicTemplate(opts.TopicTemplate) // checked by validate
	s.maxBytes = func(string) int32 { return opts.MaxMessageBytes }
	if fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		s.maxBytes = fn // extra options may have changed it
	}
	return s, nil
}

func (o *Options) validate() error {
	if len(o.Brokers) == 0 {
		return errors.New("wharfkafka: Options.Brokers is empty: name at least one broker as host:port")
	}
	for _, b := range o.Brokers {
		if strings.TrimSpace(b) == "" {
			return errors.New("wharfkafka: Options.Brokers has an empty entry")
		}
	}
	if o.TopicTemplate == "" {
		o.TopicTemplate = TopicPlaceholder
	}
	if _, err := wharf.ParseTopicTemplate(o.TopicTemplate); err != nil {
		return fmt.Errorf("wharfkafka: Options.TopicTemplate: %w", err)
	}
	if o.ClientID == "" {
		o.ClientID = defaultClientID
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = defaultMaxMessageBytes
	}
	if o.MaxMessageBytes < 512 || o.MaxMessageBytes > 1<<30 {
		return fmt.Errorf("wharfkafka: Options.MaxMessageBytes %d is out of range: want 512 to %d", o.MaxMessageBytes, 1<<30)
	}
	if o.DeliveryTimeout == 0 {
		o.DeliveryTimeout = defaultDeliveryTimeout
	}
	if o.DeliveryTimeout < 0 {
		return fmt.Errorf("wharfkafka: Options.DeliveryTimeout %s is negative", o.DeliveryTimeout)
	}
	return nil
}

func codecFor(name string) (kgo.CompressionCodec, error) {
	switch strings.ToLower(name) {
	case "", "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "none":
		return kgo.NoCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("wharfkafka: unknown compression %q: want snappy, lz4, zstd, gzip or none", name)
}

// Topic returns the Kafka topic a message of the wharf topic goes to.
func (s *Sink) Topic(topic string) string { return s.topics.Expand(topic) }

// Client returns the underlying franz-go client, for metrics or admin calls.
// Closing it breaks the sink.
func (s *Sink) Client() *kgo.Client { return s.cl }

// recordOverhead bounds what a one-record batch adds to the key, value and
// headers: the 61-byte batch header plus the record's varints (length,
// attributes, timestamp and offset deltas, key and value lengths, header
// count: at most 5+1+10+5+5+5+5 bytes).
const recordOverhead = 61 + 36

// headerOverhead bounds the varints of one header's key and value lengths.
const headerOverhead = 10

func recordSize(r *kgo.Record) int {
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

// call is one Publish's results, written by franz-go's promise goroutine.
type call struct {
	mu        sync.Mutex
	errs      []error
	resolved  []bool // the promise of the record reported
	pending   int
	done      chan struct{}
	abandoned bool // Publish returned; late promises must not touch errs
}

// Publish produces msgs and waits until franz-go reported every record's
// result or ctx ends. Records still in flight when ctx ends are reported
// with ctx's error; franz-go may still deliver them, which the relay's
// redelivery tolerates (at least once), and never after a later record of
// their partition.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), fmt.Errorf("wharfkafka: %w", err))
	}
	c := &call{
		errs:     make([]error, len(msgs)),
		resolved: make([]bool, len(msgs)),
		pending:  1, // held until every record was handed over
		done:     make(chan struct{}),
	}
	var blocked map[string]bool // keys with a message that failed before producing
	for i, m := range msgs {
		if m.Key != "" && blocked[m.Key] {
			c.finish(i, wharf.ErrNotAttempted, false)
			continue
		}
		rec, err := s.record(m)
		if err != nil {
			c.finish(i, err, false)
			if m.Key != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[m.Key] = true
			}
			continue
		}
		c.add()
		topic := rec.Topic
		s.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			c.finish(i, classify(topic, err), true)
		})
	}
	c.release()
	select {
	case <-c.done:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.abandoned = true
	if c.pending > 0 {
		err := fmt.Errorf("wharfkafka: gave up waiting for the broker's acknowledgement: %w", ctx.Err())
		for i, ok := range c.resolved {
			if !ok {
				c.errs[i] = err
			}
		}
	}
	if allNil(c.errs) {
		return nil
	}
	return c.errs
}

func (c *call) add() {
	c.mu.Lock()
	c.pending++
	c.mu.Unlock()
}

// finish records message i's result; produced says a promise is done.
func (c *call) finish(i int, err error, produced bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abandoned {
		return
	}
	c.errs[i] = err
	c.resolved[i] = true
	if produced {
		c.done1()
	}
}

// release drops the hold taken while records were being handed over.
func (c *call) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done1()
}

func (c *call) done1() {
	c.pending--
	if c.pending == 0 {
		close(c.done)
	}
}

func allNil(errs []error) bool {
	for _, e := range errs {
		if e != nil {
			return false
		}
	}
	return true
}

func (s *Sink) record(m *wharf.Message) (*kgo.Record, error) {
	topic := s.Topic(m.Topic)
	if topic == "" {
		return nil, wharf.Permanent(fmt.Errorf("wharfkafka: message %d: topic template gives an empty Kafka topic for wharf topic %q", m.ID, m.Topic))
	}
	r := &kgo.Record{Topic: topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	for k, v := range m.Headers {
		if k == HeaderMessageID {
			continue // ours is authoritative
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(m.MessageID())})
	if limit := int(s.maxBytes(topic)); recordSize(r) > limit {
		return nil, wharf.Permanent(fmt.Errorf("wharfkafka: message %d: record of about %d bytes exceeds max_message_bytes %d: %w", m.ID, recordSize(r), limit, kerr.MessageTooLarge))
	}
	return r, nil
}

// classify turns a promise's error into a relay result.
func classify(topic string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.InvalidRecord):
		return wharf.Permanent(fmt.Errorf("wharfkafka: produce to %q: %w", topic, err))
	case errors.Is(err, kerr.MessageTooLarge):
		return fmt.Errorf("wharfkafka: produce to %q: the broker rejected a record batch as too large; set max_message_bytes to at most the topic's max.message.bytes: %w", topic, err)
	}
	return fmt.Errorf("wharfkafka: produce to %q: %w", topic, err)
}

// Close closes the client. Records still buffered fail with
// kgo.ErrClientClosed; their Publish reports them failed.
func (s *Sink) Close() error {
	s.closeOnce.Do(s.cl.Close)
	return nil
}

// Open opens the sink a kafka:// URL names (see the package documentation
// for its options). It is the opener the CLI registers for the "kafka"
// scheme. It does not connect: the brokers may be down when the relay starts.
func Open(_ context.Context, u *url.URL) (wharf.Sink, error) {
	opts, tlsOn, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	var extra []kgo.Opt
	if tlsOn {
		extra = append(extra, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	return New(opts, extra...)
}

func parseURL(u *url.URL) (opts Options, tlsOn bool, err error) {
	shown := u.Redacted()
	if u.Scheme != "kafka" {
		return opts, false, fmt.Errorf("sink URL %q: wharfkafka opens kafka:// URLs", shown)
	}
	if u.User != nil {
		return opts, false, fmt.Errorf("sink URL %q: the kafka sink takes no user or password in the URL: for SASL build the sink with wharfkafka.New and kgo.SASL", shown)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return opts, false, fmt.Errorf("sink URL %q: write kafka://host:port[,host:port]?option=value", shown)
	}
	for b := range strings.SplitSeq(u.Host, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
		if !strings.Contains(b, ":") {
			b += ":9092"
		}
		opts.Brokers = append(opts.Brokers, b)
	}
	if len(opts.Brokers) == 0 {
		return opts, false, fmt.Errorf("sink URL %q names no broker: write kafka://host:port", shown)
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "topic_template":
			opts.TopicTemplate = v
		case "client_id":
			opts.ClientID = v
		case "max_message_bytes":
			n, perr := strconv.ParseInt(v, 10, 32)
			if perr != nil || n <= 0 {
				return opts, false, fmt.Errorf("sink URL %q: max_message_bytes=%q is not a positive number of bytes", shown, v)
			}
			opts.MaxMessageBytes = int32(n)
		case "delivery_timeout":
			d, perr := time.ParseDuration(v)
			if perr != nil || d <= 0 {
				return opts, false, fmt.Errorf("sink URL %q: delivery_timeout=%q is not a positive duration such as 30s", shown, v)
			}
			opts.DeliveryTimeout = d
		case "compression":
			if _, cerr := codecFor(v); cerr != nil {
				return opts, false, fmt.Errorf("sink URL %q: compression=%q: want snappy, lz4, zstd, gzip or none", shown, v)
			}
			opts.Compression = v
		case "tls":
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				return opts, false, fmt.Errorf("sink URL %q: tls=%q: want true or false", shown, v)
			}
			tlsOn = b
		default:
			return opts, false, fmt.Errorf("sink URL %q: unknown option %q: the kafka sink takes topic_template, client_id, max_message_bytes, delivery_timeout, compression and tls", shown, k)
		}
	}
	return opts, tlsOn, nil
}
