package wharfwebhook

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/tlsfiles"
)

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
	if h := u.Hostname(); ambiguousIPv4(h) {
		return fmt.Errorf("host %q is an IPv4 address written in another form than four decimal numbers (as 2130706433 or 0177.0.0.1 are), which resolvers and browsers read differently: write it as dotted decimal, such as 127.0.0.1, or use a host name", h)
	}
	if q, err := url.QueryUnescape(u.RawQuery); err == nil && strings.Contains(q, TopicPlaceholder) {
		return fmt.Errorf("%s is only replaced in the path, not in the query", TopicPlaceholder)
	}
	return nil
}

// ambiguousIPv4 reports whether host ends in a number, as a URL host that
// browsers (the WHATWG URL standard) and the C library's resolver read as an
// IPv4 address, although it is not the dotted decimal form every reader
// agrees on: 2130706433, 0177.0.0.1, 0x7f.1 and 127.1 all mean 127.0.0.1 to
// some and a host name or nothing to others.
func ambiguousIPv4(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return false
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	last := labels[len(labels)-1]
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") || strings.HasPrefix(last, "0X") {
		last = last[2:]
		return strings.Trim(last, "0123456789abcdefABCDEF") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

// hidden stands for the parts of a URL that errors and logs do not show.
const hidden = "…"

// maxShownSegment is the longest first path segment RedactURL shows: a
// longer one may itself be a token (https://hook.example.com/<token>).
const maxShownSegment = 12

// RedactURL returns a webhook URL in a form safe for logs and errors, since
// many webhook URLs are credentials: Slack, Discord, Teams and Zapier carry
// the token in the path, Azure Functions (?code=) and SAS URLs (?sig=) in the
// query. It keeps the scheme, the host and port, and the first path segment
// when it has at most 12 characters; every later non-empty segment becomes
// "…" (except {{topic}}), a query becomes "?…" (names too: a bare ?TOKEN is
// a credential), and user info and fragment are dropped:
//
//	https://hooks.slack.com/services/T000/B000/XXXX  →  https://hooks.slack.com/services/…/…/…
//	https://fn.azurewebsites.net/api/hook?code=XXXX  →  https://fn.azurewebsites.net/api/…?…
//	https://user:pass@example.com/in/{{topic}}       →  https://example.com/in/{{topic}}
//
// The host is shown as is: do not put a credential in the host name. A URL
// that does not parse gives "(unparsable URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "(unparsable URL)"
	}
	return redactURL(u)
}

func redactURL(u *url.URL) string {
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteByte(':')
	}
	if u.Opaque != "" {
		b.WriteString(hidden)
		return b.String()
	}
	if u.Host != "" {
		b.WriteString("//")
		b.WriteString(u.Host)
	}
	b.WriteString(redactPath(templatePath(u)))
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?" + hidden)
	}
	return b.String()
}

// redactPath hides every segment of the escaped path p but the first (when
// at most maxShownSegment long), empty ones and TopicPlaceholder.
func redactPath(p string) string {
	segs := strings.Split(p, "/")
	first := 0
	if len(segs) > 1 && segs[0] == "" {
		first = 1 // an absolute path
	}
	for i := first; i < len(segs); i++ {
		sg := segs[i]
		switch {
		case sg == "" || sg == TopicPlaceholder:
		case i == first && len(sg) <= maxShownSegment:
		default:
			segs[i] = hidden
		}
	}
	return strings.Join(segs, "/")
}

// minScrubbed is the shortest secret newScrubber cuts out of response bodies:
// shorter strings are too likely to be ordinary words of the body.
const minScrubbed = 4

// newScrubber returns a replacer that cuts out of a text (the start of a
// response body, an error) every part of the destination that redactURL
// hides, the static header values and the secret, in case the server
// echoes the request.
func newScrubber(u *url.URL, tmpl string, headers map[string]string, secret string) *strings.Replacer {
	var secrets []string
	add := func(v string) {
		secrets = append(secrets, v)
		if d, err := url.PathUnescape(v); err == nil {
			secrets = append(secrets, d)
		}
		if d, err := url.QueryUnescape(v); err == nil {
			secrets = append(secrets, d)
		}
	}
	if u.User != nil {
		add(u.User.Username())
		p, _ := u.User.Password()
		add(p)
		// net/http sends the user info as Basic authorization.
		add(base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + p)))
	}
	shown := strings.Split(redactPath(tmpl), "/")
	for i, sg := range strings.Split(tmpl, "/") {
		if shown[i] == hidden {
			for part := range strings.SplitSeq(sg, TopicPlaceholder) {
				add(part)
			}
		}
	}
	for part := range strings.SplitSeq(u.RawQuery, "&") {
		if k, v, ok := strings.Cut(part, "="); ok {
			add(v)
		} else {
			add(k)
		}
	}
	for _, v := range headers {
		add(v)
		for f := range strings.FieldsSeq(v) {
			add(f)
		}
	}
	if secret != "" {
		add(strings.TrimSpace(secret))
		add(strings.TrimPrefix(strings.TrimSpace(secret), secretPrefix))
	}
	secrets = slices.DeleteFunc(secrets, func(v string) bool { return len(v) < minScrubbed })
	// Longest first: the replacer tries the pairs in order at each position,
	// so a secret that contains another is cut out whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	secrets = slices.Compact(secrets)
	pairs := make([]string, 0, 2*len(secrets))
	for _, v := range secrets {
		pairs = append(pairs, v, hidden)
	}
	return strings.NewReplacer(pairs...)
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
	shown = s.shownParts[0]
	if len(s.shownParts) > 1 {
		shown = strings.Join(s.shownParts, url.PathEscape(topic))
	}
	return s.head + path + s.query, s.shownHead + shown
}

// checkTopic rejects a topic the URL cannot carry.
func (s *Sink) checkTopic(m *wharf.Message) error {
	if len(s.pathParts) > 1 && (m.Topic == "" || m.Topic == "." || m.Topic == "..") {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: topic %q cannot be a URL path segment", m.ID, m.Topic))
	}
	if err := checkHeaderValue(m.Topic); err != nil {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: topic %q cannot be the %s header: %w", m.ID, m.Topic, HeaderTopic, err))
	}
	return nil
}

// urlConfig is what an http(s):// sink URL says.
type urlConfig struct {
	opts       Options
	secretEnv  string
	secretFile string
	tls        tlsfiles.Files
}

// optionNames lists the options for errors.
const optionNames = "wharf_mode, wharf_batch_size, wharf_concurrency, wharf_timeout, wharf_secret_env, wharf_secret_file, wharf_allow_private, wharf_permanent_status, wharf_ce, wharf_ce_source, wharf_header_<Name> and, with https, wharf_tls_ca, wharf_tls_cert and wharf_tls_key"

// tlsNames are the URL options naming the TLS files.
var tlsNames = [3]string{"wharf_tls_ca", "wharf_tls_cert", "wharf_tls_key"}

// Open opens the sink an http:// or https:// URL names (see the package
// documentation for its options). It is the opener the CLI registers for
// the "http" and "https" schemes. It does not contact the destination.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) { return openSink(ctx, u, nil) }

// openSink is Open with the resolver the sink uses (nil: the system's).
func openSink(ctx context.Context, u *url.URL, resolver *net.Resolver) (*Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	shown := redactURL(u)
	if err := cfg.loadSecret(shown); err != nil {
		return nil, err
	}
	if cfg.tls.Any() {
		tc, err := cfg.tls.Config(tlsNames)
		if err != nil {
			return nil, fmt.Errorf("sink URL %q: %w", shown, err)
		}
		cfg.opts.TLSConfig = tc
	}
	if !cfg.opts.AllowPrivate {
		if err := checkResolved(ctx, resolver, u.Hostname(), shown); err != nil {
			return nil, err
		}
	}
	s, err := newSink(cfg.opts, resolver)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q: %w", shown, err)
	}
	return s, nil
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
	shown := redactURL(u)
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
			return cfg, fmt.Errorf("sink URL %q: the value of %s is malformed percent-encoding", shown, strings.Trim(strconv.Quote(k), `"`))
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
		case name == "wharf_permanent_status":
			codes, err := parseStatusList(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: wharf_permanent_status=%q: %w", shown, v, err)
			}
			cfg.opts.PermanentStatus = codes
		case name == "wharf_ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: wharf_ce=%q: want binary or structured", shown, v)
			}
			cfg.opts.CloudEvents = v
		case name == "wharf_ce_source":
			cfg.opts.CloudEventsSource = v
		case name == "wharf_allow_private":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: wharf_allow_private=%q: want true or false", shown, v)
			}
			cfg.opts.AllowPrivate = b
		case name == tlsNames[0] || name == tlsNames[1] || name == tlsNames[2]:
			if u.Scheme != "https" {
				return cfg, fmt.Errorf("sink URL %q: %s is a TLS option: use https://", shown, k)
			}
			cfg.tls.Set(tlsNames, name, v)
		case strings.HasPrefix(name, "wharf_header_"):
			h := k[len("wharf_header_"):]
			if err := checkStaticHeader(h, v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: %q: %w", shown, k, err)
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
	if _, err := cloudevents.NewConfig(cfg.opts.CloudEvents, cfg.opts.CloudEventsSource); err != nil {
		return cfg, fmt.Errorf("sink URL %q: wharf_ce=%s&wharf_ce_source=%s: %w", shown, cfg.opts.CloudEvents, cfg.opts.CloudEventsSource, err)
	}
	if cfg.opts.CloudEvents == "binary" && cfg.opts.Mode == ModeBatch {
		return cfg, fmt.Errorf("sink URL %q: wharf_ce=binary needs wharf_mode=single (one request cannot carry several events' headers): use wharf_ce=structured, which batches as application/cloudevents-batch+json", shown)
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

// parseStatusList reads wharf_permanent_status: comma-separated codes, or
// "none" for an empty (but set) list.
func parseStatusList(v string) ([]int, error) {
	const want = "want comma-separated status codes from 400 to 599, such as 400,410,422, or none to retry every failing status"
	if strings.EqualFold(strings.TrimSpace(v), "none") {
		return []int{}, nil
	}
	codes := []int{}
	for f := range strings.SplitSeq(v, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < minPermanentStatus || c > maxPermanentStatus {
			return nil, errors.New(want)
		}
		codes = append(codes, c)
	}
	return codes, nil
}
