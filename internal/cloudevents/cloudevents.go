// Package cloudevents turns a [wharf.Message] into a CloudEvent (CloudEvents
// 1.0) in the form each protocol binding prescribes. Every sink that offers
// CloudEvents uses it, so the attributes are the same whatever the broker:
//
//   - specversion: "1.0".
//   - id: the message id ([wharf.Message.ID]), the same on every redelivery
//     and unique beyond one outbox, so (source, id) is unique too.
//   - source: [Config.Source], "/wharf" by default.
//   - type: the wharf topic.
//   - subject: the message key; absent for a message without a key.
//   - time: the enqueue time ([wharf.Message.CreatedAt], set by the database;
//     in WAL mode the commit time), RFC 3339 in UTC; absent when unknown.
//   - datacontenttype: the message's content-type header (any case) when it
//     has one, else "application/json" when the payload is valid UTF-8 JSON,
//     else "application/octet-stream".
//   - traceparent and tracestate: the W3C trace context the message carries
//     in its headers of those names (any case), as the CloudEvents
//     distributed-tracing extension; absent when the message has none.
//
// # Use from a sink
//
// A sink parses its options once with [NewConfig] (or [ParseMode] for a URL
// option) and, for each message, calls [Config.Encode] with its protocol's
// [Binding]. The [Encoded] result says what to send: the body (the payload
// itself in binary mode, the JSON event in structured mode), the native
// content type to set (empty when the binding has none to set), and the
// attribute headers (properties, fields) to add. The sink keeps sending the
// message's other headers natively as it always does, except those for which
// [Encoded.Replaces] reports true: the encoding owns the content type and its
// attribute header names.
//
//	enc, err := s.ce.Encode(m, cloudevents.Kafka)
//	if err != nil { return wharf.Permanent(err) }
//	for k, v := range m.Headers { if !enc.Replaces(k) { add(k, v) } }
//	for _, a := range enc.Headers { add(a.Name, a.Value) }
//	if enc.ContentType != "" { add("content-type", enc.ContentType) }
//	send(enc.Body)
//
// A binding for a new protocol is a [Binding] value: the prefix of its
// attribute headers, whether datacontenttype travels as an attribute header
// rather than the protocol's own content type, and whether header values are
// percent-encoded. [AppendBatch] writes the JSON batch format (HTTP's batched
// content mode).
//
// The package has no dependency beyond the standard library and wharf: the
// bindings are a handful of naming rules, and a JSON event is one
// encoding/json call.
package cloudevents

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/envelope"
)

// Mode is how a sink sends CloudEvents.
type Mode uint8

// The content modes.
const (
	// Off sends messages as the sink always did, without CloudEvents.
	Off Mode = iota
	// Binary keeps the payload as the body and carries the attributes in
	// the protocol's headers (properties, fields).
	Binary
	// Structured sends the whole event, attributes and data, as one JSON
	// document (the JSON event format) in the body.
	Structured
)

// String returns the mode's URL spelling ("" for Off).
func (m Mode) String() string {
	switch m {
	case Binary:
		return "binary"
	case Structured:
		return "structured"
	}
	return ""
}

// ParseMode reads a mode as sinks take it in options: "binary",
// "structured", or "" (and "off", "none") for none.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "off", "none":
		return Off, nil
	case "binary":
		return Binary, nil
	case "structured":
		return Structured, nil
	}
	return Off, fmt.Errorf("%q is not a CloudEvents content mode: want binary or structured (or leave it out for none)", s)
}

const (
	// SpecVersion is the CloudEvents version of every event.
	SpecVersion = "1.0"
	// ContentType is the media type of a structured-mode body.
	ContentType = "application/cloudevents+json; charset=UTF-8"
	// BatchContentType is the media type of a JSON batch ([AppendBatch]).
	BatchContentType = "application/cloudevents-batch+json; charset=UTF-8"
	// DefaultSource is the source attribute when none is configured. The
	// id alone is unique beyond one outbox, so any source keeps (source, id)
	// unique; set one that names the producing service.
	DefaultSource = "/wharf"
)

// Config is a sink's CloudEvents setting. The zero value is Off.
type Config struct {
	// Mode is the content mode.
	Mode Mode
	// Source is the source attribute (a URI-reference). Defaults to
	// DefaultSource.
	Source string
}

// NewConfig checks a sink's options: mode as [ParseMode] takes it and
// source, a non-empty URI-reference ("" means DefaultSource). A source
// without a mode is refused, since it would do nothing.
func NewConfig(mode, source string) (Config, error) {
	m, err := ParseMode(mode)
	if err != nil {
		return Config{}, err
	}
	if m == Off && source != "" {
		return Config{}, errors.New("a CloudEvents source is set but no content mode: add the mode (binary or structured) or drop the source")
	}
	if err := CheckSource(source); err != nil {
		return Config{}, err
	}
	if source == "" {
		source = DefaultSource
	}
	return Config{Mode: m, Source: source}, nil
}

// CheckSource accepts "" (the default) and any URI-reference without white
// space or control characters.
func CheckSource(source string) error {
	if source == "" {
		return nil
	}
	for _, r := range source {
		if r <= ' ' || (r >= 0x7f && r <= 0x9f) {
			return fmt.Errorf("CloudEvents source %q has white space or a control character: write a URI-reference such as /orders-service", source)
		}
	}
	if _, err := url.Parse(source); err != nil {
		return fmt.Errorf("CloudEvents source %q is not a URI-reference (such as /orders-service or urn:example:orders): %w", source, err)
	}
	return nil
}

// ErrorText is the fixed text of the errors of [ParseMode], [NewConfig] and
// [CheckSource], for URL fuzz tests that must tell a leaked password from
// words the errors always hold.
const ErrorText = "is not a CloudEvents content mode: want binary or structured (or leave it out for none) a CloudEvents source is set but no content mode: add the mode (binary or structured) or drop the source CloudEvents source has white space or a control character: write a URI-reference such as /orders-service is not a URI-reference (such as /orders-service or urn:example:orders) ce= ce_source= wharf_ce= wharf_ce_source="

// On reports whether CloudEvents are sent.
func (c Config) On() bool { return c.Mode != Off }

// Binding is how one protocol carries the attributes in binary mode.
type Binding struct {
	// Name names the binding in errors.
	Name string
	// Prefix is put before each attribute name to make its header name.
	Prefix string
	// ContentTypeAttr carries datacontenttype as a prefixed attribute
	// header (NATS, Redis) instead of the protocol's own content type.
	ContentTypeAttr bool
	// PercentEncode percent-encodes header values as the HTTP and NATS
	// bindings require: space, '"', '%' and every byte outside printable
	// ASCII become %XY.
	PercentEncode bool
}

// The bindings of the protocols Wharf's sinks speak.
var (
	// Kafka: headers ce_<name>, datacontenttype in the content-type header.
	Kafka = Binding{Name: "Kafka", Prefix: "ce_"}
	// HTTP: headers ce-<name>, percent-encoded, datacontenttype in
	// Content-Type.
	HTTP = Binding{Name: "HTTP", Prefix: "ce-", PercentEncode: true}
	// AMQP: application properties (AMQP 0-9-1 headers) cloudEvents:<name>,
	// datacontenttype in the content-type property.
	AMQP = Binding{Name: "AMQP", Prefix: "cloudEvents:"}
	// NATS: headers ce-<name>, percent-encoded, datacontenttype as
	// ce-datacontenttype.
	NATS = Binding{Name: "NATS", Prefix: "ce-", ContentTypeAttr: true, PercentEncode: true}
	// MQTT (5.0): user properties named as the attributes themselves,
	// datacontenttype in the PUBLISH Content Type property.
	MQTT = Binding{Name: "MQTT"}
	// Redis Streams has no CloudEvents binding; Wharf's sink uses entry
	// fields ce_<name>, datacontenttype as ce_datacontenttype, as the NATS
	// binding does; in structured mode a content-type field holds
	// ContentType.
	Redis = Binding{Name: "Redis", Prefix: "ce_", ContentTypeAttr: true}
)

// Attr is one attribute header: its name (prefix included) and value.
type Attr struct {
	Name, Value string
}

// Event is the CloudEvent of one message.
type Event struct {
	ID, Source, Type, Subject string
	// Time is the enqueue time; zero when unknown.
	Time                    time.Time
	DataContentType         string
	TraceParent, TraceState string
	Data                    []byte
}

// Event returns the event of m.
func (c Config) Event(m *wharf.Message) Event {
	e := Event{ID: m.ID, Source: c.Source, Type: m.Topic, Subject: m.Key, Time: m.CreatedAt, Data: m.Payload}
	if e.Source == "" {
		e.Source = DefaultSource
	}
	for k, v := range m.Headers {
		switch {
		case strings.EqualFold(k, "content-type"):
			e.DataContentType = v
		case strings.EqualFold(k, "traceparent"):
			e.TraceParent = v
		case strings.EqualFold(k, "tracestate"):
			e.TraceState = v
		}
	}
	if e.DataContentType == "" {
		if envelope.ValidJSON(m.Payload) {
			e.DataContentType = "application/json"
		} else {
			e.DataContentType = "application/octet-stream"
		}
	}
	return e
}

// timeText is the canonical string of a Timestamp attribute.
func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// attrs returns the event's attributes in a fixed order, datacontenttype
// included, absent optional ones left out.
func (e *Event) attrs() []Attr {
	a := make([]Attr, 0, 9)
	a = append(a, Attr{"specversion", SpecVersion}, Attr{"id", e.ID}, Attr{"source", e.Source}, Attr{"type", e.Type})
	if e.Subject != "" {
		a = append(a, Attr{"subject", e.Subject})
	}
	if !e.Time.IsZero() {
		a = append(a, Attr{"time", timeText(e.Time)})
	}
	a = append(a, Attr{"datacontenttype", e.DataContentType})
	if e.TraceParent != "" {
		a = append(a, Attr{"traceparent", e.TraceParent})
	}
	if e.TraceState != "" {
		a = append(a, Attr{"tracestate", e.TraceState})
	}
	return a
}

// check refuses what a CloudEvents String cannot hold: invalid UTF-8 and
// the control characters U+0000-U+001F and U+007F-U+009F.
func (e *Event) check() error {
	for _, a := range e.attrs() {
		if !utf8.ValidString(a.Value) {
			return fmt.Errorf("its %s attribute %q is not valid UTF-8, which a CloudEvents attribute must be", a.Name, a.Value)
		}
		for _, r := range a.Value {
			if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
				return fmt.Errorf("its %s attribute %q has a control character, which a CloudEvents attribute must not", a.Name, a.Value)
			}
		}
	}
	if _, _, err := mime.ParseMediaType(e.DataContentType); err != nil {
		return fmt.Errorf("its content-type header %q is not a media type such as application/json", e.DataContentType)
	}
	return nil
}

// Encoded is what a sink sends for one message.
type Encoded struct {
	// Body is the message body: the payload in binary mode, the JSON event
	// in structured mode.
	Body []byte
	// ContentType is the value of the protocol's own content type (header,
	// property): datacontenttype in binary mode, [ContentType] in structured
	// mode. It is "" in binary mode over a binding that carries
	// datacontenttype as an attribute header (NATS, Redis): the sink then
	// sets no content type, and a content type present marks structured
	// mode to readers.
	ContentType string
	// Headers are the attribute headers to add, in a fixed order.
	Headers []Attr
}

// Replaces reports whether the message header name must not be sent as it
// is, because the encoding sets it: a content-type header (any case), whose
// value became datacontenttype, and a header named as one of the encoding's
// attribute headers (any case). Sinks drop such headers.
func (e *Encoded) Replaces(name string) bool {
	if strings.EqualFold(name, "content-type") {
		return true
	}
	for _, a := range e.Headers {
		if strings.EqualFold(name, a.Name) {
			return true
		}
	}
	return false
}

// Encode returns what to send for m over binding b in c's mode. It fails
// when the message cannot be a CloudEvent (an attribute with invalid UTF-8
// or a control character, a content-type header that is no media type):
// the sink should fail such a message permanently. Encode must not be
// called with c Off.
func (c Config) Encode(m *wharf.Message, b Binding) (Encoded, error) {
	ev := c.Event(m)
	if err := ev.check(); err != nil {
		return Encoded{}, fmt.Errorf("message %s cannot be sent as a CloudEvent: %w", m.ID, err)
	}
	if c.Mode == Structured {
		body, err := ev.MarshalJSON()
		if err != nil {
			return Encoded{}, fmt.Errorf("message %s: %w", m.ID, err)
		}
		return Encoded{Body: body, ContentType: ContentType}, nil
	}
	enc := Encoded{Body: m.Payload}
	for _, a := range ev.attrs() {
		if a.Name == "datacontenttype" && !b.ContentTypeAttr {
			enc.ContentType = a.Value
			continue
		}
		v := a.Value
		if b.PercentEncode {
			v = PercentEncode(v)
		}
		enc.Headers = append(enc.Headers, Attr{b.Prefix + a.Name, v})
	}
	return enc, nil
}

// PercentEncode encodes a header value as the HTTP and NATS bindings
// require: each byte of space, '"', '%' and of every character outside
// printable ASCII becomes %XY (upper-case hex).
func PercentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func needsEscape(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c >= 0x7f }

// wire is the JSON event format of an Event.
type wire struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time,omitempty"`
	DataContentType string          `json:"datacontenttype"`
	TraceParent     string          `json:"traceparent,omitempty"`
	TraceState      string          `json:"tracestate,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      []byte          `json:"data_base64,omitempty"`
}

// MarshalJSON returns the event in the JSON event format. The data is
// embedded as JSON when datacontenttype is a JSON media type
// (application/json, text/json or a +json suffix) and the payload is valid
// UTF-8 JSON; otherwise it is data_base64. An empty payload gives no data.
func (e Event) MarshalJSON() ([]byte, error) {
	w := wire{
		SpecVersion: SpecVersion, ID: e.ID, Source: e.Source, Type: e.Type, Subject: e.Subject,
		DataContentType: e.DataContentType, TraceParent: e.TraceParent, TraceState: e.TraceState,
	}
	if !e.Time.IsZero() {
		w.Time = timeText(e.Time)
	}
	switch {
	case len(e.Data) == 0:
	case isJSONType(e.DataContentType) && envelope.ValidJSON(e.Data):
		w.Data = e.Data
	default:
		w.DataBase64 = e.Data
	}
	return json.Marshal(w)
}

// isJSONType reports whether the media type ct is JSON.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// AppendBatch appends the events of msgs as a JSON array (the JSON batch
// format, media type BatchContentType).
func (c Config) AppendBatch(dst []byte, msgs []*wharf.Message) ([]byte, error) {
	dst = append(dst, '[')
	for i, m := range msgs {
		ev := c.Event(m)
		if err := ev.check(); err != nil {
			return nil, fmt.Errorf("message %s cannot be sent as a CloudEvent: %w", m.ID, err)
		}
		b, err := ev.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("message %s: %w", m.ID, err)
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, b...)
	}
	return append(dst, ']'), nil
}
