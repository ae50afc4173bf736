package wharfwebhook

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/envelope"
)

// reservedHeaders belong to the connection (the hop-by-hop headers of RFC
// 9110 section 7.6.1, and the proxy ones: the sink uses no proxy) or to the
// framing of the request, which net/http sets.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Expect": true,
}

// credentialHeaders carry credentials. Taken from message data they would let
// whoever fills a message's headers authenticate as someone to the
// destination, or leak a credential meant for another service to it; a
// credential for every request is a static header (wharf_header_<Name>).
// (Proxy-Authorization is a reserved header: the sink uses no proxy.)
var credentialHeaders = map[string]bool{"Authorization": true, "Cookie": true}

// sinkHeader reports whether ck (canonical) is in the namespaces the sink
// sets itself.
func sinkHeader(ck string) bool {
	return strings.HasPrefix(ck, "Webhook-") || strings.HasPrefix(ck, "Wharf-")
}

// messageHeaderProblem says why the message header ck (canonical) cannot be
// an HTTP header in single mode, or "" when it can.
func messageHeaderProblem(ck string) string {
	switch {
	case sinkHeader(ck):
		return "the sink sets the webhook-* and wharf-* headers itself"
	case credentialHeaders[ck]:
		return "a credential must not come from message data (set one for every request with wharf_header_" + ck + ")"
	case reservedHeaders[ck]:
		return "HTTP reserves it for the connection or the framing of the request"
	}
	return ""
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
	if sinkHeader(ck) || reservedHeaders[ck] || ck == "Content-Type" || ck == "User-Agent" {
		return fmt.Errorf("header %q is set by the sink or by HTTP and cannot be configured", k)
	}
	if err := checkHeaderValue(v); err != nil {
		return fmt.Errorf("header %q: %w", k, err) // not the value: it may be a credential
	}
	return nil
}

// singleHeaders returns the headers of m's request in single mode, without
// the webhook-* ones, and its body.
func (s *Sink) singleHeaders(m *wharf.Message) (http.Header, []byte, error) {
	h, err := s.messageHeaders(m)
	if err != nil || !s.ce.On() {
		return h, m.Payload, err
	}
	enc, err := s.ce.Encode(m, cloudevents.HTTP)
	if err != nil {
		return nil, nil, wharf.Permanent(fmt.Errorf("wharfwebhook: %w", err))
	}
	for k := range h {
		if enc.Replaces(k) {
			delete(h, k)
		}
	}
	for _, a := range enc.Headers {
		h.Set(a.Name, a.Value)
	}
	h.Set("Content-Type", enc.ContentType)
	return h, enc.Body, nil
}

// messageHeaders returns the headers of m's request in single mode, without
// the webhook-* ones and CloudEvents.
func (s *Sink) messageHeaders(m *wharf.Message) (http.Header, error) {
	h := make(http.Header, len(m.Headers)+len(s.static)+8)
	ct := ""
	for k, v := range m.Headers {
		if err := checkHeaderName(k); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: %w: rename it, or use wharf_mode=batch, which carries headers in the body", m.ID, err))
		}
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if why := messageHeaderProblem(ck); why != "" {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: header %q cannot be sent as an HTTP header: %s; rename or drop it, or use wharf_mode=batch, which carries headers in the body", m.ID, k, why))
		}
		if err := checkHeaderValue(v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: header %q: %w: HTTP cannot carry it; use wharf_mode=batch, which carries headers in the body", m.ID, k, err))
		}
		switch {
		case s.static[ck] != nil:
		case ck == "Content-Type":
			if _, _, err := mime.ParseMediaType(v); err != nil {
				return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: header %q is not a media type such as application/json: fix it, or use wharf_mode=batch, which carries headers in the body", m.ID, k))
			}
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
			return nil, wharf.Permanent(fmt.Errorf("wharfwebhook: message %s: key %q cannot be the %s header: %w", m.ID, m.Key, HeaderKey, err))
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

func isJSON(p []byte) bool { return envelope.ValidJSON(p) }

// publishSingle sends each ordering key's messages in order, one after the
// other, and the keys concurrently.
func (s *Sink) publishSingle(ctx context.Context, res *results, msgs []*wharf.Message) {
	var chains [][]int
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
	run(len(chains), s.opts.Concurrency, func(c int) {
		for _, i := range chains[c] {
			if res.take(ctx, i) {
				res.set(i, s.sendOne(ctx, msgs[i]))
			}
		}
	})
}

func (s *Sink) sendOne(ctx context.Context, m *wharf.Message) error {
	if err := s.checkTopic(m); err != nil {
		return err
	}
	h, body, err := s.singleHeaders(m)
	if err != nil {
		return err
	}
	raw, shown := s.destination(m.Topic)
	return s.post(ctx, "message "+m.ID, raw, shown, h, m.ID, body)
}
