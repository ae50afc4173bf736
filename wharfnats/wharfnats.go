// Package wharfnats is the NATS JetStream sink of Wharf, built on nats.go.
//
// A [Sink] publishes every message of a batch asynchronously on one
// connection and acknowledges each message only once JetStream answered with
// a PubAck, that is once the stream stored it. The message id
// ([wharf.Message.MessageID]) goes in the Nats-Msg-Id header, so JetStream
// drops a redelivery that arrives within the stream's duplicate window and
// consumers can deduplicate after it. The key goes in the Wharf-Key header
// (NATS has no message key); the other headers are passed as NATS headers.
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
//   - name: the connection name shown by the server. Defaults to "wharf".
//   - tls: "true" to require TLS. Defaults to "false".
//
// Open connects at once and fails when no server answers. Once connected the
// connection reconnects forever: while the server is away, publishes fail
// after ack_timeout and the relay retries them.
//
// # Failures and ordering
//
// Messages of one batch are published in order on one connection, and
// JetStream stores a connection's messages in the order it sent them, so a
// key's messages keep their order within a subject. These fail permanently
// (the relay dead-letters them at once): a subject that is not a valid
// publish subject (empty, with spaces or wildcards), a header NATS cannot
// carry, a message above the server's max_payload (headers included) and
// JetStream's "message size exceeds maximum allowed". Those are found before
// sending, except the last, so the later messages of their key in the batch
// are reported with [wharf.ErrNotAttempted] and never sent. Everything else is
// retried by the relay: a PubAck timeout, a disconnection, and no stream for
// the subject (create it and the messages go out; after the relay's attempt
// limit they are dead-lettered). When a message fails after it was sent (for
// example a PubAck timeout), the later messages of its key were sent too;
// Publish reports each message's real result. A message that timed out may
// still be stored later; its redelivery carries the same Nats-Msg-Id.
package wharfnats

import (
	"cmp"
	"context"
	"crypto/tls"
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
)

// HeaderKey is the NATS header that carries [wharf.Message.Key] (absent for
// a message without a key).
const HeaderKey = "Wharf-Key"

// TopicPlaceholder is replaced by the wharf topic in Options.SubjectTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	defaultAckTimeout = 10 * time.Second
	defaultName       = "wharf"
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
}

// Sink is a [wharf.Sink] that publishes to NATS JetStream. It is safe for
// concurrent use.
type Sink struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	opts      Options
	names     wharf.TopicTemplate // destination per topic
	ownsConn  bool
	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink publishing on nc, which the caller keeps owning: Close
// does not close it. nc should reconnect forever (nats.MaxReconnects(-1)),
// since a closed connection fails every later publish.
func New(nc *nats.Conn, opts Options) (*Sink, error) {
	if nc == nil {
		return nil, errors.New("wharfnats: New: nil connection")
	}
	names, err := wharf.ParseTopicTemplate(opts.SubjectTemplate)
	if err != nil {
		return nil, fmt.Errorf("wharfnats: Options.SubjectTemplate: %w", err)
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = defaultAckTimeout
	}
	if opts.AckTimeout < 0 {
		return nil, fmt.Errorf("wharfnats: Options.AckTimeout %s is negative", opts.AckTimeout)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(16384),
	)
	if err != nil {
		return nil, fmt.Errorf("wharfnats: %w", err)
	}
	s := &Sink{names: names, nc: nc, js: js, opts: opts}
	return s, nil
}

// Subject returns the subject a message of the wharf topic is published to.
func (s *Sink) Subject(topic string) string { return s.names.Expand(topic) }

// JetStream returns the JetStream context the sink publishes with.
func (s *Sink) JetStream() jetstream.JetStream { return s.js }

// Publish publishes msgs and waits for every PubAck, each bounded by the ack
// timeout, or for ctx to end. Messages whose PubAck had not come when ctx
// ended are reported with ctx's error.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), fmt.Errorf("wharfnats: %w", err))
	}
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	var blocked map[string]bool // keys with a message that failed before sending
	failed := false
	for i, m := range msgs {
		if m.Key != "" && blocked[m.Key] {
			errs[i] = wharf.ErrNotAttempted
			failed = true
			continue
		}
		f, err := s.publishAsync(m)
		if err != nil {
			errs[i] = err
			failed = true
			if m.Key != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[m.Key] = true
			}
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = classify(msgs[i], err)
			failed = true
		case <-ctx.Done():
			err := fmt.Errorf("wharfnats: gave up waiting for the PubAck: %w", ctx.Err())
			for j := i; j < len(futures); j++ {
				if futures[j] == nil {
					continue
				}
				select {
				case <-futures[j].Ok():
				case e := <-futures[j].Err():
					errs[j] = classify(msgs[j], e)
				default:
					errs[j] = err
				}
			}
			return errs
		}
	}
	if !failed {
		return nil
	}
	return errs
}

func (s *Sink) publishAsync(m *wharf.Message) (jetstream.PubAckFuture, error) {
	subject := s.Subject(m.Topic)
	if err := checkSubject(subject); err != nil {
		return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %d: wharf topic %q gives subject %q: %w", m.ID, m.Topic, subject, err))
	}
	msg := &nats.Msg{Subject: subject, Data: m.Payload, Header: make(nats.Header, len(m.Headers)+2)}
	for k, v := range m.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %d: %w", m.ID, err))
		}
		// Set directly: nats.Header.Set would canonicalize the key's case.
		msg.Header[k] = []string{v}
	}
	delete(msg.Header, jetstream.MsgIDHeader) // ours is authoritative
	if m.Key != "" {
		if err := checkHeader(HeaderKey, m.Key); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %d: the key cannot be a header value: %w", m.ID, err))
		}
		msg.Header[HeaderKey] = []string{m.Key}
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(m.MessageID())}
	if s.opts.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(s.opts.Stream))
	}
	f, err := s.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, wharf.Permanent(fmt.Errorf("wharfnats: message %d: %d payload bytes plus headers exceed the server's max_payload %d: %w", m.ID, len(m.Payload), s.nc.MaxPayload(), err))
		}
		return nil, fmt.Errorf("wharfnats: publish to %q: %w", subject, err)
	}
	return f, nil
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

// checkHeader rejects what the NATS header block cannot carry: keys with
// white space, colons or control characters, and values with CR or LF.
func checkHeader(k, v string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for _, c := range []byte(k) {
		if c <= ' ' || c == ':' || c == 0x7f {
			return fmt.Errorf("header name %q has a character NATS headers cannot carry", k)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("header %q has a line break in its value", k)
	}
	return nil
}

// classify turns a PubAck error into a relay result.
func classify(m *wharf.Message, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return wharf.Permanent(fmt.Errorf("wharfnats: message %d: %w", m.ID, err))
	}
	return fmt.Errorf("wharfnats: message %d: %w", m.ID, err)
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
}

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
	}
	if cfg.tls {
		nopts = append(nopts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}))
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
		case "name":
			cfg.name = v
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: tls=%q: want true or false", shown, v)
			}
			cfg.tls = b
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the nats sink takes subject_template, stream, create_stream, ack_timeout, name and tls", shown, k)
		}
	}
	if _, err := wharf.ParseTopicTemplate(cfg.opts.SubjectTemplate); err != nil {
		return cfg, fmt.Errorf("sink URL %q: subject_template: %w", shown, err)
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
