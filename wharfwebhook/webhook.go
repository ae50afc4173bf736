// Package wharfwebhook is the HTTP webhook sink of Wharf: it POSTs messages to
// an http:// or https:// endpoint, signed as Standard Webhooks
// (https://www.standardwebhooks.com/). docs/sinks/webhook.md is the full
// description; this is its summary.
//
// A [Sink] acknowledges a message only once the endpoint answered 2xx. Every
// request carries the Standard Webhooks headers: webhook-id, webhook-timestamp
// (unix seconds) and, when a secret is configured, webhook-signature ("v1,"
// and the base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>"
// keyed with the secret). It also carries wharf-topic, and wharf-key for a
// message with a key.
//
// # Modes
//
// In single mode (the default) each message is one POST whose body is the
// payload, byte for byte, and whose webhook-id is the message id
// ([wharf.Message.ID], a UUID, the same on every redelivery and unique beyond
// one outbox). Its content-type is the message's content-type header when it
// has one (a valid media type), else application/json when the payload is
// valid JSON, else application/octet-stream; the other message headers are
// sent as HTTP headers (names are case-insensitive in HTTP, so receivers may
// see them in another case). A message header that would carry a credential
// or change how HTTP frames the request (Authorization, Proxy-Authorization,
// Cookie, Host, Content-Length, the hop-by-hop headers), or that the sink sets
// itself (webhook-*, wharf-*), fails the message permanently, whatever its
// case; batch mode carries such headers in the body.
//
// In batch mode each POST carries up to batch_size messages of one topic as a
// JSON array, content-type application/json:
//
//	[{"id":"00000000-0000-802a-b5c1-7a0e9d4f3c21","seq":42,"topic":"orders",
//	  "key":"k1","headers":{"a":"b"},"payload":{"n":1},
//	  "created_at":"2025-01-02T03:04:05.123456Z","attempt":1}, ...]
//
// id is the message id (a string), seq its position in the outbox (a number,
// increasing in enqueue order). The payload is embedded as JSON when it is
// valid UTF-8 JSON; anything else is a base64 string (standard encoding)
// marked with "payload_encoding":"base64". key is null for a message without
// a key, headers is {} for a message without headers, created_at is absent
// when unknown. The webhook-id of a batch POST is "batch_" and 32 hex digits
// of the SHA-256 of its elements' ids: the same for the same messages,
// different for any other. Receivers should deduplicate on the elements' ids.
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
//
//   - wharf_batch_size: the most messages per batch POST (batch mode only),
//     1 to 10000. Defaults to 100.
//
//   - wharf_concurrency: the most requests in flight per sink, 1 to 1024.
//     Defaults to 16.
//
//   - wharf_timeout: the limit on each request, response included, e.g. "5s".
//     Defaults to 10s.
//
//   - wharf_secret_env: the name of an environment variable holding the
//     Standard Webhooks secret, "whsec_" followed by the base64 key (the
//     prefix is optional). Defaults to none: requests are not signed.
//
//   - wharf_secret_file: the path of a file holding the secret instead
//     (surrounding white space is ignored).
//
//   - wharf_allow_private: "true" to allow loopback, private, link-local and
//     other non-public destinations (see below). Defaults to "false".
//
//   - wharf_permanent_status: the answers that dead-letter a message at once,
//     as comma-separated status codes from 400 to 599 (e.g. "400,410,422"),
//     or "none"; every other failing status is then retried. Defaults to the
//     set described under Results.
//
//   - wharf_header_<Name>: a header sent with every request, e.g.
//     wharf_header_Authorization=Bearer%20abc. Repeatable. The sink never
//     shows these values in errors.
//
//   - wharf_tls_ca (https only): a PEM file of the CA certificates to verify
//     the destination with, instead of the system's roots; wharf_tls_cert and
//     wharf_tls_key: a client certificate and its key (mutual TLS).
//
//   - wharf_ce: "binary" or "structured" to send every message as a
//     CloudEvent (see CloudEvents). Defaults to none.
//
//   - wharf_ce_source: the CloudEvents source attribute. Defaults to
//     "/wharf".
//
// The secret itself is not accepted in the URL (wharf_secret=...), because
// URLs end up in shell histories, process lists and logs.
//
// Open checks the URL, and that the destination is not private, but does not
// contact it. The sink ignores HTTP_PROXY and HTTPS_PROXY.
//
// # CloudEvents
//
// With wharf_ce=binary (single mode only) each POST follows the CloudEvents
// HTTP binding's binary mode: the body is the payload, every attribute is an
// HTTP header "ce-<name>" with its value percent-encoded (ce-specversion
// "1.0", ce-id the message id, ce-source, ce-type the wharf topic,
// ce-subject the key, absent without one, ce-time the enqueue time,
// ce-traceparent and ce-tracestate from the message's trace context
// headers) and datacontenttype is Content-Type. With wharf_ce=structured the
// body is the JSON event and Content-Type is "application/cloudevents+json;
// charset=UTF-8"; in batch mode the body is the JSON batch format, an array
// of events, with Content-Type "application/cloudevents-batch+json;
// charset=UTF-8". The webhook-* and wharf-* headers are sent in both modes,
// the signature covering the body actually sent.
//
// # Secrets in URLs
//
// Many webhook URLs are credentials: Slack, Discord, Teams and Zapier carry
// the token in the path, Azure Functions (?code=) and SAS URLs (?sig=) in the
// query. The errors of the sink, which the relay logs and stores as a
// message's last error, therefore show the destination only as [RedactURL]
// does: scheme://host, the first path segment when it has at most 12
// characters, "…" for every later one (the topic stays readable where
// {{topic}} stands), "?…" for any query, and no user info. The start of a
// failed response's body, quoted in the error, has the hidden parts of the
// URL, the static header values and the secret cut out too, in case the
// server echoes the request.
//
// # Destinations
//
// Unless wharf_allow_private=true, the sink refuses to connect to loopback
// (127/8, ::1), private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
// (169.254/16 with the cloud metadata endpoints, fe80::/10), carrier-grade NAT
// (100.64/10), unspecified (0/8, ::), multicast and reserved addresses,
// local-use NAT64 (64:ff9b:1::/48), IPv4-translated (::ffff:0:0:0/96) and
// IPv4-compatible (::/96) addresses, and the IPv4-mapped, NAT64 (64:ff9b::/96)
// and 6to4 (2002::/16) forms of refused IPv4 addresses. The check is made on
// the address of every connection as it is dialled, so a name that resolves to
// such an address later (DNS rebinding) is refused too; such a message fails
// permanently. Open also checks an IP literal host and what the host resolves
// to, for an early error. A host written as an IPv4 address in another form
// than four decimal numbers (2130706433, 0177.0.0.1, 0x7f.1) is refused
// whatever wharf_allow_private says: resolvers disagree on what it means.
//
// # Results
//
// 2xx acknowledges. 401, 403, 404, 408, 409, 421, 423, 425, 429 and 5xx are
// retried with the relay's backoff, or after the delay of a Retry-After
// header (seconds or an HTTP date, at most an hour) when there is one: a
// credential being rotated or an endpoint being deployed must not
// dead-letter a backlog within seconds. Every other 4xx (400, 410, 413, 415,
// 422, ...) fails permanently (the relay dead-letters the message at once),
// with the status and the first 200 bytes of the response in the error;
// wharf_permanent_status (Options.PermanentStatus) replaces that set.
// Redirects are not followed: 3xx fails permanently, naming the new location
// (redacted), so that the operator puts the final address in the URL (a
// redirected POST may turn into a GET or leave for another host). Network
// errors and timeouts are retried.
//
// # Ordering and concurrency
//
// In single mode, messages of different ordering keys
// ([wharf.Message.OrderingKey]) are sent concurrently (up to
// wharf_concurrency requests per sink), messages of one ordering key one
// after the other in Seq order, and unkeyed messages all concurrently. Once a
// message fails, the later messages of its ordering key in the batch are
// reported with [wharf.ErrNotAttempted] and not sent. In batch mode the sink
// groups an ordering key's messages into as few POSTs as it can; when they
// span several POSTs (more than batch_size of them, or several topics with
// Config.OrderAcrossTopics), those POSTs are sent one after the other, and
// once one fails the key's later messages are not sent. Other POSTs go out
// concurrently. Once the context of Publish is done no further request is
// started: the messages not sent yet are reported with an error that matches
// [wharf.ErrNotAttempted] and wraps the context's error.
package wharfwebhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
)

// TopicPlaceholder is replaced by the path-escaped wharf topic in the
// destination URL's path.
const TopicPlaceholder = wharf.TopicPlaceholder

// The headers the sink sets on every request (HTTP header names are
// case-insensitive).
const (
	// HeaderID is the Standard Webhooks message id: the wharf message id in
	// single mode, "batch_" and 32 hex digits derived from the messages' ids
	// in batch mode.
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
	// minPermanentStatus and maxPermanentStatus bound the codes
	// Options.PermanentStatus takes: 2xx acknowledges and 3xx is always
	// permanent (redirects are not followed), so only errors can be chosen.
	minPermanentStatus = 400
	maxPermanentStatus = 599
)

// retriedClientErrors are the 4xx answers retried by default: they describe
// the destination's state (a credential being rotated, a route not deployed
// yet, a lock, a conflict with a request in flight), not the message, and
// tend to go away. 408 and 429 ask for a retry outright.
var retriedClientErrors = []int{
	http.StatusUnauthorized,       // 401
	http.StatusForbidden,          // 403
	http.StatusNotFound,           // 404
	http.StatusRequestTimeout,     // 408
	http.StatusConflict,           // 409
	http.StatusMisdirectedRequest, // 421
	http.StatusLocked,             // 423
	http.StatusTooEarly,           // 425
	http.StatusTooManyRequests,    // 429
}

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
	// the sink sets (content-type, user-agent, webhook-*, wharf-*) nor those
	// HTTP reserves (Host, Content-Length, hop-by-hop headers), and take
	// precedence over message headers of the same name.
	Headers map[string]string
	// AllowPrivate allows connecting to loopback, private, link-local and
	// other non-public addresses. Defaults to false.
	AllowPrivate bool
	// PermanentStatus lists the HTTP status codes, 400 to 599, that fail a
	// message permanently; every other failing status is retried. nil keeps
	// the default: every 4xx but 401, 403, 404, 408, 409, 421, 423, 425 and
	// 429. A non-nil empty slice retries every failing status.
	PermanentStatus []int
	// TLSConfig, when set, is the TLS client configuration (custom roots,
	// client certificates). Defaults to the system roots.
	TLSConfig *tls.Config
	// CloudEvents sends every message as a CloudEvent: "binary" (single
	// mode only) or "structured" (see the package documentation). Defaults
	// to "" (none).
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute, a
	// URI-reference. Defaults to "/wharf".
	CloudEventsSource string
}

// Sink is a [wharf.Sink] that POSTs messages to an HTTP endpoint. It is safe
// for concurrent use.
type Sink struct {
	opts       Options
	head       string   // scheme://[userinfo@]host
	pathParts  []string // the escaped path split at TopicPlaceholder
	query      string   // "?raw query", or ""
	shownHead  string   // scheme://host, for errors
	shownParts []string // the redacted path split at TopicPlaceholder, for errors
	scrub      *strings.Replacer
	key        []byte // the HMAC key; nil when unsigned
	static     http.Header
	ce         cloudevents.Config
	permanent  [maxPermanentStatus - minPermanentStatus + 1]bool
	transport  *http.Transport
	client     *http.Client
	sem        chan struct{}
	closed     atomic.Bool
	closeOnce  sync.Once
}

var _ wharf.Sink = (*Sink)(nil)

// New returns a sink POSTing to opts.URL. It checks the options, and that an
// IP literal host is allowed, but does not contact the destination.
func New(opts Options) (*Sink, error) { return newSink(opts, nil) }

// newSink is New with the resolver the sink dials through (nil: the
// system's), so that tests can serve their own DNS answers.
func newSink(opts Options, resolver *net.Resolver) (*Sink, error) {
	u, err := url.Parse(opts.URL)
	if err != nil {
		return nil, errors.New("wharfwebhook: Options.URL is malformed: want http://host/path or https://host/path")
	}
	if err := checkDestination(u); err != nil {
		return nil, fmt.Errorf("wharfwebhook: Options.URL %q: %w", redactURL(u), err)
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
	ce, err := cloudevents.NewConfig(opts.CloudEvents, opts.CloudEventsSource)
	if err != nil {
		return nil, fmt.Errorf("wharfwebhook: Options.CloudEvents: %w", err)
	}
	if ce.Mode == cloudevents.Binary && opts.Mode == ModeBatch {
		return nil, errors.New("wharfwebhook: Options.CloudEvents binary needs single mode: one request cannot carry several events' headers; use structured, which batches as application/cloudevents-batch+json")
	}
	s := &Sink{opts: opts, sem: make(chan struct{}, opts.Concurrency), ce: ce}
	if opts.PermanentStatus == nil {
		for c := minPermanentStatus; c < 500; c++ {
			s.permanent[c-minPermanentStatus] = !slices.Contains(retriedClientErrors, c)
		}
	}
	for _, c := range opts.PermanentStatus {
		if c < minPermanentStatus || c > maxPermanentStatus {
			return nil, fmt.Errorf("wharfwebhook: Options.PermanentStatus: %d is not an error status: want codes from %d to %d", c, minPermanentStatus, maxPermanentStatus)
		}
		s.permanent[c-minPermanentStatus] = true
	}
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
				return nil, fmt.Errorf("wharfwebhook: Options.URL %q: %s is %s: set Options.AllowPrivate to send there", redactURL(u), u.Hostname(), why)
			}
		}
	}

	s.head = u.Scheme + "://"
	if u.User != nil {
		s.head += u.User.String() + "@"
	}
	s.head += u.Host
	tmpl := templatePath(u)
	s.pathParts = splitTemplate(tmpl)
	if u.RawQuery != "" {
		s.query = "?" + u.RawQuery
	}
	s.shownHead = u.Scheme + "://" + u.Host
	s.shownParts = splitTemplate(redactPath(tmpl))
	s.scrub = newScrubber(u, tmpl, opts.Headers, opts.Secret)

	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second, Resolver: resolver}
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

// Publish sends msgs and waits for every answer, each bounded by the
// timeout, or for ctx to end. See the package documentation for ordering and
// results.
func (s *Sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	res := &results{r: wharf.NewResults(msgs), msgs: msgs}
	switch {
	case s.closed.Load():
		res.r.FailRest(errors.New("wharfwebhook: the sink is closed"))
	case ctx.Err() != nil:
		res.r.FailRest(notSent(ctx, ""))
	case s.opts.Mode == ModeBatch:
		s.publishBatch(ctx, res, msgs)
	default:
		s.publishSingle(ctx, res, msgs)
	}
	return res.r.Errors()
}

// results is a [wharf.Results] shared by the goroutines of one Publish.
type results struct {
	mu   sync.Mutex
	r    *wharf.Results
	msgs []*wharf.Message
}

// take reports whether message i is to be sent: not blocked by an earlier
// failure of its ordering key, and ctx not done (else it records why not).
func (r *results) take(ctx context.Context, i int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.r.Done(i) || r.r.Blocked(i) {
		return false
	}
	if ctx.Err() != nil {
		r.r.Set(i, notSent(ctx, "message "+r.msgs[i].ID))
		return false
	}
	return true
}

func (r *results) set(i int, err error) {
	r.mu.Lock()
	r.r.Set(i, err)
	r.mu.Unlock()
}

// notSentError is the result of a message the sink did not send because the
// context of Publish ended first (the relay's lease of it ended, or the relay
// stops). It is retried, and costs no attempt: it matches
// [wharf.ErrNotAttempted].
type notSentError struct {
	what  string
	cause error
}

func notSent(ctx context.Context, what string) error {
	return &notSentError{what: what, cause: ctx.Err()}
}

func (e *notSentError) Error() string {
	if e.what == "" {
		return "wharfwebhook: not sent, the publish was cancelled: " + e.cause.Error()
	}
	return "wharfwebhook: " + e.what + ": not sent, the publish was cancelled: " + e.cause.Error()
}

func (e *notSentError) Unwrap() error { return e.cause }

// Is makes the error match wharf.ErrNotAttempted, so that the relay counts no
// attempt for a message that was never sent.
func (e *notSentError) Is(target error) bool {
	return target == wharf.ErrNotAttempted //nolint:errorlint // identity is what Is decides
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

// post sends one request, holding a slot of the concurrency limit, and
// classifies the outcome. what names the message(s) in errors.
func (s *Sink) post(ctx context.Context, what, raw, shown string, h http.Header, id string, body []byte) error {
	// A done ctx wins over a free slot: select picks at random among ready
	// cases, and no request may start once the publish was cancelled.
	if ctx.Err() != nil {
		return notSent(ctx, what)
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return notSent(ctx, what)
	}
	defer func() {
		<-s.sem
		if s.closed.Load() {
			s.transport.CloseIdleConnections() // this request's, back after Close
		}
	}()
	if ctx.Err() != nil {
		return notSent(ctx, what)
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, raw, bytes.NewReader(body))
	if err != nil {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: cannot make a request to %s: %w", what, shown, s.urlFree(err)))
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
	err = s.classify(resp, what, raw, shown)
	// Drain so that the connection goes back to the pool. A body that fails
	// or takes too long changes nothing: the status is the answer.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	return err
}

// urlFree strips the *url.Error of err, which repeats the whole URL (path
// and query included), and cuts the URL's secrets out of what remains.
func (s *Sink) urlFree(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if t := err.Error(); s.scrub.Replace(t) != t {
		return errors.New(s.scrub.Replace(t))
	}
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
	return fmt.Errorf("wharfwebhook: %s: POST %s: %w", what, shown, s.urlFree(err))
}

// classify turns a response into a result; it reads the start of the body of
// a failure for the error.
func (s *Sink) classify(resp *http.Response, what, raw, shown string) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	if code >= 300 && code < 400 {
		loc := "an unparsable location"
		if u, err := url.Parse(resp.Header.Get("Location")); err == nil {
			if base, err := url.Parse(raw); err == nil {
				u = base.ResolveReference(u)
			}
			loc = redactURL(u)
		}
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: POST %s: %s to %q: the sink follows no redirects; put the final address in the sink URL", what, shown, resp.Status, loc))
	}
	snippet := ""
	if b, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes)); len(b) > 0 {
		snippet = fmt.Sprintf(": %q", s.scrub.Replace(string(b)))
	}
	err := fmt.Errorf("wharfwebhook: %s: POST %s: %s%s", what, shown, resp.Status, snippet)
	if code < minPermanentStatus || code > maxPermanentStatus {
		return wharf.Permanent(err) // not an HTTP status: a broken server
	}
	if s.permanent[code-minPermanentStatus] {
		return wharf.Permanent(err)
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		return wharf.RetryAfter(d, err)
	}
	return err
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
