// Package wharfkafka is the Kafka sink of Wharf, built on franz-go.
//
// A [Sink] produces every message of a batch asynchronously with one
// idempotent franz-go client (acks=all) and acknowledges each message only
// when its produce promise reported success, that is once every in-sync
// replica has it. The message key becomes the record key, so the default
// partitioner (murmur2, as the Java client) keeps a key's records in one
// partition, in order; the headers become record headers, plus
// "wharf-message-id" carrying [wharf.Message.ID] for consumers to deduplicate
// on. docs/sinks/kafka.md in the repository describes the sink for operators.
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
//   - delivery_timeout: how long a Publish waits for acks=all, the client's
//     internal retries included, before the records still unacknowledged
//     fail and the relay retries them later, e.g. "30s". It bounds Publish
//     even when a produce request was written and no answer comes. Defaults
//     to 30s.
//   - compression: "snappy", "lz4", "zstd", "gzip" or "none". Defaults to
//     "snappy" (falling back to none for brokers without it).
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//   - tls: "true" to connect with TLS using the system's roots. Defaults to
//     "false".
//   - tls_ca: a PEM file of the CA certificates to verify the brokers with
//     (default: the system's roots); tls_cert and tls_key: a client
//     certificate and its key (mutual TLS). Any of them turns TLS on.
//
// A URL with a user or password is rejected: for SASL or any other franz-go
// setting, build the sink with [New] and pass [kgo.Opt] values.
//
// # CloudEvents
//
// With ce=binary each record follows the CloudEvents Kafka binding's binary
// mode: the value is the payload, the attributes are headers "ce_<name>"
// (ce_specversion "1.0", ce_id the message id, ce_source, ce_type the wharf
// topic, ce_subject the key, absent without one, ce_time the enqueue time,
// ce_traceparent and ce_tracestate from the message's trace context headers)
// and datacontenttype is the "content-type" header (the message's own
// content-type header, else application/json for a JSON payload, else
// application/octet-stream). With ce=structured the value is the JSON event
// and content-type is "application/cloudevents+json; charset=UTF-8". The
// record key is the message key in both modes, and the other headers,
// wharf-message-id included, are sent as without CloudEvents. A message whose
// topic, key or trace context cannot be a CloudEvents attribute (invalid
// UTF-8, control characters) fails permanently.
//
// # Failures and ordering
//
// Publish returns the real result of every record, within delivery_timeout
// (plus a fraction of a second) and promptly once its context ends. These fail
// permanently (the relay dead-letters them at once): a topic template that
// yields an empty topic, a record larger than max_message_bytes (both checked
// before producing, so the later messages of its ordering key in the batch
// are reported with [wharf.ErrNotAttempted] and never sent), and the broker's
// INVALID_TOPIC_EXCEPTION. Everything else is retried by the relay with
// backoff, including INVALID_RECORD and MESSAGE_TOO_LARGE: the broker rejects
// a whole record batch, and franz-go then fails every record buffered for the
// partition with that error, so the sink cannot tell the culprit from the
// records that merely shared its partition; a message that keeps failing is
// dead-lettered after the relay's attempt limit.
//
// A partition keeps its order within one client: franz-go retries retriable
// errors in order, any failure fails every record buffered for the partition
// with it, and later record batches already in flight are refused by the
// broker's sequence check. A delivery timeout or a cancelled context cancels
// a produce request still unanswered (kgo.AllowIdempotentProduceCancellation):
// the client then moves to a new producer epoch, so a late copy of that
// request is refused by the broker once the partition holds a newer batch, and
// otherwise lands ahead of it. Publish hands no record to franz-go after a
// failure of its ordering key was reported, but franz-go reports failures
// asynchronously: a record handed over just after franz-go failed the records
// buffered ahead of it (an earlier one of its key among them) starts afresh
// and can be written ahead of the earlier one. Publish then reports it
// acknowledged and the earlier one failed, and the relay sends it again after
// the earlier one, so each key's last copies are in order. Redelivery can
// duplicate a record; consumers deduplicate by the "wharf-message-id" header.
package wharfkafka

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/tlsfiles"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// HeaderMessageID is the record header that carries [wharf.Message.ID].
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
	// DeliveryTimeout bounds how long a Publish waits for its records to be
	// acknowledged by all in-sync replicas, the client's internal retries
	// included, before the unacknowledged ones fail and are left to the
	// relay's retry. It holds when a produce request was written and no
	// answer comes: the request is cancelled. Defaults to 30s.
	DeliveryTimeout time.Duration
	// Compression is the preferred batch compression: "snappy", "lz4",
	// "zstd", "gzip" or "none". Defaults to "snappy".
	Compression string
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see the package documentation). Defaults to "" (none).
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that produces to Kafka. It is safe for concurrent use.
type Sink struct {
	cl       *kgo.Client
	topics   wharf.TopicTemplate
	maxBytes func(string) int32
	// timeout bounds each Publish's records (0: only its context does);
	// timedOut is the cause its context ends with then.
	timeout   time.Duration
	timedOut  error
	conns     *connWatch
	ce        cloudevents.Config
	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink producing with an idempotent franz-go client that
// requires acks from all in-sync replicas. extra options are applied after
// the sink's own, so they can change anything except that Publish waits for
// every record's promise; a kgo.TransactionalID is refused (see the package
// documentation). The client connects lazily: New does not fail when the
// brokers are down.
func New(opts Options, extra ...kgo.Opt) (*Sink, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	codec, err := codecFor(opts.Compression)
	if err != nil {
		return nil, err
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfkafka: Options.CloudEvents: %w", err)
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ClientID(opts.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(opts.MaxMessageBytes),
		kgo.RecordDeliveryTimeout(opts.DeliveryTimeout),
		// Without it franz-go never fails a batch it wrote and got no answer
		// for, so a broker that went silent would hold Publish (and the
		// partition) until the connection dies. Failing such a batch can
		// duplicate it, which the relay's redelivery does anyway.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProducerBatchCompression(codec, kgo.NoCompression()),
		// The relay batches already; lingering would only add latency.
		kgo.ProducerLinger(0),
	}
	conns := &connWatch{}
	kopts = append(kopts, kgo.WithHooks(conns))
	kopts = append(kopts, extra...)
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		if strings.Contains(err.Error(), "transactional") {
			return nil, fmt.Errorf("wharfkafka: transactional producers are not supported: the sink cancels produce requests left unanswered, which a transactional producer cannot: %w", err)
		}
		return nil, fmt.Errorf("wharfkafka: %w", err)
	}
	s := &Sink{cl: cl, timeout: opts.DeliveryTimeout, conns: conns, ce: ce}
	s.topics, _ = wharf.ParseTopicTemplate(opts.TopicTemplate) // checked by validate
	s.maxBytes = func(string) int32 { return opts.MaxMessageBytes }
	if fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		s.maxBytes = fn // extra options may have changed it
	}
	if d, ok := cl.OptValue(kgo.RecordDeliveryTimeout).(time.Duration); ok {
		s.timeout = d // likewise; 0 turns the bound off
	}
	s.timedOut = fmt.Errorf("no acknowledgement from Kafka within delivery_timeout (%s)", s.timeout)
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

// abandonGrace is how long Publish still waits for franz-go's verdicts once
// its records' context ended: cancelled requests and expired batches are
// reported within milliseconds, and a real result (often a success) beats a
// guessed failure that makes the relay send the message again.
const abandonGrace = 250 * time.Millisecond

// call is one Publish's results, also written by franz-go's promise goroutine.
type call struct {
	mu        sync.Mutex
	res       *wharf.Results
	pending   int
	done      chan struct{}
	abandoned bool // Publish returned; late promises must not touch res
}

// Publish produces msgs and waits until franz-go reported every record's
// result, delivery_timeout passed, or ctx ended. It hands no record to
// franz-go once ctx is done, nor a record whose ordering key already has a
// failure in the batch. The records' context ends with ctx or at
// delivery_timeout; franz-go then fails what it has not written and cancels
// requests still unanswered. What is left without a result after a short
// grace fails with a retryable error: franz-go may still deliver it (the
// relay's redelivery tolerates that), never after a later record of its
// partition from this sink.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	res := wharf.NewResults(msgs)
	if ctx.Err() != nil {
		res.FailRest(notSent(ctx))
		return res.Errors()
	}
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if s.timeout > 0 {
		pctx, cancel = context.WithTimeoutCause(ctx, s.timeout, s.timedOut)
	}
	defer cancel()
	c := &call{res: res, pending: 1, done: make(chan struct{})} // held until every record was handed over
	handed := make([]bool, len(msgs))
	for i, m := range msgs {
		// ctx's own Err: the relay's context reports a lease that ended
		// while this process was paused at this very call (and ends pctx).
		if ctx.Err() != nil || pctx.Err() != nil {
			break
		}
		c.mu.Lock()
		blocked := res.Blocked(i)
		c.mu.Unlock()
		if blocked {
			continue
		}
		rec, err := s.record(m)
		if err != nil {
			c.mu.Lock()
			res.Fail(i, err)
			c.mu.Unlock()
			continue
		}
		c.mu.Lock()
		c.pending++
		c.mu.Unlock()
		handed[i] = true
		s.cl.Produce(pctx, rec, func(r *kgo.Record, err error) {
			c.finish(i, s.result(pctx, r.Topic, err))
		})
	}
	c.finish(-1, nil)
	select {
	case <-c.done:
	case <-pctx.Done():
		t := time.NewTimer(abandonGrace)
		select {
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.abandoned = true
	for i := range msgs {
		switch {
		case res.Done(i):
		case handed[i]:
			res.Fail(i, fmt.Errorf("wharfkafka: message %s: gave up waiting for Kafka's acknowledgement: %w%s", msgs[i].ID, ctxErr(pctx), s.conns.hint()))
		default:
			res.Fail(i, notSent(pctx))
		}
	}
	return res.Errors()
}

// finish records message i's result; i < 0 drops the hold Publish takes
// while it hands records over.
func (c *call) finish(i int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abandoned {
		return
	}
	if i >= 0 {
		c.res.Set(i, err)
	}
	c.pending--
	if c.pending == 0 {
		close(c.done)
	}
}

// errNotSent marks a message Publish did not hand to franz-go because its
// context ended.
var errNotSent = errors.New("not sent: the publish was cut short")

func notSent(ctx context.Context) error {
	return fmt.Errorf("wharfkafka: %w: %w", errNotSent, ctxErr(ctx))
}

// ctxErr is ctx's error with its cause, when one was given (the relay says
// why it cut a publish short; the sink, that delivery_timeout passed).
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}

func (s *Sink) record(m *wharf.Message) (*kgo.Record, error) {
	topic := s.Topic(m.Topic)
	if topic == "" {
		return nil, wharf.Permanent(fmt.Errorf("wharfkafka: message %s: topic template gives an empty Kafka topic for wharf topic %q", m.ID, m.Topic))
	}
	r := &kgo.Record{Topic: topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	var enc cloudevents.Encoded
	if s.ce.On() {
		var err error
		if enc, err = s.ce.Encode(m, cloudevents.Kafka); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfkafka: %w", err))
		}
		r.Value = enc.Body
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+len(enc.Headers)+2)
	for k, v := range m.Headers {
		if k == HeaderMessageID || (s.ce.On() && enc.Replaces(k)) {
			continue // ours is authoritative
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(m.ID)})
	for _, a := range enc.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: a.Name, Value: []byte(a.Value)})
	}
	if enc.ContentType != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte(enc.ContentType)})
	}
	if limit := int(s.maxBytes(topic)); recordSize(r) > limit {
		return nil, wharf.Permanent(fmt.Errorf("wharfkafka: message %s: record of about %d bytes exceeds max_message_bytes %d: %w", m.ID, recordSize(r), limit, kerr.MessageTooLarge))
	}
	return r, nil
}

// result turns a promise's error into a relay result; pctx is the records'
// context.
func (s *Sink) result(pctx context.Context, topic string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if pctx.Err() != nil {
			return fmt.Errorf("wharfkafka: produce to %q: not acknowledged: %w%s", topic, ctxErr(pctx), s.conns.hint())
		}
		// franz-go fails a partition's buffered records together, by the
		// first one's context, which another Publish may have given.
		return fmt.Errorf("wharfkafka: produce to %q: failed with the records ahead of it in its partition, whose publish was cut short: %w", topic, err)
	case errors.Is(err, kgo.ErrRecordTimeout):
		return fmt.Errorf("wharfkafka: produce to %q: %w: %w%s", topic, s.timedOut, err, s.conns.hint())
	case errors.Is(err, kerr.InvalidTopicException):
		return wharf.Permanent(fmt.Errorf("wharfkafka: produce to %q: %w", topic, err))
	case errors.Is(err, kerr.InvalidRecord):
		return fmt.Errorf("wharfkafka: produce to %q: the broker rejected a record batch holding this message, or another of its partition (franz-go fails them all); it is retried, and a message that keeps failing is dead-lettered after the attempt limit: %w", topic, err)
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
	files := tlsfiles.FromQuery(u.Query(), tlsNames)
	if files.Any() {
		if u.Query().Has("tls") && !tlsOn {
			return nil, fmt.Errorf("sink URL %q: tls=false with tls_ca, tls_cert or tls_key: the files are for TLS; drop tls=false", u.Redacted())
		}
		tlsOn = true
	}
	if tlsOn {
		tc, err := files.Config(tlsNames)
		if err != nil {
			return nil, fmt.Errorf("sink URL %q: %w", u.Redacted(), err)
		}
		extra = append(extra, kgo.DialTLSConfig(tc))
	}
	mech, err := saslFromURL(u, tlsOn, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if mech != nil {
		extra = append(extra, kgo.SASL(mech))
	}
	return New(opts, extra...)
}

// saslFromURL is the SASL mechanism the URL's sasl, sasl_user and
// sasl_password_env options name, nil without sasl. The password is read
// from the environment variable sasl_password_env names, never from the
// URL: a URL ends up in logs, process lists and config files.
func saslFromURL(u *url.URL, tlsOn bool, env func(string) (string, bool)) (sasl.Mechanism, error) {
	q := u.Query()
	shown := u.Redacted()
	method := strings.ToLower(q.Get("sasl"))
	user, passEnv := q.Get("sasl_user"), q.Get("sasl_password_env")
	if method == "" {
		if user != "" || passEnv != "" {
			return nil, fmt.Errorf("sink URL %q: sasl_user and sasl_password_env need sasl=plain, scram-sha-256 or scram-sha-512", shown)
		}
		return nil, nil
	}
	if user == "" || passEnv == "" {
		return nil, fmt.Errorf("sink URL %q: sasl=%s needs sasl_user=NAME and sasl_password_env=VARIABLE (the environment variable holding the password)", shown, method)
	}
	pass, ok := env(passEnv)
	if !ok || pass == "" {
		return nil, fmt.Errorf("sink URL %q: sasl_password_env=%s: the environment variable %s is not set; export it with the SASL password", shown, passEnv, passEnv)
	}
	switch method {
	case "plain":
		if !tlsOn {
			return nil, fmt.Errorf("sink URL %q: sasl=plain sends the password in clear: add tls=true (or tls_ca)", shown)
		}
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "scram-sha-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("sink URL %q: sasl=%q: want plain, scram-sha-256 or scram-sha-512", shown, method)
}

// tlsNames are the URL options naming the TLS files.
var tlsNames = [3]string{"tls_ca", "tls_cert", "tls_key"}

func parseURL(u *url.URL) (opts Options, tlsOn bool, err error) {
	shown := u.Redacted()
	if u.Scheme != "kafka" {
		return opts, false, fmt.Errorf("sink URL %q: wharfkafka opens kafka:// URLs", shown)
	}
	if u.User != nil {
		return opts, false, fmt.Errorf("sink URL %q: the kafka sink takes no user or password in the URL: for SASL write sasl=plain|scram-sha-256|scram-sha-512&sasl_user=NAME&sasl_password_env=VARIABLE", shown)
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
		case "ce":
			if _, cerr := cloudevents.ParseMode(v); cerr != nil {
				return opts, false, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			opts.CloudEvents = v
		case "ce_source":
			opts.CloudEventsSource = v
		case "tls_ca", "tls_cert", "tls_key", "sasl", "sasl_user", "sasl_password_env": // read by Open
		default:
			return opts, false, fmt.Errorf("sink URL %q: unknown option %q: the kafka sink takes topic_template, client_id, max_message_bytes, delivery_timeout, compression, ce, ce_source, tls, tls_ca, tls_cert, tls_key, sasl, sasl_user and sasl_password_env", urlmask.Option(u, k), k)
		}
	}
	if _, cerr := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource); cerr != nil {
		return opts, false, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, opts.CloudEvents, opts.CloudEventsSource, cerr)
	}
	return opts, tlsOn, nil
}

// Ping asks a broker for metadata within ctx. It implements [wharf.Pinger],
// which readiness probes use.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.cl.Ping(ctx); err != nil {
		return fmt.Errorf("wharfkafka: no broker answered: %w", err)
	}
	return nil
}
