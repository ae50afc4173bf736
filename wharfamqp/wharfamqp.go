// Package wharfamqp is the RabbitMQ (AMQP 0-9-1) sink of Wharf, built on
// amqp091-go.
//
// A [Sink] publishes every message of a batch on one channel in publisher
// confirm mode, many publishes in flight, and acknowledges each message only
// once the broker confirmed it (basic.ack), that is once every queue it was
// routed to took it (for a durable queue: wrote it to disk). Messages are
// persistent (delivery mode 2) and carry:
//
//   - message-id: [wharf.Message.MessageID], the same on every redelivery:
//     consumers deduplicate on it.
//   - the key in the "wharf-key" header (absent for a message without a key);
//     the routing key can carry it too, with "{{key}}" in routing_key_template.
//   - type: the wharf topic (left empty for a topic over 255 bytes).
//   - timestamp: the enqueue time, in seconds.
//   - the message headers as AMQP headers (string values); a "content-type"
//     header also sets the content-type property.
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
//     default exchange, which routes to the queue named by the routing key).
//     Open checks that an exchange without "{{topic}}" exists.
//   - routing_key_template: the routing key, with "{{topic}}" replaced by the
//     wharf topic and "{{key}}" by the message key, e.g. "orders.{{key}}".
//     Defaults to "{{topic}}".
//   - mandatory: "false" to let the broker drop a message no queue takes.
//     Defaults to "true": such a message comes back (basic.return) and fails,
//     to be retried once a queue is bound.
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
// # Failures and ordering
//
// The messages of one Publish go out in order on one channel, and RabbitMQ
// keeps a channel's order into each queue, so a key's messages keep their
// order in a queue (concurrent Publish calls use channels of their own, from
// a small pool, on one connection). These fail permanently (the relay
// dead-letters them at once), before sending: a routing key or exchange name
// over 255 bytes, a header name over 255 bytes, a content-type header over
// 255 bytes, headers too large for one AMQP frame, and a payload over
// max_message_size. The later messages of their key in the batch are then
// reported with [wharf.ErrNotAttempted] and not sent. A payload the broker
// refuses as over its own max_message_size fails permanently too, after
// sending (the broker closes the channel). Everything else is retried by the
// relay: an unroutable message (basic.return, with mandatory), a nack, a
// missing exchange (NOT_FOUND closes the channel), a confirm timeout, a
// connection closed or blocked (resource alarm), a failed dial.
//
// When a message fails after it was sent, the later messages of its key that
// were already sent by then were sent too (up to max_in_flight), and Publish
// reports each message's real result; later messages of the key not sent yet
// are reported with [wharf.ErrNotAttempted]. When a channel or connection
// closes, the messages sent on it before the failure and not confirmed yet
// are reported failed although the broker may have routed them; their
// redelivery carries the same message-id.
//
// amqp091-go does not reconnect: when the connection is lost, Publish fails
// the messages it had in flight and a later Publish dials again (at most
// dial_timeout), so publishing resumes once the broker is back. While the
// broker blocks the connection (connection.blocked, a memory or disk alarm)
// Publish sends nothing and fails after confirm_timeout; a write the broker
// does not read for confirm_timeout, or one pending when ctx ends, closes the
// connection, which the next Publish redials.
package wharfamqp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
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
	s := &Sink{
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
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: exchange %.40q... is %d bytes, over AMQP's 255", m.ID, p.exchange, len(p.exchange)))
	}
	if len(p.key) > maxShortstr {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: routing key %.40q... is %d bytes, over AMQP's 255 (shorten the topic or key, or routing_key_template)", m.ID, p.key, len(p.key)))
	}
	if limit := s.opts.MaxMessageSize; limit > 0 && len(m.Payload) > limit {
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: payload of %d bytes is over max_message_size %d (raise it with the broker's max_message_size to send it)", m.ID, len(m.Payload), limit))
	}
	ts := m.CreatedAt
	if ts.IsZero() {
		ts = time.Now()
	}
	id := m.MessageID()
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
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: header name %.40q... is %d bytes, over AMQP's 255", m.ID, k, len(k)))
		}
		p.msg.Headers[k] = v
		size += 1 + len(k) + 1 + 4 + len(v)
	}
	if ct, ok := m.Headers["content-type"]; ok {
		if len(ct) > maxShortstr {
			return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: content-type header of %d bytes is over AMQP's 255", m.ID, len(ct)))
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
		return p, wharf.Permanent(fmt.Errorf("wharfamqp: message %d: key and headers take about %d bytes, over the %d-byte frame the broker allows for them (frame_max)", m.ID, size, fm))
	}
	return p, nil
}

// sent is a message published on the channel and not yet settled.
type sent struct {
	i   int // index in the batch
	tag uint64
	at  time.Time
}

// Publish publishes msgs on one channel and waits for every confirm, each
// bounded by the confirm timeout, or for ctx to end. Messages whose confirm
// had not come when ctx ended are reported with ctx's error.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), fmt.Errorf("wharfamqp: %w", err))
	}
	b := &batch{s: s, msgs: msgs, errs: make([]error, len(msgs)), pubs: make([]publishing, len(msgs))}
	var invalid map[string]bool // keys with a message that cannot be sent
	for i, m := range msgs {
		if m.Key != "" && invalid[m.Key] {
			b.fail(i, wharf.ErrNotAttempted)
			continue
		}
		p, err := s.build(m)
		if err != nil {
			b.fail(i, err)
			if m.Key != "" {
				if invalid == nil {
					invalid = map[string]bool{}
				}
				invalid[m.Key] = true
			}
			continue
		}
		b.pubs[i] = p
	}
	if b.failed == len(msgs) {
		return b.errs
	}
	pc, err := s.acquire(ctx)
	if err != nil {
		b.failRest(err)
		return b.errs
	}
	if !b.waitUnblocked(ctx, pc) {
		s.release(pc)
		return b.result()
	}
	if b.send(ctx, pc) {
		s.release(pc)
	} else {
		s.discard(pc)
	}
	return b.result()
}

// batch is the state of one Publish.
type batch struct {
	s       *Sink
	msgs    []*wharf.Message
	errs    []error
	pubs    []publishing
	failed  int
	stopped map[string]bool // keys with a message that failed while sending
}

func (b *batch) stoppedKey(m *wharf.Message) bool { return m.Key != "" && b.stopped[m.Key] }

// fail records err for message i.
func (b *batch) fail(i int, err error) {
	b.errs[i] = err
	b.failed++
}

// failStop records err for message i, sent or about to be, and stops its
// key: the later messages of the key are not sent.
func (b *batch) failStop(i int, err error) {
	b.fail(i, err)
	if k := b.msgs[i].Key; k != "" {
		if b.stopped == nil {
			b.stopped = map[string]bool{}
		}
		b.stopped[k] = true
	}
}

// failRest fails every message without a result yet.
func (b *batch) failRest(err error) {
	for i := range b.msgs {
		if b.errs[i] == nil {
			b.errs[i] = err
			b.failed++
		}
	}
}

func (b *batch) result() []error {
	if b.failed == 0 {
		return nil
	}
	return b.errs
}

// waitUnblocked waits, at most the confirm timeout, while the broker blocks
// the connection, and fails the batch when it stays blocked.
func (b *batch) waitUnblocked(ctx context.Context, pc *pubChannel) bool {
	reason, unblocked := pc.cn.blockedState()
	if unblocked == nil {
		return true
	}
	t := time.NewTimer(b.s.opts.ConfirmTimeout)
	defer t.Stop()
	select {
	case <-unblocked:
		return true
	case <-pc.cn.done:
		return true // the publish fails with the close reason
	case <-t.C:
		b.failRest(fmt.Errorf("wharfamqp: not sent: the broker blocks publishing on the connection (%s, a resource alarm) for over confirm_timeout %s", reason, b.s.opts.ConfirmTimeout))
	case <-ctx.Done():
		b.failRest(fmt.Errorf("wharfamqp: not sent: the broker blocks publishing on the connection (%s): %w", reason, ctx.Err()))
	}
	return false
}

// send publishes the batch with at most MaxInFlight unconfirmed messages and
// settles every message sent. It reports whether the channel can be reused:
// every message it sent was confirmed and it is open.
func (b *batch) send(ctx context.Context, pc *pubChannel) bool {
	s := b.s
	pc.reset()
	// A write the broker does not read is cut short when ctx ends.
	stop := context.AfterFunc(ctx, func() {
		if pc.writing.Load() {
			pc.cn.kill()
		}
	})
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	pending := make([]sent, 0, min(len(b.msgs), s.opts.MaxInFlight))
	head := 0
	var abort error // set once nothing more can be sent
	reusable := true
	settle := func() {
		p := pending[head]
		head++
		if err := b.settle(ctx, pc, p, timer); err != nil {
			abort = err
		}
	}
	for i := range b.msgs {
		if b.errs[i] != nil {
			continue
		}
		for abort == nil && len(pending)-head >= s.opts.MaxInFlight {
			settle()
		}
		if abort == nil && ctx.Err() != nil {
			abort = ctx.Err()
		}
		switch {
		case b.stoppedKey(b.msgs[i]):
			b.fail(i, wharf.ErrNotAttempted)
			continue
		case abort != nil:
			b.failStop(i, fmt.Errorf("wharfamqp: message %d: not sent: %w", b.msgs[i].ID, abort))
			continue
		}
		p := b.pubs[i]
		pc.writing.Store(true)
		dc, err := pc.ch.PublishWithDeferredConfirm(p.exchange, p.key, !s.opts.DropUnroutable, false, p.msg)
		pc.writing.Store(false)
		if err != nil {
			abort = pc.closeError(ctx, err)
			if ctx.Err() != nil {
				abort = fmt.Errorf("the write was cut short, closing the connection: %w", ctx.Err())
			}
			b.failStop(i, fmt.Errorf("wharfamqp: message %d: %w", b.msgs[i].ID, abort))
			reusable = false
			continue
		}
		pending = append(pending, sent{i: i, tag: dc.DeliveryTag, at: time.Now()})
	}
	for head < len(pending) {
		if abort == nil {
			settle()
			continue
		}
		// Take what was confirmed anyway; the rest fails.
		p := pending[head]
		head++
		if b.settleNow(pc, p) {
			continue
		}
		reusable = false
		if closed, cerr := pc.closedState(); closed {
			_ = b.closedFailure(pc, p, cerr)
		} else {
			b.failStop(p.i, fmt.Errorf("wharfamqp: message %d: no publisher confirm: %w", b.msgs[p.i].ID, abort))
		}
	}
	return reusable && abort == nil && !pc.isClosed()
}

// errConfirmTimeout is the abort cause of a confirm that did not come.
type errConfirmTimeout struct {
	timeout time.Duration
	blocked string
}

func (e *errConfirmTimeout) Error() string {
	if e.blocked != "" {
		return fmt.Sprintf("confirm_timeout %s passed without a publisher confirm: the broker blocks the connection (%s, a resource alarm)", e.timeout, e.blocked)
	}
	return fmt.Sprintf("confirm_timeout %s passed without a publisher confirm (broker slow or unreachable)", e.timeout)
}

// settle waits for the confirm of p and records its result. It returns a
// non-nil error when no more confirms can be waited for: the channel closed,
// the confirm timeout passed or ctx ended.
func (b *batch) settle(ctx context.Context, pc *pubChannel, p sent, timer *time.Timer) error {
	deadline := p.at.Add(b.s.opts.ConfirmTimeout)
	for {
		if b.settleNow(pc, p) {
			return nil
		}
		if closed, err := pc.closedState(); closed {
			return b.closedFailure(pc, p, err)
		}
		d := time.Until(deadline)
		if d <= 0 {
			reason, _ := pc.cn.blockedState()
			err := &errConfirmTimeout{timeout: b.s.opts.ConfirmTimeout, blocked: reason}
			b.failStop(p.i, fmt.Errorf("wharfamqp: message %d: %w", b.msgs[p.i].ID, err))
			return err
		}
		timer.Reset(d)
		select {
		case <-pc.events:
		case <-timer.C:
		case <-ctx.Done():
			err := fmt.Errorf("gave up waiting for the publisher confirm: %w", ctx.Err())
			if !b.settleNow(pc, p) {
				b.failStop(p.i, fmt.Errorf("wharfamqp: message %d: %w", b.msgs[p.i].ID, err))
			}
			return err
		}
	}
}

// settleNow records the result of p if its confirm came, and reports
// whether it did.
func (b *batch) settleNow(pc *pubChannel, p sent) bool {
	m := b.msgs[p.i]
	confirmed, nacked, ret, returned := pc.outcome(p.tag, m.MessageID())
	if !confirmed {
		return false
	}
	pub := &b.pubs[p.i]
	switch {
	case returned:
		b.failStop(p.i, fmt.Errorf("wharfamqp: message %d: unroutable, returned by the broker (%d %s): no queue is bound to exchange %q for routing key %q: bind one (the relay retries), or set mandatory=false to drop such messages",
			m.ID, ret.ReplyCode, ret.ReplyText, pub.exchange, pub.key))
	case nacked:
		b.failStop(p.i, fmt.Errorf("wharfamqp: message %d: the broker nacked it (exchange %q, routing key %q): a queue refused it (x-overflow=reject-publish?) or failed", m.ID, pub.exchange, pub.key))
	}
	return true
}

// closedFailure fails p, sent on a channel that closed before confirming
// it. A payload the broker found over its max_message_size fails
// permanently: the broker names its size.
func (b *batch) closedFailure(pc *pubChannel, p sent, cerr error) error {
	m := b.msgs[p.i]
	err := fmt.Errorf("wharfamqp: message %d: no publisher confirm: %w", m.ID, cerr)
	if size, ok := tooLarge(cerr); ok && size == len(m.Payload) && !pc.blamed {
		pc.blamed = true
		err = wharf.Permanent(fmt.Errorf("wharfamqp: message %d: the broker refused its %d-byte payload (lower max_message_size to the broker's): %w", m.ID, size, cerr))
	}
	b.failStop(p.i, err)
	return cerr
}

var tooLargeRE = regexp.MustCompile(`message size (\d+) is larger than`)

// tooLarge reports the payload size named by RabbitMQ's PRECONDITION_FAILED
// for a message over its max_message_size.
func tooLarge(err error) (int, bool) {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		return 0, false
	}
	sm := tooLargeRE.FindStringSubmatch(aerr.Reason)
	if sm == nil {
		return 0, false
	}
	n, err := strconv.Atoi(sm[1])
	return n, err == nil
}

// ---- connections and channels ----

// connection is one AMQP connection and what the broker said about it.
type connection struct {
	c    *amqp.Connection
	nc   *guardedConn
	done chan struct{} // closed once the connection closed

	mu        sync.Mutex
	err       error         // why it closed
	blocked   string        // the alarm while the broker blocks the connection
	unblocked chan struct{} // closed when the block ends; nil when not blocked
}

func (cn *connection) isClosed() bool {
	select {
	case <-cn.done:
		return true
	default:
		return cn.c.IsClosed()
	}
}

func (cn *connection) closeErr() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

func (cn *connection) blockedState() (string, chan struct{}) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.blocked, cn.unblocked
}

// kill closes the socket: a pending write fails and the connection shuts
// down.
func (cn *connection) kill() { _ = cn.nc.Close() }

// watch follows the connection's blocked and closed notifications.
func (cn *connection) watch(closes chan *amqp.Error, blocks chan amqp.Blocking) {
	for {
		select {
		case bl, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			cn.mu.Lock()
			switch {
			case bl.Active && cn.unblocked == nil:
				cn.blocked, cn.unblocked = bl.Reason, make(chan struct{})
			case !bl.Active && cn.unblocked != nil:
				close(cn.unblocked)
				cn.blocked, cn.unblocked = "", nil
			}
			cn.mu.Unlock()
		case e, ok := <-closes:
			cn.mu.Lock()
			if ok && e != nil {
				cn.err = fmt.Errorf("connection closed: %w", e)
			} else {
				cn.err = errors.New("connection closed")
			}
			if cn.unblocked != nil {
				close(cn.unblocked)
				cn.blocked, cn.unblocked = "", nil
			}
			cn.mu.Unlock()
			close(cn.done)
			return
		}
	}
}

// guardedConn bounds every write: a write the broker does not take within
// the timeout fails, and amqp091-go then closes the connection.
type guardedConn struct {
	net.Conn
	timeout time.Duration
}

func (g *guardedConn) Write(p []byte) (int, error) {
	if err := g.SetWriteDeadline(time.Now().Add(g.timeout)); err != nil {
		return 0, err
	}
	return g.Conn.Write(p)
}

// pubChannel is a channel in confirm mode and its confirms and returns.
type pubChannel struct {
	cn      *connection
	ch      *amqp.Channel
	events  chan struct{} // a confirm came or the channel closed
	writing atomic.Bool   // a publish is being written
	blamed  bool          // a too-large payload was blamed for the close

	mu        sync.Mutex
	confirmed uint64                 // every tag up to this one is confirmed
	nacked    map[uint64]bool        // nacked tags, of the current Publish
	returned  map[string]amqp.Return // returns by message-id, of the current Publish
	closed    bool
	err       error // why it closed
}

// reset forgets a previous Publish's returns and nacks.
func (pc *pubChannel) reset() {
	pc.mu.Lock()
	clear(pc.nacked)
	clear(pc.returned)
	pc.mu.Unlock()
	pc.blamed = false
}

func (pc *pubChannel) signal() {
	select {
	case pc.events <- struct{}{}:
	default:
	}
}

func (pc *pubChannel) isClosed() bool {
	closed, _ := pc.closedState()
	return closed || pc.cn.isClosed()
}

func (pc *pubChannel) closedState() (bool, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.closed, pc.err
}

// closeError explains a failed publish by the channel's or connection's
// close, which amqp091-go reports a moment after the publish fails.
func (pc *pubChannel) closeError(ctx context.Context, err error) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		if closed, cerr := pc.closedState(); closed && cerr != nil {
			return cerr
		}
		select {
		case <-pc.events:
		case <-t.C:
			if cerr := pc.cn.closeErr(); cerr != nil {
				return cerr
			}
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// outcome reports whether tag was confirmed and, if so, nacked or returned.
func (pc *pubChannel) outcome(tag uint64, id string) (confirmed, nacked bool, ret amqp.Return, returned bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.confirmed < tag {
		return false, false, ret, false
	}
	ret, returned = pc.returned[id]
	return true, pc.nacked[tag], ret, returned
}

// listen records the channel's returns and confirms. A basic.return comes
// before the confirm of its message, and amqp091-go hands them over in that
// order from one goroutine, so the returns waiting in their buffer are taken
// before each confirm.
func (pc *pubChannel) listen(confirms chan amqp.Confirmation, returns chan amqp.Return, closes chan *amqp.Error) {
	takeReturn := func(r amqp.Return) {
		pc.mu.Lock()
		pc.returned[r.MessageId] = r
		pc.mu.Unlock()
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			takeReturn(r)
		case c, ok := <-confirms:
			if !ok {
				what := "channel closed"
				if pc.cn.c.IsClosed() {
					what = "connection closed"
				}
				err := errors.New(what)
				select {
				case e, ok := <-closes:
					if ok && e != nil {
						err = fmt.Errorf("%s: %w", what, e)
					}
				default:
				}
				pc.mu.Lock()
				pc.closed, pc.err = true, err
				pc.mu.Unlock()
				pc.signal()
				return
			}
			for drained := false; !drained; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns, drained = nil, true
					} else {
						takeReturn(r)
					}
				default:
					drained = true
				}
			}
			pc.mu.Lock()
			if !c.Ack {
				pc.nacked[c.DeliveryTag] = true
			}
			if c.DeliveryTag > pc.confirmed {
				pc.confirmed = c.DeliveryTag
			}
			pc.mu.Unlock()
			pc.signal()
		}
	}
}

// connection returns the open connection, dialling one when there is none.
func (s *Sink) connection(ctx context.Context) (*connection, error) {
	s.mu.Lock()
	cn, closed := s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cn != nil && !cn.isClosed() {
		return cn, nil
	}
	select {
	case s.dialSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wharfamqp: waiting to connect to %s: %w", s.where, ctx.Err())
	}
	defer func() { <-s.dialSem }()
	s.mu.Lock()
	cn, closed = s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cn != nil && !cn.isClosed() {
		return cn, nil // another Publish dialled
	}
	return s.dial(ctx)
}

func (s *Sink) dial(ctx context.Context) (*connection, error) {
	deadline := time.Now().Add(s.opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var gc atomic.Pointer[guardedConn]
	cfg := s.config
	cfg.Properties = make(amqp.Table, len(s.config.Properties)) // amqp091-go writes to it
	for k, v := range s.config.Properties {
		cfg.Properties[k] = v
	}
	userDial := s.config.Dial
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if userDial != nil {
			c, err = userDial(network, addr)
		} else {
			d := net.Dialer{Deadline: deadline}
			c, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		// Bounds the TLS and AMQP handshakes; amqp091-go clears it after.
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		g := &guardedConn{Conn: c, timeout: s.opts.ConfirmTimeout}
		gc.Store(g)
		return g, nil
	}
	stop := context.AfterFunc(ctx, func() {
		if g := gc.Load(); g != nil {
			_ = g.Close()
		}
	})
	c, err := amqp.DialConfig(s.uri, cfg)
	if !stop() && err == nil {
		// ctx ended as the handshake completed: the socket is closed.
		_ = c.Close()
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("wharfamqp: cannot connect to %s: %w", s.where, err)
	}
	cn := &connection{c: c, nc: gc.Load(), done: make(chan struct{})}
	if fs := c.Config.FrameSize; fs > 0 {
		s.frameMax.Store(int64(fs))
	} else {
		s.frameMax.Store(math.MaxInt32) // no limit negotiated
	}
	closes := c.NotifyClose(make(chan *amqp.Error, 1))
	blocks := c.NotifyBlocked(make(chan amqp.Blocking, 4))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		t := time.AfterFunc(closeTimeout, cn.kill)
		_ = c.Close()
		t.Stop()
		return nil, errClosed
	}
	s.conn = cn
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		cn.watch(closes, blocks)
	}()
	return cn, nil
}

// acquire takes an idle channel, or opens one.
func (s *Sink) acquire(ctx context.Context) (*pubChannel, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		var pc *pubChannel
		if n := len(s.idle); n > 0 {
			pc = s.idle[n-1]
			s.idle = s.idle[:n-1]
		}
		s.mu.Unlock()
		if pc == nil {
			break
		}
		if !pc.isClosed() {
			return pc, nil
		}
		s.discard(pc)
	}
	cn, err := s.connection(ctx)
	if err != nil {
		return nil, err
	}
	return s.openChannel(ctx, cn)
}

// openChannel opens a channel in confirm mode. The two round trips are
// bounded by the dial timeout and ctx: past them the connection is closed.
func (s *Sink) openChannel(ctx context.Context, cn *connection) (*pubChannel, error) {
	var killed atomic.Bool
	kill := func() { killed.Store(true); cn.kill() }
	timer := time.AfterFunc(s.opts.DialTimeout, kill)
	stop := context.AfterFunc(ctx, kill)
	ch, err := cn.c.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			_ = ch.Close()
		}
	}
	timer.Stop()
	stop()
	if killed.Load() {
		if err == nil {
			_ = ch.Close()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wharfamqp: opening a channel: %w", ctx.Err())
		}
		return nil, fmt.Errorf("wharfamqp: opening a channel took over dial_timeout %s: connection closed", s.opts.DialTimeout)
	}
	if err != nil {
		if cerr := cn.closeErr(); cerr != nil {
			err = cerr
		}
		return nil, fmt.Errorf("wharfamqp: opening a channel: %w", err)
	}
	pc := &pubChannel{
		cn:       cn,
		ch:       ch,
		events:   make(chan struct{}, 1),
		nacked:   map[uint64]bool{},
		returned: map[string]amqp.Return{},
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ch.Close()
		return nil, errClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		pc.listen(confirms, returns, closes)
	}()
	return pc, nil
}

// release puts a healthy channel back in the pool.
func (s *Sink) release(pc *pubChannel) {
	s.mu.Lock()
	if !s.closed && len(s.idle) < maxIdleChannels && !pc.isClosed() {
		s.idle = append(s.idle, pc)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.discard(pc)
}

// discard closes a channel in the background: channel.close waits for the
// broker's answer, which a stalled broker may not give until the connection
// dies.
func (s *Sink) discard(pc *pubChannel) {
	if pc.isClosed() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return // closing the connection closes the channel
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		_ = pc.ch.Close()
	}()
}

// Close closes the connection; Publish calls still waiting for confirms
// fail. It is idempotent.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		cn := s.conn
		s.conn, s.idle = nil, nil
		s.mu.Unlock()
		if cn != nil && !cn.c.IsClosed() {
			// A stalled broker may never answer connection.close (and its
			// heartbeats defeat a read deadline): cut it short.
			t := time.AfterFunc(closeTimeout, cn.kill)
			_ = cn.c.Close()
			t.Stop()
		}
		s.wg.Wait()
	})
	return nil
}

// ---- URL ----

// urlConfig is what an amqp:// URL says.
type urlConfig struct {
	uri  string // the URL for amqp091-go: our options removed
	opts Options
	name string
}

// Open opens the sink an amqp:// or amqps:// URL names (see the package
// documentation for its options). It is the opener the CLI registers for
// the "amqp" and "amqps" schemes.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(cfg.name)
	s, err := New(ctx, cfg.uri, amqp.Config{Properties: props}, cfg.opts)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "wharfamqp: ")
		return nil, &openError{msg: fmt.Sprintf("sink URL %q: %s", u.Redacted(), msg), err: err}
	}
	return s, nil
}

// openError names the sink URL in front of New's error, and unwraps to it.
type openError struct {
	msg string
	err error
}

func (e *openError) Error() string { return e.msg }
func (e *openError) Unwrap() error { return e.err }

func parseURL(u *url.URL) (urlConfig, error) {
	shown := u.Redacted()
	cfg := urlConfig{name: defaultName}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return cfg, fmt.Errorf("sink URL %q: wharfamqp opens amqp:// and amqps:// URLs", shown)
	}
	if u.Opaque != "" || u.Fragment != "" {
		return cfg, fmt.Errorf("sink URL %q: write %s://user:password@host:port/vhost?option=value", shown, u.Scheme)
	}
	if u.Hostname() == "" || strings.Contains(u.Host, ",") {
		return cfg, fmt.Errorf("sink URL %q names no host, or several: write %s://user:password@host:port/vhost", shown, u.Scheme)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return cfg, fmt.Errorf("sink URL %q: port %q is not a port number", shown, p)
		}
	}
	pass := url.Values{}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "exchange":
			cfg.opts.Exchange = v
		case "routing_key_template":
			cfg.opts.RoutingKeyTemplate = v
		case "mandatory":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: mandatory=%q: want true or false", shown, v)
			}
			cfg.opts.DropUnroutable = !b
		case "confirm_timeout", "dial_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: %s=%q is not a positive duration such as 10s", shown, k, v)
			}
			if k == "confirm_timeout" {
				cfg.opts.ConfirmTimeout = d
			} else {
				cfg.opts.DialTimeout = d
			}
		case "max_in_flight":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return cfg, fmt.Errorf("sink URL %q: max_in_flight=%q is not a positive number of messages", shown, v)
			}
			cfg.opts.MaxInFlight = n
		case "max_message_size":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return cfg, fmt.Errorf("sink URL %q: max_message_size=%q is not a number of bytes (0 turns the check off)", shown, v)
			}
			cfg.opts.MaxMessageSize = n
			if n == 0 {
				cfg.opts.MaxMessageSize = -1
			}
		case "name":
			cfg.name = v
		case "heartbeat":
			if n, err := strconv.ParseUint(v, 10, 16); err != nil {
				return cfg, fmt.Errorf("sink URL %q: heartbeat=%q is not a number of seconds (0 to 65535)", shown, v)
			} else if n == 0 {
				return cfg, fmt.Errorf("sink URL %q: heartbeat=0 turns heartbeats off, and with them the detection of a dead connection: give a number of seconds", shown)
			}
			pass.Set(k, v)
		case "cacertfile", "certfile", "keyfile", "server_name_indication":
			if u.Scheme != "amqps" {
				return cfg, fmt.Errorf("sink URL %q: %s is a TLS option: use amqps://", shown, k)
			}
			pass.Set(k, v)
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the amqp sink takes exchange, routing_key_template, mandatory, confirm_timeout, max_in_flight, max_message_size, dial_timeout, name, heartbeat and, with amqps, cacertfile, certfile, keyfile and server_name_indication", shown, k)
		}
	}
	if strings.Contains(cfg.opts.Exchange, KeyPlaceholder) {
		return cfg, fmt.Errorf("sink URL %q: exchange %q has %s: only %s may name the exchange (put the key in routing_key_template)", shown, cfg.opts.Exchange, KeyPlaceholder, TopicPlaceholder)
	}
	if len(cfg.opts.Exchange) > maxShortstr {
		return cfg, fmt.Errorf("sink URL %q: exchange is %d bytes, over AMQP's 255", shown, len(cfg.opts.Exchange))
	}
	if pass.Has("certfile") != pass.Has("keyfile") {
		return cfg, fmt.Errorf("sink URL %q: certfile and keyfile go together", shown)
	}
	clean := *u
	clean.RawQuery = pass.Encode()
	cfg.uri = clean.String()
	return cfg, nil
}
