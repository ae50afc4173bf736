// Package wharfpubsub is the Google Cloud Pub/Sub sink of Wharf, built on
// cloud.google.com/go/pubsub/v2.
//
// A [Sink] publishes every message of a batch through the client's
// publishers (one per Pub/Sub topic, with message ordering on), which
// bundle them into Publish requests, and acknowledges a message only when
// its publish result came back with a server-assigned id, that is once
// Pub/Sub stored it. docs/sinks/pubsub.md in the repository describes the
// sink for operators.
//
// # Messages
//
// The payload is the message data, unchanged. The attributes are the
// message's headers plus wharf-id ([wharf.Message.ID]), wharf-topic and,
// for a keyed message, wharf-key. The ordering key is the message key, so a
// subscription with message ordering enabled delivers each key's messages
// in order; a key above 1,024 bytes (Pub/Sub's limit for both) fails the
// message permanently.
//
// # Ordering and failures
//
// The client keeps each ordering key's messages in order on the wire and,
// when one of them fails, fails the later ones it still holds without
// sending them and pauses the key. Publish reports the first failure as it
// came, the later messages of the key with [wharf.ErrNotAttempted], and
// once every result of the batch is in resumes every key that failed
// (Publisher.ResumePublish), so the relay's retry goes through. These fail
// permanently: a message above max_message_bytes, a header that cannot be
// an attribute (an empty name, a name above 256 bytes or starting with
// "goog", a value above 1,024 bytes), a topic that gives an invalid topic
// name, and Pub/Sub's INVALID_ARGUMENT. Everything else (unavailable, a
// missing topic, permissions, quota) is retried by the relay.
//
// # URL
//
// From the CLI the sink is opened with a URL (see [Open]):
//
//	pubsub://PROJECT[?option=value&...]
//
// Credentials come from Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS, gcloud's user credentials, the metadata
// server); PUBSUB_EMULATOR_HOST, as for every Pub/Sub client, points the
// sink at an emulator without credentials. PROJECT is a Google Cloud
// project ID, or with an emulator (endpoint or PUBSUB_EMULATOR_HOST) any
// non-empty ID, e.g. pubsub://test. Options, all optional:
//
//   - topic_template: the Pub/Sub topic ID of a message, with "{{topic}}"
//     replaced by the wharf topic, e.g. "wharf-{{topic}}" ("{{topic|dashes}}"
//     puts the topic with its dots as dashes). Defaults to "{{topic}}".
//     Topics are not created.
//   - endpoint: host:port of an emulator, reached without TLS and without
//     credentials (the same as PUBSUB_EMULATOR_HOST).
//   - publish_timeout: how long the client keeps trying one bundle before
//     its messages fail, e.g. "30s". Defaults to 60s.
//   - max_message_bytes: the largest message, data plus attributes and
//     ordering key. Defaults to 10000000, Pub/Sub's limit.
//   - ce: "binary" or "structured" to send every message as a CloudEvent
//     (see CloudEvents). Defaults to none.
//   - ce_source: the CloudEvents source attribute. Defaults to "/wharf".
//
// # CloudEvents
//
// With ce=binary each message follows the CloudEvents Pub/Sub binding's
// binary mode: the data is the payload, datacontenttype is the
// "Content-Type" attribute, and every other attribute is an attribute
// "ce-<name>" (ce-specversion "1.0", ce-id the message id, ce-source,
// ce-type the wharf topic, ce-subject the key when there is one, ce-time
// the enqueue time, ce-traceparent and ce-tracestate from the message's
// trace context headers). With ce=structured the data is the JSON event
// and the Content-Type attribute is "application/cloudevents+json;
// charset=UTF-8". In both modes the wharf- attributes, the ordering key and
// the message's other headers are sent as without CloudEvents; its own
// content-type header is not (the event carries it). A message that cannot
// be a CloudEvent fails permanently.
package wharfpubsub

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// Attributes the sink adds to every message.
const (
	// AttrID carries [wharf.Message.ID].
	AttrID = "wharf-id"
	// AttrTopic carries the wharf topic.
	AttrTopic = "wharf-topic"
	// AttrKey carries [wharf.Message.Key] (absent for a message without one).
	AttrKey = "wharf-key"
	// AttrContentType is the attribute the CloudEvents Pub/Sub binding
	// names for the content type: datacontenttype in binary mode,
	// application/cloudevents+json in structured mode.
	AttrContentType = "Content-Type"
)

// bindingPubSub is the CloudEvents Pub/Sub binding: attributes ce-<name>,
// datacontenttype in the Content-Type attribute.
var bindingPubSub = cloudevents.Binding{Name: "Pub/Sub", Prefix: "ce-"}

// TopicPlaceholder is replaced by the wharf topic in Options.TopicTemplate.
const TopicPlaceholder = wharf.TopicPlaceholder

const (
	defaultMaxBytes       = 10_000_000
	defaultPublishTimeout = 60 * time.Second
	maxAttrKey            = 256
	maxAttrValue          = 1024
	maxAttributes         = 100
)

// Options configures a [Sink] built with [New].
type Options struct {
	// TopicTemplate names the Pub/Sub topic ID of a message:
	// TopicPlaceholder is replaced by its topic. Defaults to "{{topic}}".
	TopicTemplate string
	// PublishTimeout bounds the client's attempts at one bundle. Defaults to
	// 60s.
	PublishTimeout time.Duration
	// MaxMessageBytes is the largest message, data plus attributes and
	// ordering key. Defaults to 10000000.
	MaxMessageBytes int
	// CloudEvents sends every message as a CloudEvent: "binary" or
	// "structured" (see CloudEvents). Defaults to none.
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that publishes to Google Cloud Pub/Sub. It is safe
// for concurrent use.
type Sink struct {
	client     *pubsub.Client
	ownsClient bool
	opts       Options
	names      wharf.TopicTemplate
	ce         cloudevents.Config

	mu         sync.Mutex
	publishers map[string]*pubsub.Publisher // by topic ID
	last       string                       // the topic ID last published to
	closed     bool
	inflight   sync.WaitGroup
	closing    atomic.Bool
}

var (
	_ wharf.Sink   = (*Sink)(nil)
	_ wharf.Pinger = (*Sink)(nil)
)

// New returns a sink publishing with client, which the caller keeps owning:
// Close stops the sink's publishers, not the client.
func New(client *pubsub.Client, opts Options) (*Sink, error) {
	if client == nil {
		return nil, errors.New("wharfpubsub: New: nil client")
	}
	names, err := wharf.ParseTopicTemplate(opts.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("wharfpubsub: Options.TopicTemplate: %w", err)
	}
	if err := checkTopicID(names.Expand("topic")); err != nil {
		return nil, fmt.Errorf("wharfpubsub: Options.TopicTemplate %q: %w", opts.TopicTemplate, err)
	}
	if opts.PublishTimeout == 0 {
		opts.PublishTimeout = defaultPublishTimeout
	}
	if opts.PublishTimeout < 0 {
		return nil, fmt.Errorf("wharfpubsub: Options.PublishTimeout %s is negative", opts.PublishTimeout)
	}
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = defaultMaxBytes
	}
	if opts.MaxMessageBytes < 1024 || opts.MaxMessageBytes > defaultMaxBytes {
		return nil, fmt.Errorf("wharfpubsub: Options.MaxMessageBytes %d is not from 1024 to %d", opts.MaxMessageBytes, defaultMaxBytes)
	}
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfpubsub: Options.CloudEvents: %w", err)
	}
	return &Sink{client: client, opts: opts, names: names, ce: ce, publishers: map[string]*pubsub.Publisher{}}, nil
}

// TopicID returns the Pub/Sub topic ID a message of the wharf topic goes to.
func (s *Sink) TopicID(topic string) string { return s.names.Expand(topic) }

// publisher returns the publisher of topic ID id, made on first use.
func (s *Sink) publisher(id string) (*pubsub.Publisher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	s.last = id
	if p := s.publishers[id]; p != nil {
		return p, nil
	}
	p := s.client.Publisher(id)
	p.EnableMessageOrdering = true
	p.PublishSettings.Timeout = s.opts.PublishTimeout
	p.PublishSettings.ByteThreshold = s.opts.MaxMessageBytes
	s.publishers[id] = p
	return p, nil
}

var errClosed = errors.New("wharfpubsub: the sink is closed")

// Publish publishes msgs and waits for every result, or for ctx to end.
// It publishes nothing more once ctx is done; a message already handed to
// the client may still be stored after Publish gave up on it.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if s.closing.Load() {
		return wharf.FailAll(len(msgs), errClosed)
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	res := wharf.NewResults(msgs)
	results := make([]*pubsub.PublishResult, len(msgs))
	pubs := make([]*pubsub.Publisher, len(msgs))
	orderingKeys := make([]string, len(msgs))
	for i, m := range msgs {
		if res.Blocked(i) {
			continue
		}
		if ctx.Err() != nil {
			res.Set(i, notSent(ctx))
			continue
		}
		pm, err := s.encode(m)
		if err != nil {
			res.Set(i, err)
			continue
		}
		p, err := s.publisher(s.TopicID(m.Topic))
		if err != nil {
			res.Set(i, err)
			continue
		}
		pubs[i], orderingKeys[i] = p, pm.OrderingKey
		results[i] = p.Publish(ctx, pm)
	}
	failedKeys := map[*pubsub.Publisher]map[string]bool{}
	for i, r := range results {
		if r == nil {
			continue
		}
		_, err := r.Get(ctx)
		err = s.classify(msgs[i], err, ctx)
		if err != nil && orderingKeys[i] != "" {
			if failedKeys[pubs[i]] == nil {
				failedKeys[pubs[i]] = map[string]bool{}
			}
			failedKeys[pubs[i]][orderingKeys[i]] = true
		}
		res.Set(i, err)
	}
	// Every result of the batch is in (or ctx ended): let the keys that
	// failed through again for the relay's retry. A key whose result was
	// still pending may fail later and pause again; its next Publish then
	// fails at once, reports it not attempted, and resumes it here.
	for p, keys := range failedKeys {
		for k := range keys {
			p.ResumePublish(k)
		}
	}
	return res.Errors()
}

// encode builds m's Pub/Sub message; a message Pub/Sub cannot take fails
// permanently here, before anything is sent.
func (s *Sink) encode(m *wharf.Message) (*pubsub.Message, error) {
	id := s.TopicID(m.Topic)
	if err := checkTopicID(id); err != nil {
		return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: wharf topic %q gives topic ID %q: %w", m.ID, m.Topic, id, err))
	}
	data := m.Payload
	var ce cloudevents.Encoded
	if s.ce.On() {
		var err error
		if ce, err = s.ce.Encode(m, bindingPubSub); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: %w", err))
		}
		data = ce.Body
	}
	attrs := make(map[string]string, len(m.Headers)+len(ce.Headers)+4)
	for k, v := range m.Headers {
		if s.ce.On() && ce.Replaces(k) {
			continue // the event carries it
		}
		if strings.EqualFold(k, AttrID) || strings.EqualFold(k, AttrTopic) || strings.EqualFold(k, AttrKey) {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: header %q is refused: the sink sets the attributes %s, %s and %s itself; rename it", m.ID, k, AttrID, AttrTopic, AttrKey))
		}
		if err := checkAttribute(k, v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: %w", m.ID, err))
		}
		attrs[k] = v
	}
	attrs[AttrID] = m.ID
	attrs[AttrTopic] = m.Topic
	if m.Key != "" {
		if len(m.Key) > maxAttrValue {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: the key has %d bytes, above the %d of a Pub/Sub ordering key and attribute value", m.ID, len(m.Key), maxAttrValue))
		}
		attrs[AttrKey] = m.Key
	}
	for _, a := range ce.Headers {
		if len(a.Value) > maxAttrValue {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: its CloudEvents attribute %s has %d bytes, above the %d of a Pub/Sub attribute value", m.ID, a.Name, len(a.Value), maxAttrValue))
		}
		attrs[a.Name] = a.Value
	}
	if ce.ContentType != "" {
		if len(ce.ContentType) > maxAttrValue {
			return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: its content type has %d bytes, above the %d of a Pub/Sub attribute value", m.ID, len(ce.ContentType), maxAttrValue))
		}
		attrs[AttrContentType] = ce.ContentType
	}
	if len(attrs) > maxAttributes {
		return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: %d headers plus the sink's attributes exceed Pub/Sub's %d attributes", m.ID, len(m.Headers), maxAttributes))
	}
	pm := &pubsub.Message{Data: data, Attributes: attrs, OrderingKey: m.Key}
	size := len(pm.Data) + len(pm.OrderingKey)
	for k, v := range attrs {
		size += len(k) + len(v)
	}
	if size > s.opts.MaxMessageBytes {
		return nil, wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: %d bytes (data %d plus attributes and ordering key) exceed the limit of %d bytes (max_message_bytes)", m.ID, size, len(data), s.opts.MaxMessageBytes))
	}
	return pm, nil
}

// checkAttribute accepts what Pub/Sub accepts as an attribute.
func checkAttribute(k, v string) error {
	switch {
	case k == "":
		return errors.New("a header has an empty name, which a Pub/Sub attribute cannot have")
	case len(k) > maxAttrKey:
		return fmt.Errorf("header name %.40q... has %d bytes, above the %d of a Pub/Sub attribute name", k, len(k), maxAttrKey)
	case strings.HasPrefix(strings.ToLower(k), "goog"):
		return fmt.Errorf("header name %q: Pub/Sub reserves attribute names starting with \"goog\"", k)
	case len(v) > maxAttrValue:
		return fmt.Errorf("header %q has a %d-byte value, above the %d of a Pub/Sub attribute value", k, len(v), maxAttrValue)
	}
	return nil
}

// checkTopicID accepts a Pub/Sub topic ID: 3 to 255 characters, starting
// with a letter, of letters, digits and -_.~+%, not starting with "goog".
func checkTopicID(id string) error {
	if len(id) < 3 || len(id) > 255 {
		return errors.New("a topic ID has 3 to 255 characters")
	}
	c := id[0]
	if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
		return errors.New("a topic ID starts with a letter")
	}
	if strings.HasPrefix(strings.ToLower(id), "goog") {
		return errors.New(`a topic ID does not start with "goog"`)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !isAlnum(c) && strings.IndexByte("-_.~+%", c) < 0 {
			return errors.New("a topic ID has only letters, digits and -_.~+%")
		}
	}
	return nil
}

// classify turns a publish result's error into a relay result.
func (s *Sink) classify(m *wharf.Message, err error, ctx context.Context) error {
	if err == nil {
		return nil
	}
	var paused pubsub.ErrPublishingPaused
	if errors.As(err, &paused) {
		return fmt.Errorf("%w: wharfpubsub: message %s: an earlier message of its ordering key failed (%w)", wharf.ErrNotAttempted, m.ID, err)
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("wharfpubsub: message %s: gave up waiting for its publish result (it may still be stored): %w", m.ID, ctxErr(ctx))
	}
	topic := s.TopicID(m.Topic)
	switch status.Code(err) {
	case codes.InvalidArgument:
		return wharf.Permanent(fmt.Errorf("wharfpubsub: message %s: Pub/Sub refused it: %w", m.ID, err))
	case codes.NotFound:
		return fmt.Errorf("wharfpubsub: message %s: topic %q does not exist in project %s (%w): create it, or fix topic_template; the message is retried until then", m.ID, topic, s.client.Project(), err)
	}
	return fmt.Errorf("wharfpubsub: message %s: publish to topic %q: %w", m.ID, topic, err)
}

// errNotSent marks a message Publish did not send because its context ended.
var errNotSent = errors.New("not sent: the publish was cut short")

func notSent(ctx context.Context) error {
	return fmt.Errorf("wharfpubsub: %w: %w", errNotSent, ctxErr(ctx))
}

func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}

// Ping checks that Pub/Sub answers: it reads the topic last published to
// (the template's topic when it names one), or lists one topic of the
// project when there is none yet. It implements [wharf.Pinger].
func (s *Sink) Ping(ctx context.Context) error {
	s.mu.Lock()
	id := s.last
	s.mu.Unlock()
	if id == "" && s.names.Expand("a") == s.names.Expand("b") {
		id = s.names.Expand("a")
	}
	var err error
	if id != "" {
		_, err = s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/" + s.client.Project() + "/topics/" + id})
	} else {
		it := s.client.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/" + s.client.Project(), PageSize: 1})
		_, err = it.Next()
		if errors.Is(err, iterator.Done) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("wharfpubsub: Pub/Sub does not answer: %w", err)
	}
	return nil
}

// Close stops the sink's publishers, after the publishes in progress
// returned; when Open made the client, it closes it too. Later publishes
// fail.
func (s *Sink) Close() error {
	if s.closing.Swap(true) {
		return nil
	}
	s.inflight.Wait()
	s.mu.Lock()
	s.closed = true
	pubs := s.publishers
	s.publishers = nil
	s.mu.Unlock()
	for _, p := range pubs {
		p.Stop()
	}
	if s.ownsClient {
		return s.client.Close()
	}
	return nil
}

// urlConfig is what a pubsub:// URL says.
type urlConfig struct {
	project  string
	endpoint string
	opts     Options
}

// Open opens the sink a pubsub:// URL names (see the package
// documentation). It is the opener the CLI registers for "pubsub". When the
// template names one topic, Open checks that it exists.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	var copts []option.ClientOption
	if cfg.endpoint != "" {
		copts = append(copts, option.WithEndpoint(cfg.endpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	client, err := pubsub.NewClient(ctx, cfg.project, copts...)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: cannot make the Pub/Sub client: %w", shown, err)
	}
	s, err := New(client, cfg.opts)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	s.ownsClient = true
	if s.names.Expand("a") == s.names.Expand("b") {
		if err := s.Ping(ctx); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
	}
	return s, nil
}

func parseURL(u *url.URL) (urlConfig, error) {
	return parseURLEnv(u, os.Getenv("PUBSUB_EMULATOR_HOST"))
}

// parseURLEnv is parseURL with emulatorHost the value of
// PUBSUB_EMULATOR_HOST.
func parseURLEnv(u *url.URL, emulatorHost string) (urlConfig, error) {
	shown := u.Redacted()
	var cfg urlConfig
	if u.Scheme != "pubsub" {
		return cfg, fmt.Errorf("sink URL %q: wharfpubsub opens pubsub:// URLs", shown)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" || u.User != nil || u.Port() != "" {
		return cfg, fmt.Errorf("sink URL %q: write pubsub://PROJECT?option=value (credentials come from Application Default Credentials)", shown)
	}
	cfg.project = u.Hostname()
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "topic_template":
			cfg.opts.TopicTemplate = v
		case "endpoint":
			if _, port, err := splitHostPort(v); err != nil || port == "" {
				return cfg, fmt.Errorf("sink URL %q: endpoint=%q is not host:port, e.g. 127.0.0.1:8085", shown, v)
			}
			cfg.endpoint = v
		case "publish_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: publish_timeout=%q is not a positive duration such as 30s", shown, v)
			}
			cfg.opts.PublishTimeout = d
		case "max_message_bytes":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1024 || n > defaultMaxBytes {
				return cfg, fmt.Errorf("sink URL %q: max_message_bytes=%q: want a byte count from 1024 to %d", shown, v, defaultMaxBytes)
			}
			cfg.opts.MaxMessageBytes = n
		case "ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			cfg.opts.CloudEvents = v
		case "ce_source":
			cfg.opts.CloudEventsSource = v
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the pubsub sink takes topic_template, endpoint, publish_timeout, max_message_bytes, ce and ce_source", urlmask.Option(u, k), k)
		}
	}
	// An emulator (pstest, gcloud's) takes any project ID, e.g. "test".
	emulator := cfg.endpoint != "" || emulatorHost != ""
	switch {
	case cfg.project == "":
		return cfg, fmt.Errorf("sink URL %q: the project ID is empty: write pubsub://PROJECT (with an emulator any ID will do, e.g. pubsub://test)", shown)
	case !emulator && !validProject(cfg.project):
		return cfg, fmt.Errorf("sink URL %q: the host %q is not a Google Cloud project ID (6 to 30 lowercase letters, digits and hyphens, starting with a letter): write pubsub://PROJECT (an emulator, named by endpoint or PUBSUB_EMULATOR_HOST, takes any ID)", shown, cfg.project)
	}
	if _, err := cloudevents.NewConfig(cfg.opts.CloudEvents, cfg.opts.CloudEventsSource); err != nil {
		return cfg, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, cfg.opts.CloudEvents, cfg.opts.CloudEventsSource, err)
	}
	names, err := wharf.ParseTopicTemplate(cfg.opts.TopicTemplate)
	if err != nil {
		return cfg, fmt.Errorf("sink URL %q: topic_template: %w", shown, err)
	}
	if err := checkTopicID(names.Expand("topic")); err != nil {
		return cfg, fmt.Errorf("sink URL %q: topic_template=%s: %w", shown, cfg.opts.TopicTemplate, err)
	}
	return cfg, nil
}

func splitHostPort(s string) (host, port string, err error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", "", errors.New("no port")
	}
	if _, err := strconv.ParseUint(s[i+1:], 10, 16); err != nil {
		return "", "", err
	}
	return s[:i], s[i+1:], nil
}

// validProject accepts a Google Cloud project ID.
func validProject(p string) bool {
	if len(p) < 6 || len(p) > 30 || p[0] < 'a' || p[0] > 'z' || p[len(p)-1] == '-' {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// isAlnum reports whether c is an ASCII letter or digit.
func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
