// Package wharfmqtt is the MQTT 5 sink of Wharf, built on Eclipse Paho
// (github.com/eclipse/paho.golang, its autopaho connection manager).
//
// A [Sink] publishes every message with QoS 1 and acknowledges it only once
// the server answered with a PUBACK whose reason code is a success, that is
// once the server took responsibility for it. Messages carry:
//
//   - the user property "wharf-message-id": [wharf.Message.ID], the same on
//     every redelivery and different for every other message of every
//     outbox: consumers deduplicate on it (MQTT has no dedup field);
//   - the user property "wharf-key": the key, absent for a message without
//     one (MQTT has no message key);
//   - the message headers as user properties, name and value as given; a
//     content-type header (any case) also sets the PUBLISH Content Type.
//
// The connection uses a persistent session (Clean Start false on every
// connect, a Session Expiry Interval of session_expiry): after a network
// failure the client reconnects to the same session and resends the QoS 1
// messages the server had not acknowledged, as MQTT requires.
// docs/sinks/mqtt.md in the repository describes the sink for operators.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	mqtt://[user:password@]host[:port][?option=value&...]
//	mqtts://...   (the same over TLS; port 8883 by default)
//
// The port defaults to 1883. Options, all optional:
//
//   - topic_template: the MQTT topic of a message, with "{{topic}}" replaced
//     by the wharf topic, e.g. "wharf/{{topic}}". Defaults to "{{topic}}".
//   - client_id: the MQTT client identifier. It must be unique per relay
//     process: the server disconnects a client when another connects with
//     its identifier. Defaults to "wharf-" and 16 random hex digits, new for
//     every process.
//   - session_expiry: how long the server keeps the session after a
//     disconnection, e.g. "1h", whole seconds. Defaults to 1h. Close ends the
//     session at once.
//   - ack_timeout: how long to wait for a PUBACK before failing the message
//     for the relay to retry, e.g. "10s". Defaults to 10s.
//   - max_in_flight: how many messages of one Publish may await their PUBACK
//     at once. The server's Receive Maximum bounds it too. Defaults to 1000.
//   - max_payload: the largest payload in bytes; a larger one fails
//     permanently before sending. Defaults to 268435455, MQTT's largest
//     packet (the server's Maximum Packet Size, when it announces one, is
//     checked too).
//   - require_subscribers: "true" to fail a message for the relay to retry
//     when the server answers that no subscription matched it (PUBACK reason
//     0x10), instead of acknowledging a message no one received. Defaults to
//     "false".
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//   - tls_ca (mqtts only): a PEM file of the CA certificates to verify the
//     server with, instead of the system's roots; tls_cert and tls_key: a
//     client certificate and its key.
//
// Open connects at once and fails when the server cannot be reached or
// refuses the connection (bad credentials, a client identifier it does not
// accept). Afterwards the client reconnects by itself: while the server is
// away, publishes fail at once and the relay retries them.
//
// # Topics
//
// A topic comes from the application's data. These fail permanently before
// sending: an empty topic, a topic with the wildcards "+" or "#", a topic
// starting with "$" (the server's own, such as $SYS), and any topic, key,
// header name or value that is not valid UTF-8 or holds a control character
// (the server would close the connection, failing every message in flight).
// A payload above max_payload, or a packet above the server's Maximum Packet
// Size, fails permanently too.
//
// # Ordering
//
// MQTT servers deliver one client's QoS 1 messages of a topic in the order
// they were sent. The sink sends a key's messages one after the other, the
// next once the previous was acknowledged, and different keys (and unkeyed
// messages) concurrently, so once a message of a key failed nothing later of
// that key is sent in the batch (reported with [wharf.ErrNotAttempted]). A
// message whose PUBACK did not come in time may still be delivered, then
// again by the relay: consumers deduplicate by wharf-message-id.
//
// # CloudEvents
//
// With ce=binary each PUBLISH follows the CloudEvents MQTT binding's binary
// mode (MQTT 5): the payload is the message payload, datacontenttype is the
// PUBLISH Content Type, and every other attribute is a user property named
// as the attribute (specversion "1.0", id the message id, source, type the
// wharf topic, subject the key, absent without one, time the enqueue time,
// traceparent and tracestate from the message's trace context headers). In
// that mode the user properties are exactly the attributes, as the binding
// reads every user property as one: wharf-message-id, wharf-key and the
// message's other headers are not sent (the id and key are the id and
// subject attributes). With ce=structured the payload is the JSON event, the
// Content Type is "application/cloudevents+json; charset=UTF-8", and the
// user properties are as without CloudEvents.
package wharfmqtt

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/tlsfiles"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// The user properties the sink sets.
const (
	// PropertyMessageID carries [wharf.Message.ID].
	PropertyMessageID = "wharf-message-id"
	// PropertyKey carries [wharf.Message.Key] (absent for a message without
	// a key).
	PropertyKey = "wharf-key"
)

// TopicPlaceholder is replaced by the wharf topic in Options.TopicTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	defaultAckTimeout    = 10 * time.Second
	defaultSessionExpiry = time.Hour
	defaultMaxInFlight   = 1000
	defaultConnectWait   = 10 * time.Second
	// MaxPacketSize is MQTT's largest packet, in bytes.
	MaxPacketSize = 268435455
	keepAlive     = 30 // seconds
	// reasonNoSubscribers is the PUBACK reason "no matching subscribers".
	reasonNoSubscribers = 0x10
)

// Options configures a [Sink] built with [New].
type Options struct {
	// Servers are the server URLs, mqtt://host:port or mqtts://host:port;
	// the client connects to the first that answers. Required.
	Servers []*url.URL
	// ClientID is the MQTT client identifier; it must be unique per sink.
	// Defaults to "wharf-" and 16 random hex digits.
	ClientID string
	// Username and Password authenticate the client. Default to none.
	Username string
	Password string
	// TLSConfig configures TLS for mqtts:// servers. Defaults to the
	// system's roots.
	TLSConfig *tls.Config
	// TopicTemplate names the MQTT topic of a message: TopicPlaceholder is
	// replaced by the message's topic. Defaults to "{{topic}}".
	TopicTemplate string
	// SessionExpiry is how long the server keeps the session after a
	// disconnection, in whole seconds. Defaults to 1h.
	SessionExpiry time.Duration
	// AckTimeout bounds the wait for each PUBACK. Defaults to 10s.
	AckTimeout time.Duration
	// MaxInFlight is how many messages of one Publish may await their
	// PUBACK at once. Defaults to 1000.
	MaxInFlight int
	// MaxPayload is the largest payload sent; a larger one fails
	// permanently. Defaults to MaxPacketSize.
	MaxPayload int
	// RequireSubscribers fails (for the relay to retry) a message the
	// server says no subscription matched. Defaults to false.
	RequireSubscribers bool
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see the package documentation). Defaults to "" (none).
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that publishes to an MQTT 5 server. It is safe for
// concurrent use.
type Sink struct {
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc
	opts   Options
	topics wharf.TopicTemplate
	ce     cloudevents.Config
	where  string // the servers, for errors

	serverMaxPacket atomic.Uint32 // from the last CONNACK; 0 when unannounced
	connects        atomic.Int32  // CONNACKs received
	sessionPresent  atomic.Bool   // the last CONNACK's Session Present flag
	lastConnErr     atomic.Pointer[error]
	closed          atomic.Bool
	closeOnce       sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

var errClosed = errors.New("wharfmqtt: the sink is closed")

func (o *Options) validate() error {
	if len(o.Servers) == 0 {
		return errors.New("wharfmqtt: Options.Servers is empty: name at least one server as mqtt://host:port")
	}
	for _, u := range o.Servers {
		if u == nil || (u.Scheme != "mqtt" && u.Scheme != "mqtts") || u.Host == "" {
			return fmt.Errorf("wharfmqtt: Options.Servers: want mqtt://host:port or mqtts://host:port, not %v", u)
		}
	}
	if o.ClientID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.ClientID = "wharf-" + hex.EncodeToString(b[:])
	}
	if len(o.ClientID) > 65535 || !validString(o.ClientID) {
		return errors.New("wharfmqtt: Options.ClientID must be UTF-8 without control characters, at most 65535 bytes")
	}
	if o.TopicTemplate == "" {
		o.TopicTemplate = TopicPlaceholder
	}
	t, err := wharf.ParseTopicTemplate(o.TopicTemplate)
	if err != nil {
		return fmt.Errorf("wharfmqtt: Options.TopicTemplate: %w", err)
	}
	if err := checkTopic(t.Expand("t")); err != nil {
		return fmt.Errorf("wharfmqtt: Options.TopicTemplate %q: %w", o.TopicTemplate, err)
	}
	if o.SessionExpiry == 0 {
		o.SessionExpiry = defaultSessionExpiry
	}
	if o.SessionExpiry < time.Second || o.SessionExpiry > math.MaxUint32*time.Second {
		return fmt.Errorf("wharfmqtt: Options.SessionExpiry %s: want 1s to %d seconds", o.SessionExpiry, uint32(math.MaxUint32))
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = defaultAckTimeout
	}
	if o.AckTimeout < 0 {
		return fmt.Errorf("wharfmqtt: Options.AckTimeout %s is negative", o.AckTimeout)
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = defaultMaxInFlight
	}
	if o.MaxInFlight < 0 {
		return fmt.Errorf("wharfmqtt: Options.MaxInFlight %d is negative", o.MaxInFlight)
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = MaxPacketSize
	}
	if o.MaxPayload < 0 || o.MaxPayload > MaxPacketSize {
		return fmt.Errorf("wharfmqtt: Options.MaxPayload %d: want 1 to %d", o.MaxPayload, MaxPacketSize)
	}
	return nil
}

// New connects to the servers and returns a sink publishing there. It waits
// until the first connection is up, and fails when the first attempt fails,
// ctx ends or 10 seconds passed.
func New(ctx context.Context, opts Options) (*Sink, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfmqtt: Options.CloudEvents: %w", err)
	}
	s := &Sink{opts: opts, ce: ce}
	s.topics, _ = wharf.ParseTopicTemplate(opts.TopicTemplate) // checked by validate
	var hosts []string
	for _, u := range opts.Servers {
		hosts = append(hosts, u.Scheme+"://"+u.Host)
	}
	s.where = strings.Join(hosts, ",")
	expiry := uint32(opts.SessionExpiry / time.Second)
	connErr := make(chan error, 1) // the first failed connection attempt
	cfg := autopaho.ClientConfig{
		ServerUrls:                    opts.Servers,
		TlsCfg:                        opts.TLSConfig,
		KeepAlive:                     keepAlive,
		CleanStartOnInitialConnection: false,
		SessionExpiryInterval:         expiry,
		ConnectTimeout:                5 * time.Second,
		// Back soon after an outage: the relay's retries wait for it.
		ReconnectBackoff: func(n int) time.Duration {
			return min(time.Duration(n+1)*250*time.Millisecond, 2*time.Second)
		},
		ConnectUsername: opts.Username,
		ConnectPassword: []byte(opts.Password),
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			var maxPacket uint32
			if ca != nil && ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
				maxPacket = *ca.Properties.MaximumPacketSize
			}
			s.serverMaxPacket.Store(maxPacket)
			s.sessionPresent.Store(ca != nil && ca.SessionPresent)
			s.connects.Add(1)
		},
		OnConnectError: func(err error) {
			s.lastConnErr.Store(&err)
			select {
			case connErr <- err:
			default:
			}
		},
		// A clean Close ends the session at once: nothing of it is needed
		// any more, and a client identifier is per process.
		DisconnectPacketBuilder: func() *paho.Disconnect {
			zero := uint32(0)
			return &paho.Disconnect{ReasonCode: 0, Properties: &paho.DisconnectProperties{SessionExpiryInterval: &zero}}
		},
		ClientConfig: paho.ClientConfig{
			ClientID: opts.ClientID,
			// Publish bounds each wait with AckTimeout and its context;
			// paho's own bound must not come first.
			PacketTimeout: opts.AckTimeout + time.Minute,
		},
	}
	runCtx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(runCtx, cfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("wharfmqtt: %w", err)
	}
	s.cm, s.cancel = cm, cancel
	// Up, or the first attempt failed (a refused port, bad credentials):
	// Open reports that at once rather than retrying in the background.
	wait, wcancel := context.WithTimeout(ctx, defaultConnectWait)
	defer wcancel()
	up := make(chan error, 1)
	go func() { up <- cm.AwaitConnection(wait) }()
	select {
	case err = <-up:
	case <-connErr:
		wcancel()
		err = <-up // nil if a later attempt got through meanwhile
	}
	if err != nil {
		why := "no answer within " + defaultConnectWait.String()
		if last := s.lastConnErr.Load(); last != nil {
			why = (*last).Error()
		}
		s.shutdown()
		return nil, fmt.Errorf("wharfmqtt: cannot connect to %s: %s", s.where, why)
	}
	return s, nil
}

// Topic returns the MQTT topic a message of the wharf topic is published to.
func (s *Sink) Topic(topic string) string { return s.topics.Expand(topic) }

// Publish publishes msgs with QoS 1 and waits for every PUBACK, each bounded
// by the ack timeout, or for ctx to end. A key's messages go one after the
// other; keys go concurrently. Once ctx is done it sends nothing more and
// returns: messages not sent yet, and sent ones whose PUBACK had not come,
// fail with retryable errors wrapping ctx's error.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if s.closed.Load() {
		return wharf.FailAll(len(msgs), errClosed)
	}
	var chains [][]int // message indexes per ordering key, in batch order
	chainOf := map[string]int{}
	for i, m := range msgs {
		k := m.OrderingKey()
		if k == "" {
			chains = append(chains, []int{i})
			continue
		}
		c, ok := chainOf[k]
		if !ok {
			c = len(chains)
			chainOf[k] = c
			chains = append(chains, nil)
		}
		chains[c] = append(chains[c], i)
	}
	// Each index is written by one goroutine only and read after Wait.
	errs := make([]error, len(msgs))
	tried := make([]bool, len(msgs))
	sem := make(chan struct{}, s.opts.MaxInFlight)
	var wg sync.WaitGroup
	for _, chain := range chains {
		wg.Go(func() {
			for _, i := range chain {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				if ctx.Err() != nil {
					<-sem
					return
				}
				tried[i] = true
				errs[i] = s.send(ctx, msgs[i])
				<-sem
				if errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	res := wharf.NewResults(msgs)
	for i := range msgs {
		if tried[i] {
			res.Set(i, errs[i])
		} else {
			res.Blocked(i) // after a failure of its key: not attempted
		}
	}
	if ctx.Err() != nil {
		res.FailRest(fmt.Errorf("wharfmqtt: %w: %w", errNotSent, ctxErr(ctx)))
	}
	return res.Errors()
}

// errNotSent marks a message Publish did not send because its context ended.
var errNotSent = errors.New("not sent: the publish was cut short")

// ctxErr is ctx's error, with its cause when one was given.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}

// send publishes m and waits for its PUBACK.
func (s *Sink) send(ctx context.Context, m *wharf.Message) error {
	p, err := s.build(m)
	if err != nil {
		return err
	}
	if s.closed.Load() {
		return errClosed
	}
	actx, cancel := context.WithTimeout(ctx, s.opts.AckTimeout)
	defer cancel()
	if ctx.Err() != nil {
		return fmt.Errorf("wharfmqtt: message %s: %w: %w", m.ID, errNotSent, ctxErr(ctx))
	}
	resp, err := s.cm.Publish(actx, p)
	switch {
	case err == nil && resp != nil && resp.ReasonCode == reasonNoSubscribers && s.opts.RequireSubscribers:
		return fmt.Errorf("wharfmqtt: message %s: no subscription matches topic %q (PUBACK reason 0x10) and require_subscribers=true: subscribe to it, and the message is retried until then", m.ID, p.Topic)
	case err == nil:
		return nil
	case errors.Is(err, autopaho.ConnectionDownError):
		return fmt.Errorf("wharfmqtt: message %s: not connected to %s (reconnecting), not sent: %w", m.ID, s.where, err)
	case ctx.Err() != nil:
		return fmt.Errorf("wharfmqtt: message %s: gave up waiting for its PUBACK: %w", m.ID, ctxErr(ctx))
	case actx.Err() != nil:
		return fmt.Errorf("wharfmqtt: message %s: no PUBACK within ack_timeout %s (it may still be delivered; its redelivery has the same wharf-message-id)", m.ID, s.opts.AckTimeout)
	case resp != nil && resp.ReasonCode >= 0x80:
		return s.refused(m, p.Topic, resp, err)
	}
	return fmt.Errorf("wharfmqtt: message %s: %w", m.ID, err)
}

// refused classifies a PUBACK with a failure reason code.
func (s *Sink) refused(m *wharf.Message, topic string, resp *paho.PublishResponse, err error) error {
	reason := ""
	if resp.Properties != nil && resp.Properties.ReasonString != "" {
		reason = " (" + resp.Properties.ReasonString + ")"
	}
	e := fmt.Errorf("wharfmqtt: message %s: the server refused it with reason code 0x%02x%s: %w", m.ID, resp.ReasonCode, reason, err)
	switch resp.ReasonCode {
	case 0x90, 0x95, 0x99: // topic name invalid, packet too large, payload format invalid
		return wharf.Permanent(e)
	case 0x87: // not authorized: an operator can grant it
		return fmt.Errorf("%w; grant the client publish access to topic %q and the message is retried", e, topic)
	}
	return e
}

// build checks m and makes its PUBLISH packet.
func (s *Sink) build(m *wharf.Message) (*paho.Publish, error) {
	topic := s.Topic(m.Topic)
	if err := checkTopic(topic); err != nil {
		return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: wharf topic %q gives MQTT topic %q: %w", m.ID, m.Topic, topic, err))
	}
	if len(m.Payload) > s.opts.MaxPayload {
		return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: payload of %d bytes exceeds max_payload %d", m.ID, len(m.Payload), s.opts.MaxPayload))
	}
	props := &paho.PublishProperties{}
	p := &paho.Publish{QoS: 1, Topic: topic, Payload: m.Payload, Properties: props}
	add := func(k, v string) error {
		if !validString(k) || !validString(v) || len(k) > 65535 || len(v) > 65535 {
			return fmt.Errorf("header %.40q: MQTT user properties must be UTF-8 strings of at most 65535 bytes without control characters", k)
		}
		props.User = append(props.User, paho.UserProperty{Key: k, Value: v})
		return nil
	}
	if s.ce.On() {
		enc, err := s.ce.Encode(m, cloudevents.MQTT)
		if err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: %w", err))
		}
		p.Payload = enc.Body
		props.ContentType = enc.ContentType
		for _, a := range enc.Headers {
			if err := add(a.Name, a.Value); err != nil {
				return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: %w", m.ID, err))
			}
		}
		if s.ce.Mode == cloudevents.Binary {
			// Every user property is an attribute in binary mode.
			return p, s.checkSize(m, p)
		}
	}
	if err := add(PropertyMessageID, m.ID); err != nil {
		return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: %w", m.ID, err))
	}
	if m.Key != "" {
		if err := add(PropertyKey, m.Key); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: the key cannot be a user property: %w", m.ID, err))
		}
	}
	for k, v := range m.Headers {
		if k == PropertyMessageID || k == PropertyKey {
			continue // ours are authoritative
		}
		if err := add(k, v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: %w", m.ID, err))
		}
		if !s.ce.On() && strings.EqualFold(k, "content-type") {
			props.ContentType = v
		}
	}
	return p, s.checkSize(m, p)
}

// checkSize fails permanently a PUBLISH larger than MQTT or the server
// allows: the server would close the connection on it.
func (s *Sink) checkSize(m *wharf.Message, p *paho.Publish) error {
	size := 5 + 2 + len(p.Topic) + 2 + 5 + len(p.Payload)
	if ct := p.Properties.ContentType; ct != "" {
		size += 3 + len(ct)
	}
	for _, u := range p.Properties.User {
		size += 5 + len(u.Key) + len(u.Value)
	}
	limit := MaxPacketSize
	if sm := s.serverMaxPacket.Load(); sm > 0 && int(sm) < limit {
		limit = int(sm)
	}
	if size > limit {
		return wharf.Permanent(fmt.Errorf("wharfmqtt: message %s: a PUBLISH of about %d bytes exceeds the %d bytes the server takes (its Maximum Packet Size)", m.ID, size, limit))
	}
	return nil
}

// validString accepts what an MQTT UTF-8 string may hold: valid UTF-8
// without U+0000 and, since servers may close the connection on them, the
// other control characters.
func validString(v string) bool {
	if !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return true
}

// checkTopic accepts a topic a client may publish to.
func checkTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty topic")
	case len(t) > 65535:
		return errors.New("topic over 65535 bytes")
	case strings.ContainsAny(t, "+#"):
		return errors.New("the wildcards + and # cannot be published to")
	case strings.HasPrefix(t, "$"):
		return errors.New("topics starting with $ are the server's own ($SYS...): put topics under a prefix of your own with topic_template=prefix/{{topic}}")
	case !validString(t):
		return errors.New("not UTF-8, or has a control character")
	}
	return nil
}

// Close disconnects, ending the session, and stops reconnecting. Publishes
// still waiting for a PUBACK fail.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.shutdown()
	})
	return nil
}

func (s *Sink) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.cm.Disconnect(ctx)
	s.cancel()
	select {
	case <-s.cm.Done():
	case <-ctx.Done():
	}
}

// Ping reports whether the connection is up: it waits for a connection
// until ctx ends. It implements [wharf.Pinger], which readiness probes use.
func (s *Sink) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := s.cm.AwaitConnection(ctx); err != nil {
		return fmt.Errorf("wharfmqtt: not connected to %s: %w", s.where, err)
	}
	return nil
}

// tlsNames are the URL options naming the TLS files.
var tlsNames = [3]string{"tls_ca", "tls_cert", "tls_key"}

// urlConfig is what an mqtt:// URL says.
type urlConfig struct {
	opts     Options
	tlsFiles tlsfiles.Files
}

// Open opens the sink an mqtt:// or mqtts:// URL names (see the package
// documentation for its options). It is the opener the CLI registers for
// both schemes.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	if u.Scheme == "mqtts" {
		tc, err := cfg.tlsFiles.Config(tlsNames)
		if err != nil {
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
		tc.ServerName = u.Hostname()
		cfg.opts.TLSConfig = tc
	}
	s, err := New(ctx, cfg.opts)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %s", shown, strings.TrimPrefix(err.Error(), "wharfmqtt: "))
	}
	return s, nil
}

func parseURL(u *url.URL) (urlConfig, error) {
	shown := u.Redacted()
	var cfg urlConfig
	if u.Scheme != "mqtt" && u.Scheme != "mqtts" {
		return cfg, fmt.Errorf("sink URL %q: wharfmqtt opens mqtt:// and mqtts:// URLs", shown)
	}
	if u.Opaque != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return cfg, fmt.Errorf("sink URL %q: write %s://[user:password@]host:port?option=value", shown, u.Scheme)
	}
	if u.Hostname() == "" || strings.Contains(u.Host, ",") {
		return cfg, fmt.Errorf("sink URL %q names no host, or several: write %s://host:port", shown, u.Scheme)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"mqtt": "1883", "mqtts": "8883"}[u.Scheme]
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return cfg, fmt.Errorf("sink URL %q: port %q is not a port number", shown, port)
	}
	cfg.opts.Servers = []*url.URL{{Scheme: u.Scheme, Host: net.JoinHostPort(u.Hostname(), port)}}
	if u.User != nil {
		cfg.opts.Username = u.User.Username()
		cfg.opts.Password, _ = u.User.Password()
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "topic_template":
			cfg.opts.TopicTemplate = v
		case "client_id":
			if v == "" || !validString(v) {
				return cfg, fmt.Errorf("sink URL %q: client_id=%q: want a non-empty identifier without control characters", shown, v)
			}
			cfg.opts.ClientID = v
		case "session_expiry", "ack_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: %s=%q is not a positive duration such as 10s", shown, k, v)
			}
			if k == "ack_timeout" {
				cfg.opts.AckTimeout = d
				continue
			}
			if d < time.Second || d%time.Second != 0 || d > math.MaxUint32*time.Second {
				return cfg, fmt.Errorf("sink URL %q: session_expiry=%q: want whole seconds from 1s to %ds (MQTT counts it in seconds)", shown, v, uint32(math.MaxUint32))
			}
			cfg.opts.SessionExpiry = d
		case "max_in_flight", "max_payload":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || (k == "max_payload" && n > MaxPacketSize) {
				return cfg, fmt.Errorf("sink URL %q: %s=%q is not a positive number (max_payload at most %d)", shown, k, v, MaxPacketSize)
			}
			if k == "max_in_flight" {
				cfg.opts.MaxInFlight = n
			} else {
				cfg.opts.MaxPayload = n
			}
		case "require_subscribers":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: require_subscribers=%q: want true or false", shown, v)
			}
			cfg.opts.RequireSubscribers = b
		case "ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			cfg.opts.CloudEvents = v
		case "ce_source":
			cfg.opts.CloudEventsSource = v
		case "tls_ca", "tls_cert", "tls_key":
			if u.Scheme != "mqtts" {
				return cfg, fmt.Errorf("sink URL %q: %s is a TLS option: use mqtts://", shown, k)
			}
			cfg.tlsFiles.Set(tlsNames, k, v)
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the mqtt sink takes topic_template, client_id, session_expiry, ack_timeout, max_in_flight, max_payload, require_subscribers, ce, ce_source and, with mqtts, tls_ca, tls_cert and tls_key", urlmask.Option(u, k), k)
		}
	}
	if _, err := cloudevents.NewConfig(cfg.opts.CloudEvents, cfg.opts.CloudEventsSource); err != nil {
		return cfg, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, cfg.opts.CloudEvents, cfg.opts.CloudEventsSource, err)
	}
	t, err := wharf.ParseTopicTemplate(cfg.opts.TopicTemplate)
	if err != nil {
		return cfg, fmt.Errorf("sink URL %q: topic_template: %w", shown, err)
	}
	if err := checkTopic(t.Expand("t")); err != nil {
		return cfg, fmt.Errorf("sink URL %q: topic_template=%s: %w", shown, cmp.Or(cfg.opts.TopicTemplate, TopicPlaceholder), err)
	}
	return cfg, nil
}
