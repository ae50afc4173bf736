// Package wharfamqp is the RabbitMQ (AMQP 0-9-1) sink of Wharf, built on
// amqp091-go.
//
// A [Sink] publishes every message of a batch on one channel in publisher
// confirm mode, many publishes in flight, and acknowledges each message only
// once the broker confirmed it (basic.ack), that is once every queue it was
// routed to took it (for a durable queue: wrote it to disk). Messages are
// persistent (delivery mode 2) and carry:
//
//   - message-id: [wharf.Message.ID], the same on every redelivery and
//     different for every other message of every outbox: consumers
//     deduplicate on it.
//   - the key in the "wharf-key" header (absent for a message without a key);
//     the routing key can carry it too, with "{{key}}" in routing_key_template.
//   - type: the wharf topic (left empty for a topic over 255 bytes).
//   - timestamp: the enqueue time, in seconds.
//   - the message headers as AMQP headers (string values); a "content-type"
//     header also sets the content-type property.
//
// docs/sinks/rabbitmq.md in the repository describes the sink for operators.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	amqp://[user:password@]host[:port][/vhost][?option=value&...]
//	amqps://...   (the same over TLS; port 5671 by default)
//
// The port defaults to 5672 and the vhost to "/" (write %2F for "/" given
// explicitly). Percent-encode reserved characters in the user and password.
// Options, all optional:
//
//   - exchange: the exchange to publish to, with "{{topic}}" replaced by the
//     wharf topic, e.g. "events" or "wharf.{{topic}}". Defaults to "" (the
//     default exchange, which routes to the queue named by the routing key;
//     see Security). Open checks that an exchange without "{{topic}}" exists.
//   - routing_key_template: the routing key, with "{{topic}}" replaced by the
//     wharf topic and "{{key}}" by the message key, e.g. "orders.{{key}}".
//     Defaults to "{{topic}}".
//   - mandatory: "false" to let the broker drop a message no queue takes.
//     Defaults to "true": such a message comes back (basic.return) and fails,
//     to be retried once a queue is bound.
//   - strict_order: "true" to keep at most one unconfirmed message per
//     ordering key (see Failures and ordering). Defaults to "false".
//   - confirm_timeout: how long to wait for the broker to confirm a message
//     after sending it, and for a blocked connection to be released, before
//     failing the message for the relay to retry, e.g. "10s". Defaults to 10s.
//   - max_in_flight: how many messages of one Publish may await their confirm
//     at once. Defaults to 1000.
//   - max_message_size: the largest payload in bytes; a larger one fails
//     permanently before sending. Set it to the broker's max_message_size
//     (RabbitMQ 3.8 to 3.13 default to 134217728, 4.x to 16777216). "0"
//     turns the check off. Defaults to 134217728.
//   - dial_timeout: the bound of a connection attempt (TCP, TLS and AMQP
//     handshake), and of opening a channel, e.g. "5s". Defaults to 5s.
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//   - name: the connection name the broker shows. Defaults to "wharf".
//   - heartbeat: the heartbeat interval in seconds, as amqp091-go takes it.
//     Defaults to 10.
//   - cacertfile, certfile, keyfile, server_name_indication (amqps only): the
//     CA bundle, client certificate and key (PEM files) and the TLS server
//     name, as amqp091-go takes them. Default to the system's roots, no
//     client certificate and the host.
//
// Open connects at once and fails when the broker cannot be reached or
// refuses the credentials or the vhost. It declares nothing: exchanges,
// queues and bindings are the operator's.
//
// # Security
//
// The default exchange routes a message to the queue of the vhost named by
// its routing key, any queue, and a topic often comes from the application's
// data. Queues whose name starts with "amq." are the broker's own: the
// server-named queues of other clients (RPC reply queues among them) and
// direct reply-to ("amq.rabbitmq.reply-to..."). So on the default exchange a
// routing key starting with "amq." fails permanently instead of reaching the
// broker, and New refuses a routing_key_template whose literal start is
// "amq.". Prefer an exchange of your own, and give the sink a user whose
// write permission names only that exchange (configure and read permissions
// empty: the sink declares nothing and consumes nothing; the passive check of
// the exchange at start-up needs no permission).
//
// # Failures and ordering
//
// The messages of one Publish go out in order on one channel, and RabbitMQ
// keeps a channel's order into each queue, so a key's messages keep their
// order in a queue (concurrent Publish calls use channels of their own, from
// a small pool, on one connection). These fail permanently (the relay
// dead-letters them at once), before sending: a routing key or exchange name
// over 255 bytes, a routing key starting with "amq." on the default
// exchange, a header name over 255 bytes, a content-type header over 255
// bytes, headers too large for one AMQP frame, and a payload over
// max_message_size. The later messages of their ordering key in the batch
// are then reported with [wharf.ErrNotAttempted] and not sent. A payload the
// broker refuses as over its own max_message_size fails permanently too,
// after sending (the broker closes the channel). Everything else is retried
// by the relay: an unroutable message (basic.return, with mandatory), a
// nack, a missing exchange (NOT_FOUND closes the channel), refused access, a
// confirm timeout, a connection closed or blocked (resource alarm), a failed
// dial.
//
// By default a batch is pipelined: up to max_in_flight messages await their
// confirm at once. When a message fails after it was sent (returned,
// nacked, no confirm in time), the later messages of its ordering key that
// were sent by then may have been routed: Publish reports each message's
// real result, and the relay sends such a later message again after the
// failed one, so a queue's last copy of a key is in order but its first copy
// may not be. Later messages of the key not sent yet are reported with
// [wharf.ErrNotAttempted]. With strict_order a key's next message is sent
// only once the previous one was confirmed (other keys and unkeyed messages
// are still pipelined), so after a failure nothing later of that key is
// sent, at the cost of one confirm round trip per message of a key.
//
// When a channel or connection closes, the messages sent on it before the
// failure and not confirmed yet are reported failed although the broker may
// have routed them; their redelivery carries the same message-id.
//
// Publish stops sending once ctx is done and returns promptly: messages not
// sent yet, and sent ones whose confirm had not come, fail with retryable
// errors wrapping ctx's error (and its cause). amqp091-go does not
// reconnect: when the connection is lost, Publish fails the messages it had
// in flight and a later Publish dials again (at most dial_timeout), so
// publishing resumes once the broker is back. While the broker blocks the
// connection (connection.blocked, a memory or disk alarm) Publish sends
// nothing and fails after confirm_timeout; a write the broker does not read
// for confirm_timeout, or one pending when ctx ends, closes the connection,
// which the next Publish redials.
//
// # CloudEvents
//
// CloudEvents defines no AMQP 0-9-1 binding; with ce=binary the sink follows
// the AMQP 1.0 binding's binary mode, whose application properties are the
// 0-9-1 message headers: the body is the payload, every attribute is a
// string header "cloudEvents:<name>" (cloudEvents:specversion "1.0",
// cloudEvents:id the message id, cloudEvents:source, cloudEvents:type the
// wharf topic, cloudEvents:subject the key, absent without one,
// cloudEvents:time the enqueue time, cloudEvents:traceparent and
// cloudEvents:tracestate from the message's trace context headers), and
// datacontenttype is the content-type property. With ce=structured the body
// is the JSON event and content-type is "application/cloudevents+json;
// charset=UTF-8". message-id, type, timestamp and wharf-key are set in both
// modes.
package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
)

// HeaderKey is the AMQP header that carries [wharf.Message.Key] (absent for
// a message without a key).
const HeaderKey = "wharf-key"

// TopicPlaceholder is replaced by the wharf topic in Options.Exchange and
// Options.RoutingKeyTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

// KeyPlaceholder is replaced by the message key in
// Options.RoutingKeyTemplate.
const KeyPlaceholder = "{{key}}"

// DefaultMaxMessageSize is RabbitMQ's default max_message_size from 3.8 to
// 3.13 (RabbitMQ 4.x defaults to 16 MiB).
const DefaultMaxMessageSize = 128 << 20

const (
	defaultConfirmTimeout = 10 * time.Second
	defaultDialTimeout    = 5 * time.Second
	defaultMaxInFlight    = 1000
	defaultName           = "wharf"
	// maxShortstr is the AMQP limit of exchange names, routing keys, header
	// names and short properties.
	maxShortstr = 255
	// maxIdleChannels bounds the channels kept open between Publish calls.
	maxIdleChannels = 8
	// closeTimeout bounds the connection.close handshake of Close.
	closeTimeout = 5 * time.Second
	// defaultFrameMax is RabbitMQ's frame_max, used until a connection
	// negotiated one.
	defaultFrameMax = 131072
)

// Options configures a [Sink] built with [New].
type Options struct {
	// Exchange is the exchange messages are published to; TopicPlaceholder
	// is replaced by the message's topic. Defaults to "" (the default
	// exchange).
	Exchange string
	// RoutingKeyTemplate names the routing key: TopicPlaceholder is replaced
	// by the topic and KeyPlaceholder by the key. Defaults to "{{topic}}".
	RoutingKeyTemplate string
	// DropUnroutable publishes without the mandatory flag: a message no queue
	// takes is confirmed, and so acknowledged, and the broker drops it.
	// Defaults to false: such a message fails and is retried.
	DropUnroutable bool
	// StrictOrder keeps at most one unconfirmed message per ordering key, so
	// that no later message of a key is sent once one failed. Defaults to
	// false: up to MaxInFlight messages of a batch await their confirm at
	// once, whatever their key.
	StrictOrder bool
	// ConfirmTimeout bounds the wait for each publisher confirm, counted from
	// the send, and the wait for a blocked connection. Defaults to 10s.
	ConfirmTimeout time.Duration
	// MaxInFlight is how many messages of one Publish may await their
	// confirm at once. Defaults to 1000.
	MaxInFlight int
	// MaxMessageSize is the largest payload sent; a larger one fails
	// permanently before sending. 0 means DefaultMaxMessageSize; negative
	// turns the check off.
	MaxMessageSize int
	// DialTimeout bounds each connection attempt and each channel opening.
	// Defaults to 5s.
	DialTimeout time.Duration
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see the package documentation). Defaults to "" (none).
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that publishes to RabbitMQ. It is safe for
// concurrent use: each concurrent Publish uses a channel of its own.
type Sink struct {
	uri    string
	where  string // host:port and vhost, for errors
	config amqp.Config
	opts   Options

	exchangeTemplated bool
	keyTemplated      bool // the routing key has {{topic}} or {{key}}
	ce                cloudevents.Config
	frameMax          atomic.Int64

	dialSem chan struct{} // one dial at a time

	mu     sync.Mutex
	conn   *connection
	idle   []*pubChannel
	closed bool
	wg     sync.WaitGroup // the sink's goroutines, started under mu while open

	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

var errClosed = errors.New("wharfamqp: the sink is closed")

// New connects to the broker at uri, an AMQP URI as amqp091.ParseURI takes
// it, with config, and returns a sink that owns the connection: it redials
// it when it is lost and Close closes it. config.Dial, when set, is used for
// the TCP connection; config.Recovery must be nil (the sink redials itself).
// When opts.Exchange names one exchange, New checks that it exists.
func New(ctx context.Context, uri string, config amqp.Config, opts Options) (*Sink, error) {
	u, err := url.Parse(uri)
	if err != nil {
		// The error would show the password.
		return nil, errors.New("wharfamqp: New: the URI does not parse (percent-encode reserved characters in the user and password)")
	}
	parsed, err := amqp.ParseURI(uri)
	if err != nil {
		return nil, fmt.Errorf("wharfamqp: New: URI %q: %w", u.Redacted(), err)
	}
	if config.Recovery != nil {
		return nil, errors.New("wharfamqp: New: config.Recovery must be nil: the sink redials by itself")
	}
	if err := checkOptions(&opts); err != nil {
		return nil, err
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfamqp: Options.CloudEvents: %w", err)
	}
	s := &Sink{
		ce:                ce,
		uri:               uri,
		where:             fmt.Sprintf("%s (vhost %q)", net.JoinHostPort(parsed.Host, strconv.Itoa(parsed.Port)), parsed.Vhost),
		config:            config,
		opts:              opts,
		exchangeTemplated: strings.Contains(opts.Exchange, TopicPlaceholder),
		keyTemplated:      strings.Contains(opts.RoutingKeyTemplate, TopicPlaceholder) || strings.Contains(opts.RoutingKeyTemplate, KeyPlaceholder),
		dialSem:           make(chan struct{}, 1),
	}
	s.frameMax.Store(defaultFrameMax)
	cn, err := s.connection(ctx)
	if err != nil {
		return nil, err
	}
	if opts.Exchange != "" && !s.exchangeTemplated {
		if err := s.checkExchange(ctx, cn); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

func checkOptions(opts *Options) error {
	if opts.RoutingKeyTemplate == "" {
		opts.RoutingKeyTemplate = TopicPlaceholder
	}
	if strings.Contains(opts.Exchange, KeyPlaceholder) {
		return fmt.Errorf("wharfamqp: Options.Exchange %q has %s: only %s may name the exchange", opts.Exchange, KeyPlaceholder, TopicPlaceholder)
	}
	if opts.Exchange == "" && strings.HasPrefix(literalPrefix(opts.RoutingKeyTemplate), reservedPrefix) {
		return fmt.Errorf("wharfamqp: Options.RoutingKeyTemplate %q on the default exchange names the broker's own queues (%s*), which the sink refuses: name an exchange of yours in Options.Exchange, or use another routing key", opts.RoutingKeyTemplate, reservedPrefix)
	}
	if opts.ConfirmTimeout == 0 {
		opts.ConfirmTimeout = defaultConfirmTimeout
	}
	if opts.ConfirmTimeout < 0 {
		return fmt.Errorf("wharfamqp: Options.ConfirmTimeout %s is negative", opts.ConfirmTimeout)
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = defaultDialTimeout
	}
	if opts.DialTimeout < 0 {
		return fmt.Errorf("wharfamqp: Options.DialTimeout %s is negative", opts.DialTimeout)
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = defaultMaxInFlight
	}
	if opts.MaxInFlight < 0 {
		return fmt.Errorf("wharfamqp: Options.MaxInFlight %d is negative", opts.MaxInFlight)
	}
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = DefaultMaxMessageSize
	}
	return nil
}

// reservedPrefix starts the names of the queues the broker creates itself:
// server-named queues ("amq.gen-...") and direct reply-to.
const reservedPrefix = "amq."

// literalPrefix is the part of a template before its first placeholder.
func literalPrefix(template string) string {
	if i := strings.Index(template, "{{"); i >= 0 {
		return template[:i]
	}
	return template
}

// checkExchange declares the exchange passively: it fails, creating nothing,
// when the exchange does not exist.
func (s *Sink) checkExchange(ctx context.Context, cn *connection) error {
	pc, err := s.openChannel(ctx, cn)
	if err != nil {
		return err
	}
	t := time.AfterFunc(s.opts.DialTimeout, cn.kill) // a stalled broker
	err = pc.ch.ExchangeDeclarePassive(s.opts.Exchange, "", false, false, false, false, nil)
	t.Stop()
	if err == nil {
		s.release(pc)
		return nil
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return fmt.Errorf("wharfamqp: exchange %q does not exist at %s: declare it, or name another with exchange=", s.opts.Exchange, s.where)
	}
	return fmt.Errorf("wharfamqp: cannot check exchange %q: %w", s.opts.Exchange, err)
}

// Exchange returns the exchange a message of the wharf topic is published to.
func (s *Sink) Exchange(topic string) string {
	if !s.exchangeTemplated {
		return s.opts.Exchange
	}
	return strings.ReplaceAll(s.opts.Exchange, TopicPlaceholder, topic)
}

// RoutingKey returns the routing key of a message of the wharf topic and key.
func (s *Sink) RoutingKey(topic, key string) string {
	if !s.keyTemplated {
		return s.opts.RoutingKeyTemplate
	}
	rk := strings.ReplaceAll(s.opts.RoutingKeyTemplate, TopicPlaceholder, topic)
	return strings.ReplaceAll(rk, KeyPlaceholder, key)
}

// publishing is one message ready to send.
type publishing struct {
	exchange, key string
	msg           amqp.Publishing
}

// build turns m into a publishing, or fails permanently with what the AMQP
// frames cannot carry.
func (s *Sink) build(m *wharf.Message) (publishing, error) {
	p := publishing{exchange: s.Exchange(m.Topic), key: s.RoutingKey(m.Topic, m.Key)}
	if len(p.exchange) > maxShortstr {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: exchange %.40q... is %d bytes, over AMQP's 255", m.ID, p.exchange, len(p.exchange)))
	}
	if len(p.key) > maxShortstr {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: routing key %.40q... is %d bytes, over AMQP's 255 (shorten the topic or key, or routing_key_template)", m.ID, p.key, len(p.key)))
	}
	if p.exchange == "" && strings.HasPrefix(p.key, reservedPrefix) {
		// The default exchange would deliver it to that queue: another
		// client's reply queue, say.
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: routing key %q on the default exchange names one of the broker's own queues (%s*: server-named and reply queues), which the sink refuses: publish to an exchange of yours with exchange=, or keep topics and keys from starting with %q", m.ID, p.key, reservedPrefix, reservedPrefix))
	}
	if limit := s.opts.MaxMessageSize; limit > 0 && len(m.Payload) > limit {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: payload of %d bytes is over max_message_size %d (raise it with the broker's max_message_size to send it)", m.ID, len(m.Payload), limit))
	}
	ts := m.CreatedAt
	if ts.IsZero() {
		ts = time.Now()
	}
	id := m.ID
	var enc cloudevents.Encoded
	if s.ce.On() {
		var err error
		if enc, err = s.ce.Encode(m, cloudevents.AMQP); err != nil {
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: %w", err))
		}
	}
	p.msg = amqp.Publishing{
		Headers:      make(amqp.Table, len(m.Headers)+1),
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    ts,
		Body:         m.Payload,
	}
	// The content header frame: fixed fields, then the properties.
	size := 8 + 14 + 1 + len(id) + 8 + 1 + 4
	if len(m.Topic) <= maxShortstr {
		p.msg.Type = m.Topic
		size += 1 + len(m.Topic)
	}
	for k, v := range m.Headers {
		if len(k) > maxShortstr {
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: header name %.40q... is %d bytes, over AMQP's 255", m.ID, k, len(k)))
		}
		if s.ce.On() && enc.Replaces(k) {
			continue // the event carries it
		}
		p.msg.Headers[k] = v
		size += 1 + len(k) + 1 + 4 + len(v)
	}
	if s.ce.On() {
		p.msg.Body = enc.Body
		for _, a := range enc.Headers {
			p.msg.Headers[a.Name] = a.Value
			size += 1 + len(a.Name) + 1 + 4 + len(a.Value)
		}
		if len(enc.ContentType) > maxShortstr {
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: content type of %d bytes is over AMQP's 255", m.ID, len(enc.ContentType)))
		}
		p.msg.ContentType = enc.ContentType
		size += 1 + len(enc.ContentType)
	} else if ct, ok := m.Headers["content-type"]; ok {
		if len(ct) > maxShortstr {
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: content-type header of %d bytes is over AMQP's 255", m.ID, len(ct)))
		}
		p.msg.ContentType = ct
		size += 1 + len(ct)
	}
	delete(p.msg.Headers, HeaderKey) // ours is authoritative
	if m.Key != "" {
		p.msg.Headers[HeaderKey] = m.Key
		size += 1 + len(HeaderKey) + 1 + 4 + len(m.Key)
	}
	if fm := int(s.frameMax.Load()); size > fm {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %s: key and headers take about %d bytes, over the %d-byte frame the broker allows for them (frame_max)", m.ID, size, fm))
	}
	return p, nil
}

// Publish publishes msgs on one channel and waits for every confirm, each
// bounded by the confirm timeout, or for ctx to end. Once ctx is done it
// sends nothing more and returns: messages not sent yet, and sent ones whose
// confirm had not come, fail with retryable errors wrapping ctx's error.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	res := wharf.NewResults(msgs)
	b := &batch{s: s, msgs: msgs, res: res, pubs: make([]publishing, len(msgs)), invalid: make([]error, len(msgs))}
	if ctx.Err() != nil {
		b.failAll(fmt.Errorf("wharfamqp: not sent: %w", ctxErr(ctx)))
		return res.Errors()
	}
	sendable := 0
	for i, m := range msgs {
		if b.pubs[i], b.invalid[i] = s.build(m); b.invalid[i] == nil {
			sendable++
		}
	}
	if sendable == 0 {
		b.failAll(nil)
		return res.Errors()
	}
	pc, err := s.acquire(ctx)
	if err != nil {
		b.failAll(err)
		return res.Errors()
	}
	if !b.waitUnblocked(ctx, pc) {
		s.release(pc)
		return res.Errors()
	}
	if b.send(ctx, pc) {
		s.release(pc)
	} else {
		s.discard(pc)
	}
	return res.Errors()
}

// ctxErr is ctx's error, with its cause when one was given (the relay says
// why it cut a publish short).
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}
