// Package wharfnats is the NATS JetStream sink of Wharf, built on nats.go.
//
// A [Sink] publishes the messages of a batch asynchronously on one connection
// and acknowledges each message only once JetStream answered with a PubAck,
// that is once a stream stored it. The message id ([wharf.Message.ID], unique
// beyond one outbox) goes in the Nats-Msg-Id header, so JetStream drops a
// redelivery that arrives within the stream's duplicate window; the sink
// reports such a message with [wharf.ErrDuplicate], which the relay counts as
// delivered. The key goes in the Wharf-Key header (NATS has no message key);
// the other headers are passed as NATS headers. docs/sinks/nats.md in the
// repository describes the sink for operators.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	nats://[user:password@]host:port[,host:port...][?option=value&...]
//
// Options, all optional:
//
//   - subject_template: the subject of a message, with "{{topic}}" replaced by
//     the wharf topic, e.g. "wharf.{{topic}}". Defaults to "{{topic}}".
//   - stream: the JetStream stream the subjects belong to. When set, Open
//     checks that it exists and every publish asks JetStream to confirm the
//     message landed in it. Defaults to none: JetStream picks the stream by
//     subject.
//   - create_stream: "true" to create the stream when it does not exist, with
//     the subject the template gives for every topic (the template must then
//     end with ".{{topic}}", e.g. stream=WHARF&subject_template=wharf.{{topic}}
//     creates WHARF on "wharf.>"), file storage and JetStream's defaults
//     otherwise. Requires stream. Defaults to "false": the sink creates
//     nothing.
//   - ack_timeout: how long to wait for a PubAck before failing the message
//     for the relay to retry, e.g. "10s". Defaults to 10s.
//   - strict_order: "true" to keep at most one unacknowledged message per
//     ordering key in flight (see Ordering). Defaults to "false".
//   - allow_system_subjects: "true" to allow subjects whose first token starts
//     with "$" or is "_INBOX" (see Security). Defaults to "false".
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//   - name: the connection name shown by the server. Defaults to "wharf".
//   - tls: "true" to require TLS. Defaults to "false".
//   - tls_ca: a PEM file of the CA certificates to verify the server with
//     (default: the system's roots); tls_cert and tls_key: a client
//     certificate and its key, for servers that verify clients. Any of them
//     turns TLS on.
//
// Open connects at once and fails when no server answers. Once connected the
// connection reconnects forever; while it is away, publishes fail at once
// (Open disables nats.go's reconnect buffer, so nothing is sent after Publish
// gave up on it) and the relay retries them.
//
// # CloudEvents
//
// With ce=binary each message follows the CloudEvents NATS binding's binary
// mode: the data is the payload and every attribute is a header "ce-<name>"
// with its value percent-encoded (ce-specversion "1.0", ce-id the message id,
// ce-source, ce-type the wharf topic, ce-subject the key, absent without one,
// ce-time the enqueue time, ce-datacontenttype, ce-traceparent and
// ce-tracestate from the message's trace context headers). With
// ce=structured the data is the JSON event and the Content-Type header is
// "application/cloudevents+json; charset=UTF-8". Nats-Msg-Id and Wharf-Key
// are sent in both modes; the message's own content-type header is not.
//
// # Security
//
// NATS serves its own APIs on ordinary subjects: "$JS.API.STREAM.PURGE.X"
// purges stream X, "$KV.bucket.key" writes a key-value entry, "$SYS..." is the
// system account. A topic comes from the application's data, so by default a
// subject whose first token starts with "$" or is "_INBOX" fails permanently
// instead of reaching the server. Headers whose name starts with "Nats-"
// (any case) are JetStream control headers (Nats-Rollup purges a subject or a
// stream, Nats-Expected-* and Nats-Msg-Id change how a publish is checked or
// deduplicated, Nats-TTL expires it): a message carrying one fails permanently.
// Give the sink a NATS user that may publish only to the stream's subjects.
//
// # Failures and ordering
//
// These fail permanently (the relay dead-letters them at once): a subject
// that is not a valid publish subject (empty, with spaces or wildcards) or is
// a system subject, a header NATS cannot carry or that starts with "Nats-", a
// message above the server's max_payload (headers included), and JetStream's
// "message size exceeds maximum allowed" (the stream's max_msg_size). All but
// the last are found before sending, so the later messages of their ordering
// key in the batch are reported with [wharf.ErrNotAttempted] and never sent.
// Everything else is retried by the relay: a PubAck timeout, a disconnection,
// a full stream, and no stream capturing the subject (create it and the
// messages go out; after the relay's attempt limit they are dead-lettered).
//
// By default a batch is pipelined: every message is sent before any PubAck is
// awaited, and JetStream stores a connection's messages in the order it sent
// them, so a key's messages keep their order within a subject. When a message
// fails after it was sent (a PubAck timeout, a full stream), the later
// messages of its key were sent too and may be stored; Publish reports each
// message's real result and the relay sends such a later message again after
// the failed one, so the stream's last copy of the key is in order but its
// first copy may not be. With strict_order a key's next message is sent only
// once the previous one was acknowledged (keys still go in parallel), so
// after a failure nothing later of that key is sent and the first copy is in
// order too, at the cost of one round trip per message of a key.
//
// Publish stops sending once its context is done and returns at once: unsent
// messages and messages whose PubAck had not come fail with retryable errors.
// A message that timed out may still be stored later; its redelivery carries
// the same Nats-Msg-Id.
package wharfnats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/tlsfiles"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// HeaderKey is the NATS header that carries [wharf.Message.Key] (absent for
// a message without a key).
const HeaderKey = "Wharf-Key"

// TopicPlaceholder is replaced by the wharf topic in Options.SubjectTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	defaultAckTimeout = 10 * time.Second
	defaultName       = "wharf"
	// maxPending bounds the PubAcks awaited at once on a sink's connection:
	// a few batches of the relay's largest size.
	maxPending = 16384
	// codeStreamNotMatch is JetStream's "expected stream does not match":
	// the subject belongs to another stream than Options.Stream.
	codeStreamNotMatch jetstream.ErrorCode = 10060
)

// Options configures a [Sink] built with [New].
type Options struct {
	// SubjectTemplate names the subject of a message: TopicPlaceholder is
	// replaced by the message's topic. Defaults to "{{topic}}".
	SubjectTemplate string
	// Stream, when set, is the stream every message must land in: each
	// publish asks JetStream to confirm it. Defaults to "" (JetStream picks
	// the stream by subject).
	Stream string
	// AckTimeout bounds the wait for each PubAck. Defaults to 10s.
	AckTimeout time.Duration
	// StrictOrder keeps at most one unacknowledged message per ordering key
	// in flight, so that no later message of a key is sent once one failed.
	// Defaults to false: the whole batch is in flight at once.
	StrictOrder bool
	// AllowSystemSubjects lets subjects whose first token starts with "$" or
	// is "_INBOX" through (NATS's own APIs and reply subjects). Defaults to
	// false: such messages fail permanently.
	AllowSystemSubjects bool
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see the package documentation). Defaults to "" (none).
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that publishes to NATS JetStream. It is safe for
// concurrent use.
type Sink struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	opts      Options
	names     wharf.TopicTemplate // destination per topic
	pubOpts   []jetstream.PublishOpt
	ce        cloudevents.Config
	ownsConn  bool
	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink publishing on nc, which the caller keeps owning: Close
// does not close it. nc should reconnect forever (nats.MaxReconnects(-1)),
// since a closed connection fails every later publish, and should not buffer
// while reconnecting (nats.ReconnectBufSize(-1)), so that a message Publish
// reported failed is not sent later when the connection comes back.
func New(nc *nats.Conn, opts Options) (*Sink, error) {
	if nc == nil {
		return nil, errors.New("wharfnats: New: nil connection")
	}
	names, err := wharf.ParseTopicTemplate(opts.SubjectTemplate)
	if err != nil {
		return nil, fmt.Errorf("wharfnats: Options.SubjectTemplate: %w", err)
	}
	if !opts.AllowSystemSubjects {
		if err := checkTemplate(names); err != nil {
			return nil, fmt.Errorf("wharfnats: Options.SubjectTemplate %q: %w; use a prefix of your own, or set Options.AllowSystemSubjects", cmp.Or(opts.SubjectTemplate, TopicPlaceholder), err)
		}
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfnats: Options.CloudEvents: %w", err)
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = defaultAckTimeout
	}
	if opts.AckTimeout < 0 {
		return nil, fmt.Errorf("wharfnats: Options.AckTimeout %s is negative", opts.AckTimeout)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(maxPending),
	)
	if err != nil {
		return nil, fmt.Errorf("wharfnats: %w", err)
	}
	// No retry inside nats.go on "no responders": its retries run on timers
	// of their own, so two messages of a key could be re-sent out of order,
	// and after Publish returned. The relay retries in order instead.
	pubOpts := []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}
	if opts.Stream != "" {
		pubOpts = append(pubOpts, jetstream.WithExpectStream(opts.Stream))
	}
	return &Sink{names: names, nc: nc, js: js, opts: opts, pubOpts: pubOpts, ce: ce}, nil
}

// Subject returns the subject a message of the wharf topic is published to.
func (s *Sink) Subject(topic string) string { return s.names.Expand(topic) }

// JetStream returns the JetStream context the sink publishes with.
func (s *Sink) JetStream() jetstream.JetStream { return s.js }

// Publish publishes msgs and waits for every PubAck, each bounded by the ack
// timeout, or for ctx to end. Once ctx is done it sends nothing more and
// returns at once: messages not sent yet, and sent ones whose PubAck had not
// come, fail with retryable errors wrapping ctx's error. A message JetStream
// acknowledged as a duplicate of one it holds is reported with
// [wharf.ErrDuplicate].
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	res := wharf.NewResults(msgs)
	if s.opts.StrictOrder {
		s.publishStrict(ctx, msgs, res)
	} else {
		s.publishPipelined(ctx, msgs, res)
	}
	if ctx.Err() != nil {
		res.FailRest(notSent(ctx))
	}
	return res.Errors()
}

// publishPipelined sends the whole batch, then waits for the PubAcks.
func (s *Sink) publishPipelined(ctx context.Context, msgs []*wharf.Message, res *wharf.Results) {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		if ctx.Err() != nil {
			break
		}
		if res.Blocked(i) {
			continue
		}
		f, err := s.send(m)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		futures[i] = f
	}
	// Every message sent gets its real result, also one sent after an
	// earlier message of its key failed: if the stream took it, the relay
	// must know to send it again after the failed one.
	for i, f := range futures {
		if f != nil {
			res.Set(i, s.await(ctx, msgs[i], f))
		}
	}
}

// publishStrict sends each ordering key's messages one after the other, the
// next only once the previous was acknowledged, all keys at once. Unkeyed
// messages have no order to keep and are pipelined.
func (s *Sink) publishStrict(ctx context.Context, msgs []*wharf.Message, res *wharf.Results) {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	errs := make([]error, len(msgs))
	tried := make([]bool, len(msgs))
	var chains [][]int // message indexes per ordering key, in batch order
	chainOf := map[string]int{}
	// In batch order, send every unkeyed message and the first message of
	// every key: a batch of distinct keys goes out as in pipelined mode.
	for i, m := range msgs {
		if ctx.Err() != nil {
			break
		}
		if k := m.OrderingKey(); k != "" {
			if c, ok := chainOf[k]; ok {
				chains[c] = append(chains[c], i)
				continue
			}
			chainOf[k] = len(chains)
			chains = append(chains, []int{i})
		}
		tried[i] = true
		futures[i], errs[i] = s.send(m)
	}
	// A goroutine per key with more messages carries on from its first;
	// each index is written by one goroutine only and read after Wait.
	chained := make([]bool, len(msgs))
	var wg sync.WaitGroup
	for _, chain := range chains {
		if head := chain[0]; len(chain) > 1 && futures[head] != nil {
			chained[head] = true
			wg.Go(func() { s.runChain(ctx, msgs, chain, futures[head], errs, tried) })
		}
	}
	for i, f := range futures {
		if f != nil && !chained[i] {
			errs[i] = s.await(ctx, msgs[i], f)
		}
	}
	wg.Wait()
	for i := range msgs {
		if tried[i] {
			res.Set(i, errs[i])
		} else {
			res.Blocked(i) // after a failure of its key: not attempted
		}
	}
}

// runChain awaits the PubAck of the first message of chain, already sent as
// head, then sends and awaits the others one at a time, and stops at the
// first failure or when ctx ends.
func (s *Sink) runChain(ctx context.Context, msgs []*wharf.Message, chain []int, head jetstream.PubAckFuture, errs []error, tried []bool) {
	err := s.await(ctx, msgs[chain[0]], head)
	errs[chain[0]] = err
	for _, i := range chain[1:] {
		if (err != nil && err != wharf.ErrDuplicate) || ctx.Err() != nil { //nolint:errorlint // await returns the sentinel itself
			return
		}
		tried[i] = true
		var f jetstream.PubAckFuture
		if f, err = s.send(msgs[i]); err == nil {
			err = s.await(ctx, msgs[i], f)
		}
		errs[i] = err
	}
}

// await waits for f's PubAck, or for ctx to end, and returns the message's
// result.
func (s *Sink) await(ctx context.Context, m *wharf.Message, f jetstream.PubAckFuture) error {
	select {
	case ack := <-f.Ok():
		return ackResult(ack)
	case err := <-f.Err():
		return s.classify(m, err)
	case <-ctx.Done():
	}
	// The answer may have come at the same time: prefer it.
	select {
	case ack := <-f.Ok():
		return ackResult(ack)
	case err := <-f.Err():
		return s.classify(m, err)
	default:
		return fmt.Errorf("wharfnats: message %s: gave up waiting for its PubAck: %w", m.ID, ctxErr(ctx))
	}
}

func ackResult(ack *jetstream.PubAck) error {
	if ack.Duplicate {
		return wharf.ErrDuplicate
	}
	return nil
}

// errNotSent marks a message Publish did not send because its context ended.
var errNotSent = errors.New("not sent: the publish was cut short")

func notSent(ctx context.Context) error {
	return fmt.Errorf("wharfnats: %w: %w", errNotSent, ctxErr(ctx))
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

// send checks m and publishes it asynchronously.
func (s *Sink) send(m *wharf.Message) (jetstream.PubAckFuture, error) {
	subject := s.Subject(m.Topic)
	if err := checkSubject(subject); err != nil {
		return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %s: wharf topic %q gives subject %q: %w", m.ID, m.Topic, subject, err))
	}
	if !s.opts.AllowSystemSubjects && isSystemSubject(subject) {
		return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %s: wharf topic %q gives subject %q, a NATS system subject (first token starting with $, or _INBOX), which the sink refuses: put topics under a prefix of your own with subject_template=prefix.{{topic}}, or set allow_system_subjects=true if you mean it", m.ID, m.Topic, subject))
	}
	msg := &nats.Msg{Subject: subject, Data: m.Payload, Header: make(nats.Header, len(m.Headers)+3)}
	var enc cloudevents.Encoded
	if s.ce.On() {
		var err error
		if enc, err = s.ce.Encode(m, cloudevents.NATS); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: %w", err))
		}
		msg.Data = enc.Body
	}
	for k, v := range m.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %s: %w", m.ID, err))
		}
		if s.ce.On() && enc.Replaces(k) {
			continue // the event carries it
		}
		// Set directly: nats.Header.Set would canonicalize the key's case.
		msg.Header[k] = []string{v}
	}
	for _, a := range enc.Headers {
		msg.Header[a.Name] = []string{a.Value} // percent-encoded: always a valid header
	}
	if enc.ContentType != "" {
		msg.Header["Content-Type"] = []string{enc.ContentType}
	}
	for k := range msg.Header {
		// The key header is ours: a message's own would pass for a key.
		if strings.EqualFold(k, HeaderKey) {
			delete(msg.Header, k)
		}
	}
	if m.Key != "" {
		if err := checkHeader(HeaderKey, m.Key); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %s: the key cannot be a header value: %w", m.ID, err))
		}
		msg.Header[HeaderKey] = []string{m.Key}
	}
	opts := append(s.pubOpts[:len(s.pubOpts):len(s.pubOpts)], jetstream.WithMsgID(m.ID))
	f, err := s.js.PublishMsgAsync(msg, opts...)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, nats.ErrMaxPayload):
		return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %s: %d payload bytes plus headers exceed the server's max_payload %d: %w", m.ID, len(m.Payload), s.nc.MaxPayload(), err))
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		return nil, fmt.Errorf("wharfnats: message %s: not connected to NATS (reconnecting), not sent: %w", m.ID, err)
	}
	return nil, fmt.Errorf("wharfnats: message %s: publish to %q: %w", m.ID, subject, err)
}

// isSystemSubject reports whether subject is one of NATS's own: its APIs and
// services ($JS, $KV, $O, $SYS, ...) and the inboxes replies go to.
func isSystemSubject(subject string) bool {
	tok, _, _ := strings.Cut(subject, ".")
	return strings.HasPrefix(tok, "$") || tok == "_INBOX"
}

// checkTemplate refuses a template whose every subject is a system subject,
// so that the mistake shows at start-up rather than on every message.
func checkTemplate(t wharf.TopicTemplate) error {
	p := t.Prefix()
	fixed := t.Expand("a") == t.Expand("b")
	tok, _, dotted := strings.Cut(p, ".")
	if strings.HasPrefix(p, "$") || ((dotted || fixed) && tok == "_INBOX") {
		return fmt.Errorf("its subjects start with %q, a NATS system subject (first token starting with $, or _INBOX)", tok)
	}
	return nil
}

// checkSubject accepts what NATS accepts as a publish subject: dot-separated
// non-empty tokens without whitespace and without the wildcards * and >.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("empty subject")
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" {
			return errors.New("empty subject token (leading, trailing or double dot)")
		}
		if tok == "*" || tok == ">" {
			return errors.New("wildcards cannot be published to")
		}
		if strings.ContainsAny(tok, " \t\r\n\f\v") {
			return errors.New("white space in subject")
		}
	}
	return nil
}

// controlPrefix starts the names of the headers JetStream acts on.
const controlPrefix = "Nats-"

// checkHeader rejects what the NATS header block cannot carry (keys with
// white space, colons or control characters, values with CR or LF) and the
// JetStream control headers.
func checkHeader(k, v string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for _, c := range []byte(k) {
		if c <= ' ' || c == ':' || c == 0x7f {
			return fmt.Errorf("header name %q has a character NATS headers cannot carry", k)
		}
	}
	if len(k) >= len(controlPrefix) && strings.EqualFold(k[:len(controlPrefix)], controlPrefix) {
		return fmt.Errorf("header %q is refused: headers starting with %q are JetStream control headers (Nats-Rollup, Nats-Expected-*, Nats-Msg-Id, Nats-TTL, ...) and would change what the stream does; rename it", k, controlPrefix)
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("header %q has a line break in its value", k)
	}
	return nil
}

// classify turns a PubAck error into a relay result.
func (s *Sink) classify(m *wharf.Message, err error) error {
	subject := s.Subject(m.Topic)
	var apiErr *jetstream.APIError
	errors.As(err, &apiErr)
	switch {
	case apiErr != nil && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return wharf.Permanent(fmt.Errorf("wharfnats: message %s: %w", m.ID, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("wharfnats: message %s: no JetStream stream answered for subject %q (%w): create a stream whose subjects include it, or open the sink with stream=NAME&create_stream=true, or fix subject_template; the message is retried until then", m.ID, subject, err)
	case apiErr != nil && apiErr.ErrorCode == codeStreamNotMatch:
		return fmt.Errorf("wharfnats: message %s: subject %q belongs to another stream than stream=%s (%w): fix subject_template or the streams' subjects", m.ID, subject, s.opts.Stream, err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return fmt.Errorf("wharfnats: message %s: no PubAck within ack_timeout %s (it may still be stored; its redelivery has the same Nats-Msg-Id): %w", m.ID, s.opts.AckTimeout, err)
	}
	return fmt.Errorf("wharfnats: message %s: %w", m.ID, err)
}

// Close stops the sink; when Open made the connection, it closes it.
// Publishes still waiting for a PubAck fail.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		if s.ownsConn {
			s.nc.Close()
		}
	})
	return nil
}

// urlConfig is what a nats:// URL says.
type urlConfig struct {
	servers      []string
	opts         Options
	createStream bool
	name         string
	tls          bool
	tlsFiles     tlsfiles.Files
}

// tlsNames are the URL options naming the TLS files.
var tlsNames = [3]string{"tls_ca", "tls_cert", "tls_key"}

// Open opens the sink a nats:// URL names (see the package documentation for
// its options). It is the opener the CLI registers for the "nats" scheme.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	nopts := []nats.Option{
		nats.Name(cfg.name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectBufSize(-1),
	}
	if cfg.tls {
		tc, err := cfg.tlsFiles.Config(tlsNames)
		if err != nil {
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
		nopts = append(nopts, nats.Secure(tc))
	}
	nc, err := nats.Connect(strings.Join(cfg.servers, ","), nopts...)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: cannot connect: %w", shown, err)
	}
	s, err := New(nc, cfg.opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.ownsConn = true
	if cfg.opts.Stream != "" {
		if err := s.ensureStream(ctx, cfg.createStream); err != nil {
			nc.Close()
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
	}
	return s, nil
}

// ensureStream checks the stream exists and, when create is set, creates it
// if it does not.
func (s *Sink) ensureStream(ctx context.Context, create bool) error {
	name := s.opts.Stream
	_, err := s.js.Stream(ctx, name)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("cannot look up stream %q: %w", name, err)
	case !create:
		return fmt.Errorf("stream %q does not exist: create it, or add create_stream=true", name)
	}
	_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{s.names.Prefix() + ">"},
		Storage:  jetstream.FileStorage,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("cannot create stream %q on %q: %w", name, s.names.Prefix()+">", err)
	}
	return nil
}

func parseURL(u *url.URL) (urlConfig, error) {
	shown := u.Redacted()
	cfg := urlConfig{name: defaultName}
	if u.Scheme != "nats" {
		return cfg, fmt.Errorf("sink URL %q: wharfnats opens nats:// URLs", shown)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return cfg, fmt.Errorf("sink URL %q: write nats://host:port[,host:port]?option=value", shown)
	}
	auth := ""
	if u.User != nil {
		auth = u.User.String() + "@" // escaped as in the URL
	}
	for h := range strings.SplitSeq(u.Host, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		cfg.servers = append(cfg.servers, "nats://"+auth+h)
	}
	if len(cfg.servers) == 0 {
		return cfg, fmt.Errorf("sink URL %q names no server: write nats://host:port", shown)
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "subject_template":
			cfg.opts.SubjectTemplate = v
		case "stream":
			cfg.opts.Stream = v
		case "create_stream":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: create_stream=%q: want true or false", shown, v)
			}
			cfg.createStream = b
		case "ack_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: ack_timeout=%q is not a positive duration such as 10s", shown, v)
			}
			cfg.opts.AckTimeout = d
		case "strict_order":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: strict_order=%q: want true or false", shown, v)
			}
			cfg.opts.StrictOrder = b
		case "allow_system_subjects":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: allow_system_subjects=%q: want true or false", shown, v)
			}
			cfg.opts.AllowSystemSubjects = b
		case "name":
			cfg.name = v
		case "ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			cfg.opts.CloudEvents = v
		case "ce_source":
			cfg.opts.CloudEventsSource = v
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: tls=%q: want true or false", shown, v)
			}
			cfg.tls = b
		case "tls_ca", "tls_cert", "tls_key":
			cfg.tlsFiles.Set(tlsNames, k, v)
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the nats sink takes subject_template, stream, create_stream, ack_timeout, strict_order, allow_system_subjects, name, ce, ce_source, tls, tls_ca, tls_cert and tls_key", urlmask.Option(u, k), k)
		}
	}
	if cfg.tlsFiles.Any() {
		if q := u.Query(); q.Has("tls") && !cfg.tls {
			return cfg, fmt.Errorf("sink URL %q: tls=false with tls_ca, tls_cert or tls_key: the files are for TLS; drop tls=false", shown)
		}
		cfg.tls = true
	}
	if _, err := cloudevents.NewConfig(cfg.opts.CloudEvents, cfg.opts.CloudEventsSource); err != nil {
		return cfg, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, cfg.opts.CloudEvents, cfg.opts.CloudEventsSource, err)
	}
	names, err := wharf.ParseTopicTemplate(cfg.opts.SubjectTemplate)
	if err != nil {
		return cfg, fmt.Errorf("sink URL %q: subject_template: %w", shown, err)
	}
	if !cfg.opts.AllowSystemSubjects {
		if err := checkTemplate(names); err != nil {
			return cfg, fmt.Errorf("sink URL %q: subject_template=%s: %w; use a prefix of your own, or add allow_system_subjects=true", shown, cmp.Or(cfg.opts.SubjectTemplate, TopicPlaceholder), err)
		}
	}
	if cfg.createStream {
		if cfg.opts.Stream == "" {
			return cfg, fmt.Errorf("sink URL %q: create_stream=true needs stream=NAME", shown)
		}
		tmpl := cmp.Or(cfg.opts.SubjectTemplate, TopicPlaceholder)
		prefix, found := strings.CutSuffix(tmpl, TopicPlaceholder)
		if !found || !strings.HasSuffix(prefix, ".") || checkSubject(prefix+"x") != nil {
			return cfg, fmt.Errorf("sink URL %q: create_stream=true needs a subject_template of the form prefix.{{topic}} (the stream takes prefix.>), not %q", shown, tmpl)
		}
	}
	return cfg, nil
}

// Ping reports whether the connection to NATS is up (it does not wait for a
// round trip: a reconnecting or closed connection fails at once). It
// implements [wharf.Pinger], which readiness probes use.
func (s *Sink) Ping(context.Context) error {
	if st := s.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("wharfnats: not connected to NATS (%s)", strings.ToLower(st.String()))
	}
	return nil
}
