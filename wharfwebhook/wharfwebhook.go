// Package wharfwebhook is the HTTP webhook sink of Wharf: it POSTs messages to
// an http:// or https:// endpoint, signed as Standard Webhooks
// (https://www.standardwebhooks.com/).
//
// A [Sink] acknowledges a message only once the endpoint answered 2xx. Every
// request carries the Standard Webhooks headers: webhook-id (the message id,
// [wharf.Message.MessageID], so a receiver can deduplicate redeliveries),
// webhook-timestamp (unix seconds) and, when a secret is configured,
// webhook-signature ("v1," and the base64 HMAC-SHA256 of
// "<webhook-id>.<webhook-timestamp>.<body>" keyed with the secret). It also
// carries wharf-topic, and wharf-key for a message with a key.
//
// # Modes
//
// In single mode (the default) each message is one POST whose body is the
// payload, byte for byte. Its content-type is the message's content-type
// header when it has one, else application/json when the payload is valid
// JSON, else application/octet-stream; the other message headers are sent as
// HTTP headers (names are case-insensitive in HTTP, so receivers may see them
// in another case).
//
// In batch mode each POST carries up to batch_size messages of one topic as a
// JSON array, content-type application/json:
//
//	[{"id":123,"topic":"orders","key":"k1","headers":{"a":"b"},
//	  "payload":{"n":1},"created_at":"2025-01-02T03:04:05.123456Z","attempt":1}, ...]
//
// The payload is embedded as JSON when it is valid UTF-8 JSON; anything else
// is a base64 string (standard encoding) marked with
// "payload_encoding":"base64". key is null for a message without a key,
// headers is {} for a message without headers, created_at is absent when
// unknown. The webhook-id of a batch POST is
// "<first id>-<last id>-<16 hex digits of SHA-256 over the ids>": the same
// for the same set of messages, different for any other. Receivers should
// deduplicate on the elements' ids.
//
// # URL
//
// From the CLI the sink is opened with the destination URL itself (see
// [Open]):
//
//	https://host[:port]/path[?query][&wharf_option=value...]
//
// "{{topic}}" in the path (also written %7B%7Btopic%7D%7D) is replaced by the
// path-escaped wharf topic, e.g. https://hooks.example.com/in/{{topic}}.
// Query parameters whose name starts with "wharf_" are the sink's options and
// are removed before POSTing; every other query parameter is sent to the
// destination as written. Options, all optional:
//
//   - wharf_mode: "single" (one POST per message) or "batch" (one POST per
//     group of messages). Defaults to "single".
//   - wharf_batch_size: the most messages per batch POST (batch mode only),
//     1 to 10000. Defaults to 100.
//   - wharf_concurrency: the most requests in flight per sink, 1 to 1024.
//     Defaults to 16.
//   - wharf_timeout: the limit on each request, response included, e.g. "5s".
//     Defaults to 10s.
//   - wharf_secret_env: the name of an environment variable holding the
//     Standard Webhooks secret, "whsec_" followed by the base64 key (the
//     prefix is optional). Defaults to none: requests are not signed.
//   - wharf_secret_file: the path of a file holding the secret instead
//     (surrounding white space is ignored).
//   - wharf_allow_private: "true" to allow loopback, private, link-local and
//     other non-public destinations (see below). Defaults to "false".
//   - wharf_header_<Name>: a header sent with every request, e.g.
//     wharf_header_Authorization=Bearer%20abc. Repeatable. The relay hides
//     these values in its logs and the sink never shows them in errors.
//
// The secret itself is not accepted in the URL (wharf_secret=...), because
// URLs end up in shell histories, process lists and logs.
//
// Open checks the URL, and that the destination is not private, but does not
// contact it. The sink ignores HTTP_PROXY and HTTPS_PROXY.
//
// # Destinations
//
// Unless wharf_allow_private=true, the sink refuses to connect to loopback
// (127/8, ::1), private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
// (169.254/16 with the cloud metadata endpoints, fe80::/10), carrier-grade NAT
// (100.64/10), unspecified (0/8, ::), multicast and reserved addresses (and
// IPv4-mapped or NAT64 forms of them). The check is made on the address of
// every connection as it is dialled, so a name that resolves to such an
// address later (DNS rebinding) is refused too; such a message fails
// permanently. Open also checks an IP literal host and what the host
// resolves to, for an early error.
//
// # Results
//
// 2xx acknowledges. 408, 429 and 5xx are retried, after the delay of a
// Retry-After header (seconds or an HTTP date, at most an hour) when there is
// one. Redirects are not followed: 3xx fails permanently, naming the new
// location, so that the operator puts the final address in the URL (a
// redirected POST may turn into a GET or leave for another host). Any other
// status fails permanently (the relay dead-letters the message at once), with
// the status and the first 200 bytes of the response in the error. Network
// errors and timeouts are retried. A header that HTTP cannot carry (a name
// that is not an HTTP token, a control character in a value) or that HTTP
// reserves (Host, Content-Length, Connection...) fails the message
// permanently in single mode.
//
// # Ordering and concurrency
//
// In single mode, messages of different keys are sent concurrently (up to
// wharf_concurrency requests per sink), messages of one key one after the
// other in id order, and unkeyed messages all concurrently. Once a message
// fails, the later messages of its key in the batch are reported with
// [wharf.ErrNotAttempted] and not sent. In batch mode the sink groups a key's
// messages into as few POSTs as it can; when a key's messages span several
// POSTs (more than batch_size of them, or several topics), those POSTs are
// sent one after the other, and once one fails the key's later messages are
// not sent. Other POSTs go out concurrently.
package wharfwebhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
)

// TopicPlaceholder is replaced by the path-escaped wharf topic in the
// destination URL's path.
const TopicPlaceholder = wharf.TopicPlaceholder

// The headers the sink sets on every request (HTTP header names are
// case-insensitive).
const (
	// HeaderID is the Standard Webhooks message id: the wharf message id in
	// single mode, an id derived from the messages' ids in batch mode.
	HeaderID = "webhook-id"
	// HeaderTimestamp is the send time in unix seconds.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature is "v1," and the base64 HMAC-SHA256 signature, sent
	// only when a secret is configured.
	HeaderSignature = "webhook-signature"
	// HeaderTopic is the wharf topic (of every message of a batch POST).
	HeaderTopic = "wharf-topic"
	// HeaderKey is the message key, in single mode, for a message with one.
	HeaderKey = "wharf-key"
)

// Mode selects how messages map to requests.
type Mode string

const (
	// ModeSingle sends one POST per message whose body is the payload.
	ModeSingle Mode = "single"
	// ModeBatch sends one POST per group of messages whose body is a JSON
	// array (see the package documentation).
	ModeBatch Mode = "batch"
)

const (
	defaultBatchSize   = 100
	maxBatchSize       = 10000
	defaultConcurrency = 16
	maxConcurrency     = 1024
	defaultTimeout     = 10 * time.Second
	maxRetryAfter      = time.Hour
	errorBodyBytes     = 200
	drainBytes         = 64 << 10
	lookupTimeout      = 5 * time.Second
	userAgent          = "wharf-webhook"
	secretPrefix       = "whsec_"
)

// Options configures a [Sink] built with [New].
type Options struct {
	// URL is the destination, http:// or https://. TopicPlaceholder in its
	// path is replaced by the path-escaped topic; its query is sent as is
	// (New takes no wharf_ options from it). Required.
	URL string
	// Mode is ModeSingle or ModeBatch. Defaults to ModeSingle.
	Mode Mode
	// BatchSize is the most messages per POST in batch mode. Defaults to 100.
	BatchSize int
	// Concurrency is the most requests in flight, over every Publish call of
	// the sink. Defaults to 16.
	Concurrency int
	// Timeout bounds each request, from dialling to the end of the response.
	// Defaults to 10s.
	Timeout time.Duration
	// Secret is the Standard Webhooks signing secret: "whsec_" followed by
	// the base64 key (the prefix is optional). Defaults to "": requests are
	// not signed.
	Secret string
	// Headers are sent with every request. They cannot replace the headers
	// the sink sets (content-type, webhook-*, wharf-*) nor those HTTP
	// reserves, and take precedence over message headers of the same name.
	Headers map[string]string
	// AllowPrivate allows connecting to loopback, private, link-local and
	// other non-public addresses. Defaults to false.
	AllowPrivate bool
	// TLSConfig, when set, is the TLS client configuration (custom roots,
	// client certificates). Defaults to the system roots.
	TLSConfig *tls.Config
}

// Sink is a [wharf.Sink] that POSTs messages to an HTTP endpoint. It is safe
// for concurrent use.
type Sink struct {
	opts      Options
	head      string   // scheme://[userinfo@]host
	shownHead string   // scheme://host, for errors
	pathParts []string // the escaped path split at TopicPlaceholder
	query     string   // "?raw query", or ""
	key       []byte   // the HMAC key; nil when unsigned
	static    http.Header
	transport *http.Transport
	client    *http.Client
	sem       chan struct{}
	closed    atomic.Bool
	closeOnce sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink POSTing to opts.URL. It checks the options, and that an
// IP literal host is allowed, but does not contact the destination.
func New(opts Options) (*Sink, error) {
	u, err := url.Parse(opts.URL)
	if err != nil {
		return nil, errors.New("wharfwebhook: Options.URL is malformed: want http://host/path or https://host/path")
	}
	if err := checkDestination(u); err != nil {
		return nil, fmt.Errorf("wharfwebhook: Options.URL %q: %w", shownURL(u), err)
	}
	switch opts.Mode {
	case "":
		opts.Mode = ModeSingle
	case ModeSingle, ModeBatch:
	default:
		return nil, fmt.Errorf("wharfwebhook: Options.Mode %q: want %q or %q", opts.Mode, ModeSingle, ModeBatch)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = defaultBatchSize
	}
	if opts.BatchSize < 0 || opts.BatchSize > maxBatchSize {
		return nil, fmt.Errorf("wharfwebhook: Options.BatchSize %d: want 1 to %d", opts.BatchSize, maxBatchSize)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = defaultConcurrency
	}
	if opts.Concurrency < 0 || opts.Concurrency > maxConcurrency {
		return nil, fmt.Errorf("wharfwebhook: Options.Concurrency %d: want 1 to %d", opts.Concurrency, maxConcurrency)
	}
	if opts.Timeout == 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("wharfwebhook: Options.Timeout %s is negative", opts.Timeout)
	}
	s := &Sink{opts: opts, sem: make(chan struct{}, opts.Concurrency)}
	if opts.Secret != "" {
		if s.key, err = decodeSecret(opts.Secret); err != nil {
			return nil, fmt.Errorf("wharfwebhook: Options.Secret %w", err)
		}
	}
	s.static = make(http.Header, len(opts.Headers))
	for k, v := range opts.Headers {
		if err := checkStaticHeader(k, v); err != nil {
			return nil, fmt.Errorf("wharfwebhook: Options.Headers: %w", err)
		}
		s.static.Set(k, v)
	}
	if !opts.AllowPrivate {
		if a, err := netip.ParseAddr(u.Hostname()); err == nil {
			if why, bad := blockedReason(a); bad {
				return nil, fmt.Errorf("wharfwebhook: Options.URL %q: %s is %s: set Options.AllowPrivate to send there", shownURL(u), u.Hostname(), why)
			}
		}
	}

	s.head = u.Scheme + "://"
	if u.User != nil {
		s.head += u.User.String() + "@"
	}
	s.head += u.Host
	s.shownHead = u.Scheme + "://" + u.Host
	s.pathParts = splitTemplate(templatePath(u))
	if u.RawQuery != "" {
		s.query = "?" + u.RawQuery
	}

	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second}
	if !opts.AllowPrivate {
		dialer.Control = guardControl
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.TLSConfig != nil {
		tlsConfig = opts.TLSConfig.Clone()
	}
	s.transport = &http.Transport{
		Proxy:                 nil, // a proxy would dial the destination unchecked
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsConfig,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          max(100, opts.Concurrency),
		MaxIdleConnsPerHost:   opts.Concurrency,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   opts.Timeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	s.client = &http.Client{
		Transport: s.transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return s, nil
}

// checkDestination accepts absolute http and https URLs with a host, and
// TopicPlaceholder in the path only.
func checkDestination(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("want an http:// or https:// URL")
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return errors.New("names no host: write https://host/path")
	}
	if u.Fragment != "" {
		return errors.New("has a #fragment, which is never sent: remove it")
	}
	if q, err := url.QueryUnescape(u.RawQuery); err == nil && strings.Contains(q, TopicPlaceholder) {
		return fmt.Errorf("%s is only replaced in the path, not in the query", TopicPlaceholder)
	}
	return nil
}

// shownURL is u for errors: without password, query (which may hold a
// destination's token) or fragment, and with TopicPlaceholder readable.
func shownURL(u *url.URL) string {
	c := *u
	c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = "", false, "", ""
	if c.User != nil {
		c.User = url.User(c.User.Username())
	}
	return strings.ReplaceAll(c.String(), "%7B%7Btopic%7D%7D", TopicPlaceholder)
}

// templatePath returns u's path as it goes on the wire, with every form of
// TopicPlaceholder written as TopicPlaceholder.
func templatePath(u *url.URL) string {
	p := u.RawPath
	if p == "" {
		p = u.EscapedPath()
	}
	const enc = "%7B%7Btopic%7D%7D"
	var b strings.Builder
	for {
		i := indexFold(p, enc)
		if i < 0 {
			b.WriteString(p)
			return b.String()
		}
		b.WriteString(p[:i])
		b.WriteString(TopicPlaceholder)
		p = p[i+len(enc):]
	}
}

func indexFold(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

func splitTemplate(p string) []string { return strings.Split(p, TopicPlaceholder) }

// destination returns the URL a message of topic goes to, and its form for
// errors.
func (s *Sink) destination(topic string) (raw, shown string) {
	path := s.pathParts[0]
	if len(s.pathParts) > 1 {
		path = strings.Join(s.pathParts, url.PathEscape(topic))
	}
	return s.head + path + s.query, s.shownHead + path
}

// checkTopic rejects a topic the URL cannot carry.
func (s *Sink) checkTopic(m *wharf.Message) error {
	if len(s.pathParts) > 1 && (m.Topic == "" || m.Topic == "." || m.Topic == "..") {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: topic %q cannot be a URL path segment", m.ID, m.Topic))
	}
	if err := checkHeaderValue(m.Topic); err != nil {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: topic %q cannot be the %s header: %w", m.ID, m.Topic, HeaderTopic, err))
	}
	return nil
}

// decodeSecret returns the key of a Standard Webhooks secret. Its errors
// never show the secret.
func decodeSecret(secret string) ([]byte, error) {
	s := strings.TrimPrefix(strings.TrimSpace(secret), secretPrefix)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("is not a Standard Webhooks secret: want whsec_ followed by base64")
	}
	if len(key) == 0 {
		return nil, errors.New("is an empty Standard Webhooks secret: want whsec_ followed by base64")
	}
	return key, nil
}

// sign returns the webhook-signature value of a request: "v1," and the
// base64 HMAC-SHA256, keyed with key, of "<id>.<timestamp>.<body>".
func sign(key []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// ---- headers ----

// ownHeaders are set by the sink; a message header of the same name is
// dropped, since the sink's are authoritative.
var ownHeaders = map[string]bool{
	textproto.CanonicalMIMEHeaderKey(HeaderID):        true,
	textproto.CanonicalMIMEHeaderKey(HeaderTimestamp): true,
	textproto.CanonicalMIMEHeaderKey(HeaderSignature): true,
	textproto.CanonicalMIMEHeaderKey(HeaderTopic):     true,
	textproto.CanonicalMIMEHeaderKey(HeaderKey):       true,
}

// reservedHeaders frame the HTTP message or the connection.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Expect": true,
}

// checkHeaderName accepts an HTTP token (RFC 9110 section 5.6.2).
func checkHeaderName(k string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return fmt.Errorf("header name %q is not an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", k)
	}
	return nil
}

// checkHeaderValue rejects control characters other than tab: CR and LF
// would end the header, the others HTTP does not allow.
func checkHeaderValue(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("control character %q in the value", c)
		}
	}
	return nil
}

func checkStaticHeader(k, v string) error {
	if err := checkHeaderName(k); err != nil {
		return err
	}
	ck := textproto.CanonicalMIMEHeaderKey(k)
	if ownHeaders[ck] || reservedHeaders[ck] || ck == "Content-Type" || ck == "User-Agent" {
		return fmt.Errorf("header %q is set by the sink or by HTTP and cannot be configured", k)
	}
	if err := checkHeaderValue(v); err != nil {
		return fmt.Errorf("header %q: %w", k, err) // not the value: it may be a credential
	}
	return nil
}

// singleHeaders returns the headers of m's request in single mode, without
// the webhook-* ones.
func (s *Sink) singleHeaders(m *wharf.Message) (http.Header, error) {
	h := make(http.Header, len(m.Headers)+len(s.static)+8)
	ct := ""
	for k, v := range m.Headers {
		if err := checkHeaderName(k); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: %w: rename it, or use wharf_mode=batch, which carries headers in the body", m.ID, err))
		}
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if reservedHeaders[ck] {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: header %q is reserved by HTTP: rename it, or use wharf_mode=batch, which carries headers in the body", m.ID, k))
		}
		if err := checkHeaderValue(v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: header %q: %w: HTTP cannot carry it; use wharf_mode=batch, which carries headers in the body", m.ID, k, err))
		}
		switch {
		case ownHeaders[ck], s.static[ck] != nil:
		case ck == "Content-Type":
			ct = v
		default:
			h.Add(ck, v)
		}
	}
	for k, vs := range s.static {
		h[k] = vs
	}
	if ct == "" {
		ct = contentType(m.Payload)
	}
	h.Set("Content-Type", ct)
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", userAgent)
	}
	h.Set(HeaderTopic, m.Topic)
	if m.Key != "" {
		if err := checkHeaderValue(m.Key); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %d: key %q cannot be the %s header: %w", m.ID, m.Key, HeaderKey, err))
		}
		h.Set(HeaderKey, m.Key)
	}
	return h, nil
}

func contentType(p []byte) string {
	if isJSON(p) {
		return "application/json"
	}
	return "application/octet-stream"
}

func isJSON(p []byte) bool { return json.Valid(p) && utf8.Valid(p) }

// ---- publishing ----

// Publish sends msgs and waits for every answer, each bounded by the
// timeout, or for ctx to end. See the package documentation for ordering and
// results.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if s.closed.Load() {
		return wharf.FailAll(len(msgs), errors.New("wharfwebhook: the sink is closed"))
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), fmt.Errorf("wharfwebhook: %w", err))
	}
	var errs []error
	if s.opts.Mode == ModeBatch {
		errs = s.publishBatch(ctx, msgs)
	} else {
		errs = s.publishSingle(ctx, msgs)
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// run calls fn(0..n-1), with at most workers calls at a time, in order of
// their argument.
func run(n, workers int, fn func(i int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// publishSingle sends each key's messages in order, keys concurrently.
func (s *Sink) publishSingle(ctx context.Context, msgs []*wharf.Message) []error {
	errs := make([]error, len(msgs))
	var chains [][]int
	chainOf := map[string]int{}
	for i, m := range msgs {
		if m.Key == "" {
			chains = append(chains, []int{i})
			continue
		}
		c, ok := chainOf[m.Key]
		if !ok {
			c = len(chains)
			chainOf[m.Key] = c
			chains = append(chains, nil)
		}
		chains[c] = append(chains[c], i)
	}
	run(len(chains), s.opts.Concurrency, func(c int) {
		chain := chains[c]
		for j, i := range chain {
			if err := s.sendOne(ctx, msgs[i]); err != nil {
				errs[i] = err
				for _, later := range chain[j+1:] {
					errs[later] = wharf.ErrNotAttempted
				}
				return
			}
		}
	})
	return errs
}

func (s *Sink) sendOne(ctx context.Context, m *wharf.Message) error {
	if err := s.checkTopic(m); err != nil {
		return err
	}
	h, err := s.singleHeaders(m)
	if err != nil {
		return err
	}
	raw, shown := s.destination(m.Topic)
	return s.post(ctx, "message "+m.MessageID(), raw, shown, h, m.MessageID(), m.Payload)
}

// chunk is one batch POST: messages of one topic.
type chunk struct {
	topic  string
	idx    []int // message indices, ascending once packed
	deps   []int // earlier chunks holding earlier messages of a key of this one
	failed map[string]bool
	done   chan struct{}
}

// pack groups the messages not skipped into chunks of at most size messages
// of one topic, so that every key's messages go in chunks of increasing
// index and as few chunks as possible: a key whose run of messages of one
// topic fits in a chunk is not split.
func pack(msgs []*wharf.Message, skip []bool, size int) []*chunk {
	type segment struct {
		topic string
		idx   []int
	}
	type unit struct{ segs []segment }
	var units []*unit
	unitOf := map[string]*unit{}
	for i, m := range msgs {
		if skip[i] {
			continue
		}
		if m.Key == "" {
			units = append(units, &unit{segs: []segment{{m.Topic, []int{i}}}})
			continue
		}
		u := unitOf[m.Key]
		if u == nil {
			u = &unit{}
			unitOf[m.Key] = u
			units = append(units, u)
		}
		if n := len(u.segs); n > 0 && u.segs[n-1].topic == m.Topic {
			u.segs[n-1].idx = append(u.segs[n-1].idx, i)
		} else {
			u.segs = append(u.segs, segment{m.Topic, []int{i}})
		}
	}
	var chunks []*chunk
	open := map[string][]int{} // topic -> chunks with room, ascending
	newChunk := func(topic string) int {
		chunks = append(chunks, &chunk{topic: topic, done: make(chan struct{})})
		c := len(chunks) - 1
		open[topic] = append(open[topic], c)
		return c
	}
	add := func(c int, idx []int) {
		ch := chunks[c]
		ch.idx = append(ch.idx, idx...)
		if len(ch.idx) >= size {
			open[ch.topic] = slices.DeleteFunc(open[ch.topic], func(x int) bool { return x == c })
		}
	}
	for _, u := range units {
		after := -1 // the chunk of the unit's latest message so far
		for _, sg := range u.segs {
			if len(sg.idx) <= size {
				c := -1
				for _, o := range open[sg.topic] {
					if o > after && len(chunks[o].idx)+len(sg.idx) <= size {
						c = o
						break
					}
				}
				if c < 0 {
					c = newChunk(sg.topic)
				}
				add(c, sg.idx)
				after = c
				continue
			}
			for rest := sg.idx; len(rest) > 0; {
				n := min(size, len(rest))
				c := newChunk(sg.topic)
				add(c, rest[:n])
				rest = rest[n:]
				after = c
			}
		}
	}
	last := map[string]int{}
	for c, ch := range chunks {
		slices.Sort(ch.idx)
		for _, i := range ch.idx {
			k := msgs[i].Key
			if k == "" {
				continue
			}
			if p, ok := last[k]; ok && p != c && !slices.Contains(ch.deps, p) {
				ch.deps = append(ch.deps, p)
			}
			last[k] = c
		}
	}
	return chunks
}

// publishBatch sends the messages in chunks, a chunk once every earlier
// chunk sharing a key with it is done.
func (s *Sink) publishBatch(ctx context.Context, msgs []*wharf.Message) []error {
	errs := make([]error, len(msgs))
	skip := make([]bool, len(msgs))
	var blocked map[string]bool
	for i, m := range msgs {
		if m.Key != "" && blocked[m.Key] {
			errs[i], skip[i] = wharf.ErrNotAttempted, true
			continue
		}
		if err := s.checkTopic(m); err != nil {
			errs[i], skip[i] = err, true
			if m.Key != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[m.Key] = true
			}
		}
	}
	chunks := pack(msgs, skip, s.opts.BatchSize)
	run(len(chunks), s.opts.Concurrency, func(c int) {
		ch := chunks[c]
		defer close(ch.done)
		ch.failed = map[string]bool{}
		for _, d := range ch.deps {
			<-chunks[d].done
			for k := range chunks[d].failed {
				ch.failed[k] = true
			}
		}
		send := make([]int, 0, len(ch.idx))
		for _, i := range ch.idx {
			if k := msgs[i].Key; k != "" && ch.failed[k] {
				errs[i] = wharf.ErrNotAttempted
				continue
			}
			send = append(send, i)
		}
		if len(send) == 0 {
			return
		}
		if err := s.sendBatch(ctx, ch.topic, msgs, send); err != nil {
			for _, i := range send {
				errs[i] = err
				if k := msgs[i].Key; k != "" {
					ch.failed[k] = true
				}
			}
		}
	})
	return errs
}

// element is one message in a batch body.
type element struct {
	ID              int64             `json:"id"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding,omitempty"`
	CreatedAt       *time.Time        `json:"created_at,omitempty"`
	Attempt         int               `json:"attempt"`
}

var noHeaders = map[string]string{}

// batchBody encodes the messages idx of msgs as a JSON array.
func batchBody(msgs []*wharf.Message, idx []int) ([]byte, error) {
	els := make([]element, len(idx))
	for j, i := range idx {
		m := msgs[i]
		e := &els[j]
		e.ID, e.Topic, e.Headers, e.Attempt = m.ID, m.Topic, m.Headers, m.Attempt
		if m.Key != "" {
			e.Key = &m.Key
		}
		if e.Headers == nil {
			e.Headers = noHeaders
		}
		if isJSON(m.Payload) {
			e.Payload = m.Payload
		} else {
			p := make([]byte, 0, base64.StdEncoding.EncodedLen(len(m.Payload))+2)
			p = append(p, '"')
			p = base64.StdEncoding.AppendEncode(p, m.Payload)
			e.Payload = append(p, '"')
			e.PayloadEncoding = "base64"
		}
		if !m.CreatedAt.IsZero() {
			t := m.CreatedAt.UTC()
			e.CreatedAt = &t
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(els); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// batchID is the webhook-id of a batch POST: stable for the same messages.
func batchID(msgs []*wharf.Message, idx []int) string {
	h := sha256.New()
	var b []byte
	for _, i := range idx {
		b = strconv.AppendInt(b[:0], msgs[i].ID, 10)
		b = append(b, ',')
		h.Write(b)
	}
	first, last := msgs[idx[0]].ID, msgs[idx[len(idx)-1]].ID
	return fmt.Sprintf("%d-%d-%s", first, last, hex.EncodeToString(h.Sum(nil)[:8]))
}

func (s *Sink) sendBatch(ctx context.Context, topic string, msgs []*wharf.Message, idx []int) error {
	what := fmt.Sprintf("batch of %d messages (ids %d to %d)", len(idx), msgs[idx[0]].ID, msgs[idx[len(idx)-1]].ID)
	body, err := batchBody(msgs, idx)
	if err != nil {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: cannot encode: %w", what, err))
	}
	h := make(http.Header, len(s.static)+6)
	for k, vs := range s.static {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", userAgent)
	h.Set(HeaderTopic, topic)
	raw, shown := s.destination(topic)
	return s.post(ctx, what, raw, shown, h, batchID(msgs, idx), body)
}

// post sends one request, holding a slot of the concurrency limit, and
// classifies the outcome. what names the message(s) in errors.
func (s *Sink) post(ctx context.Context, what, raw, shown string, h http.Header, id string, body []byte) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wharfwebhook: %s: not sent: %w", what, ctx.Err())
	}
	defer func() {
		<-s.sem
		if s.closed.Load() {
			s.transport.CloseIdleConnections() // this request's, back after Close
		}
	}()
	rctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, raw, bytes.NewReader(body))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, query included
		}
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: cannot make a request to %s: %w", what, shown, err))
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	if s.key != nil {
		h.Set(HeaderSignature, sign(s.key, id, ts, body))
	}
	req.Header = h
	resp, err := s.client.Do(req)
	if err != nil {
		return s.transportError(ctx, rctx, what, shown, err)
	}
	defer resp.Body.Close()
	err = classify(resp, what, shown)
	// Drain so that the connection goes back to the pool. A body that fails
	// or takes too long changes nothing: the status is the answer.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	return err
}

// transportError classifies a request that got no response.
func (s *Sink) transportError(ctx, rctx context.Context, what, shown string, err error) error {
	var be *blockedError
	if errors.As(err, &be) {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: %w", what, be))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("wharfwebhook: %s: POST %s: %w", what, shown, ctx.Err())
	}
	if errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("wharfwebhook: %s: POST %s: no answer within %s (wharf_timeout): %w", what, shown, s.opts.Timeout, context.DeadlineExceeded)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // url.Error repeats the URL, query included
	}
	return fmt.Errorf("wharfwebhook: %s: POST %s: %w", what, shown, err)
}

// classify turns a response into a result; it reads the start of the body of
// a failure for the error.
func classify(resp *http.Response, what, shown string) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	snippet := ""
	if b, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes)); len(b) > 0 {
		snippet = fmt.Sprintf(": %q", b)
	}
	switch {
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		err := fmt.Errorf("wharfwebhook: %s: POST %s: %s%s", what, shown, resp.Status, snippet)
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return wharf.RetryAfter(d, err)
		}
		return err
	case code >= 300 && code < 400:
		loc := resp.Header.Get("Location")
		if u, err := url.Parse(loc); err == nil {
			if ref, err := url.Parse(shown); err == nil {
				u = ref.ResolveReference(u)
			}
			loc = shownURL(u)
		} else {
			loc = "an unparsable location"
		}
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: POST %s: %s to %q: the sink follows no redirects; put the final address in the sink URL", what, shown, resp.Status, loc))
	default:
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: POST %s: %s%s", what, shown, resp.Status, snippet))
	}
}

// parseRetryAfter reads a Retry-After value: delta-seconds or an HTTP date,
// capped at maxRetryAfter.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), maxRetryAfter), true
}

// Close closes the sink's idle connections; requests in flight finish.
// Publish fails after Close.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.transport.CloseIdleConnections()
	})
	return nil
}

// ---- destinations ----

var blockedPrefixes = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified (\"this network\") address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT (RFC 6598) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (where cloud metadata services live)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking (RFC 2544) address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("fc00::/7"), "a unique local (RFC 4193) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// blockedReason says why a is not a public destination, if it is not.
func blockedReason(a netip.Addr) (string, bool) {
	a = a.WithZone("").Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	for _, p := range blockedPrefixes {
		if p.prefix.Contains(a) {
			return p.why, true
		}
	}
	return "", false
}

// blockedError is a connection the sink refused to make.
type blockedError struct {
	addr, why string
}

func (e *blockedError) Error() string {
	return fmt.Sprintf("refused to connect to %s, %s: add wharf_allow_private=true (Options.AllowPrivate) to allow private, loopback and link-local destinations", e.addr, e.why)
}

// guardControl runs before every connection the sink dials, on the address
// actually dialled, and refuses non-public ones.
func guardControl(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return &blockedError{address, "an address that cannot be checked"}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return &blockedError{address, "an address that cannot be checked"}
	}
	if why, bad := blockedReason(a); bad {
		return &blockedError{address, why}
	}
	return nil
}

// ---- URLs ----

// urlConfig is what an http(s):// sink URL says.
type urlConfig struct {
	opts       Options
	secretEnv  string
	secretFile string
}

// optionNames lists the options for errors.
const optionNames = "wharf_mode, wharf_batch_size, wharf_concurrency, wharf_timeout, wharf_secret_env, wharf_secret_file, wharf_allow_private and wharf_header_<Name>"

// Open opens the sink an http:// or https:// URL names (see the package
// documentation for its options). It is the opener the CLI registers for
// the "http" and "https" schemes. It does not contact the destination.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := shownURL(u)
	if err := cfg.loadSecret(shown); err != nil {
		return nil, err
	}
	if !cfg.opts.AllowPrivate {
		if err := checkResolved(ctx, u.Hostname(), shown); err != nil {
			return nil, err
		}
	}
	s, err := New(cfg.opts)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	return s, nil
}

// checkResolved refuses a host that is, or resolves only to, non-public
// addresses. A host that does not resolve now is left to the dial-time
// check.
func checkResolved(ctx context.Context, host, shown string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		if why, bad := blockedReason(a); bad {
			return fmt.Errorf("sink URL %q: %s is %s: add wharf_allow_private=true to send to private, loopback and link-local destinations", shown, host, why)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return nil //nolint:nilerr // checked again when dialling
	}
	why := ""
	for _, a := range addrs {
		w, bad := blockedReason(a)
		if !bad {
			return nil
		}
		why = w
	}
	return fmt.Errorf("sink URL %q: host %q resolves to %s, %s: add wharf_allow_private=true to send to private, loopback and link-local destinations", shown, host, addrs[0].WithZone(""), why)
}

// loadSecret reads the secret wharf_secret_env or wharf_secret_file names.
// Its errors never show the secret.
func (cfg *urlConfig) loadSecret(shown string) error {
	var secret, from string
	switch {
	case cfg.secretEnv != "":
		from = fmt.Sprintf("environment variable %s (wharf_secret_env)", cfg.secretEnv)
		v, ok := os.LookupEnv(cfg.secretEnv)
		if !ok || strings.TrimSpace(v) == "" {
			return fmt.Errorf("sink URL %q: %s is not set: set it to the whsec_... secret", shown, from)
		}
		secret = v
	case cfg.secretFile != "":
		from = fmt.Sprintf("file %s (wharf_secret_file)", cfg.secretFile)
		b, err := os.ReadFile(cfg.secretFile)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is in our message already
			}
			return fmt.Errorf("sink URL %q: cannot read the secret from %s: %w", shown, from, err)
		}
		secret = string(b)
	default:
		return nil
	}
	if _, err := decodeSecret(secret); err != nil {
		return fmt.Errorf("sink URL %q: the secret in %s %w", shown, from, err)
	}
	cfg.opts.Secret = strings.TrimSpace(secret)
	return nil
}

func parseURL(u *url.URL) (urlConfig, error) {
	shown := shownURL(u)
	var cfg urlConfig
	if err := checkDestination(u); err != nil {
		return cfg, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	var keep []string
	batchSizeSet := false
	for part := range strings.SplitSeq(u.RawQuery, "&") {
		if part == "" {
			continue
		}
		rawK, rawV, _ := strings.Cut(part, "=")
		k, err := url.QueryUnescape(rawK)
		if err != nil {
			return cfg, fmt.Errorf("sink URL %q: query parameter %q is malformed percent-encoding", shown, rawK)
		}
		name := strings.ToLower(k)
		if !strings.HasPrefix(name, "wharf_") {
			keep = append(keep, part)
			continue
		}
		v, err := url.QueryUnescape(rawV)
		if err != nil {
			return cfg, fmt.Errorf("sink URL %q: the value of %s is malformed percent-encoding", shown, k)
		}
		switch {
		case name == "wharf_mode":
			switch Mode(v) {
			case ModeSingle, ModeBatch:
				cfg.opts.Mode = Mode(v)
			default:
				return cfg, fmt.Errorf("sink URL %q: wharf_mode=%q: want single or batch", shown, v)
			}
		case name == "wharf_batch_size":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxBatchSize {
				return cfg, fmt.Errorf("sink URL %q: wharf_batch_size=%q: want a number of messages from 1 to %d", shown, v, maxBatchSize)
			}
			cfg.opts.BatchSize, batchSizeSet = n, true
		case name == "wharf_concurrency":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxConcurrency {
				return cfg, fmt.Errorf("sink URL %q: wharf_concurrency=%q: want a number of requests from 1 to %d", shown, v, maxConcurrency)
			}
			cfg.opts.Concurrency = n
		case name == "wharf_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: wharf_timeout=%q is not a positive duration such as 10s", shown, v)
			}
			cfg.opts.Timeout = d
		case name == "wharf_secret_env":
			if v == "" {
				return cfg, fmt.Errorf("sink URL %q: wharf_secret_env is empty: write wharf_secret_env=NAME of an environment variable", shown)
			}
			cfg.secretEnv = v
		case name == "wharf_secret_file":
			if v == "" {
				return cfg, fmt.Errorf("sink URL %q: wharf_secret_file is empty: write wharf_secret_file=PATH", shown)
			}
			cfg.secretFile = v
		case name == "wharf_secret" || name == "wharf_signing_secret" || name == "wharf_key":
			return cfg, fmt.Errorf("sink URL %q: %s is not accepted, because URLs end up in logs: put the secret in an environment variable and write wharf_secret_env=NAME, or in a file and write wharf_secret_file=PATH", shown, k)
		case name == "wharf_allow_private":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: wharf_allow_private=%q: want true or false", shown, v)
			}
			cfg.opts.AllowPrivate = b
		case strings.HasPrefix(name, "wharf_header_"):
			h := k[len("wharf_header_"):]
			if err := checkStaticHeader(h, v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: %s: %w", shown, k, err)
			}
			if cfg.opts.Headers == nil {
				cfg.opts.Headers = map[string]string{}
			}
			cfg.opts.Headers[h] = v
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the webhook sink takes %s (other query parameters go to the destination, but wharf_ ones are the sink's)", shown, k, optionNames)
		}
	}
	if cfg.secretEnv != "" && cfg.secretFile != "" {
		return cfg, fmt.Errorf("sink URL %q: wharf_secret_env and wharf_secret_file are both set: keep one", shown)
	}
	if batchSizeSet && cfg.opts.Mode != ModeBatch {
		return cfg, fmt.Errorf("sink URL %q: wharf_batch_size applies to wharf_mode=batch only: add wharf_mode=batch or remove it", shown)
	}
	d := *u
	d.RawQuery = strings.Join(keep, "&")
	d.ForceQuery = false
	cfg.opts.URL = d.String()
	return cfg, nil
}
