// Package cereader decodes CloudEvents from what a broker delivered, for
// tests. It is written from the protocol bindings' reading rules alone and
// shares no code with the encoder (package cloudevents), so a test that
// decodes a sink's output with it checks the encoder against the
// specification rather than against itself:
//
//   - the content mode is structured when the protocol's content type starts
//     with "application/cloudevents" (any case), binary otherwise;
//   - structured: the body is the JSON event format: specversion "1.0", id,
//     source and type required; data is JSON when datacontenttype is a JSON
//     media type, a string's text otherwise; data_base64 is base64 bytes;
//     both present is an error;
//   - binary: the body is the data; attributes come from headers with the
//     binding's prefix (Kafka "ce_", HTTP and NATS "ce-" matched in any case
//     and percent-decoded, AMQP "cloudEvents:" or "cloudEvents_", MQTT 5 user
//     properties named as the attributes); datacontenttype from the
//     protocol's content type (Kafka content-type header, HTTP Content-Type,
//     AMQP content-type property, MQTT Content Type) or, for NATS, from
//     ce-datacontenttype.
//
// Redis Streams has no binding; Redis reads the fields Wharf's Redis sink
// documents (ce_<name>, and a content-type field with the payload field in
// structured mode).
package cereader

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Event is a decoded CloudEvent.
type Event struct {
	// Structured reports the content mode the event came in.
	Structured bool
	// Attrs are the context attributes by name (extensions included), as
	// their canonical strings.
	Attrs map[string]string
	// Data is the event data.
	Data []byte
}

func isStructured(ct string) bool {
	return len(ct) >= len("application/cloudevents") && strings.EqualFold(ct[:len("application/cloudevents")], "application/cloudevents")
}

// check applies the core specification's rules on required attributes.
func (e *Event) check() error {
	if e.Attrs["specversion"] != "1.0" {
		return fmt.Errorf("specversion %q, want 1.0", e.Attrs["specversion"])
	}
	for _, k := range []string{"id", "source", "type"} {
		if e.Attrs[k] == "" {
			return fmt.Errorf("required attribute %s is missing or empty", k)
		}
	}
	if t, ok := e.Attrs["time"]; ok {
		if _, err := time.Parse(time.RFC3339Nano, t); err != nil {
			return fmt.Errorf("time %q is not RFC 3339: %w", t, err)
		}
	}
	return nil
}

// JSON decodes one event in the JSON event format.
func JSON(body []byte) (Event, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return Event{}, fmt.Errorf("structured body is not a JSON object: %w", err)
	}
	return fromJSONObject(raw)
}

// JSONBatch decodes a JSON batch (an array of events).
func JSONBatch(body []byte) ([]Event, error) {
	var raws []map[string]json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		return nil, fmt.Errorf("batch body is not a JSON array of objects: %w", err)
	}
	out := make([]Event, len(raws))
	for i, raw := range raws {
		e, err := fromJSONObject(raw)
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		out[i] = e
	}
	return out, nil
}

func fromJSONObject(raw map[string]json.RawMessage) (Event, error) {
	e := Event{Structured: true, Attrs: map[string]string{}}
	data, hasData := raw["data"]
	b64, hasB64 := raw["data_base64"]
	if hasData && hasB64 {
		return e, errors.New("both data and data_base64")
	}
	for k, v := range raw {
		if k == "data" || k == "data_base64" {
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			e.Attrs[k] = s
			continue
		}
		// Integer and Boolean extensions: their canonical string.
		var n json.Number
		if err := json.Unmarshal(v, &n); err == nil {
			e.Attrs[k] = n.String()
			continue
		}
		var b bool
		if err := json.Unmarshal(v, &b); err == nil {
			e.Attrs[k] = strconv.FormatBool(b)
			continue
		}
		return e, fmt.Errorf("attribute %s is not a string, number or boolean: %s", k, v)
	}
	switch {
	case hasB64:
		var s string
		if err := json.Unmarshal(b64, &s); err != nil {
			return e, fmt.Errorf("data_base64 is not a string: %w", err)
		}
		d, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return e, fmt.Errorf("data_base64: %w", err)
		}
		e.Data = d
	case hasData:
		if jsonType(e.Attrs["datacontenttype"]) {
			var buf bytes.Buffer
			if err := json.Compact(&buf, data); err != nil {
				return e, err
			}
			e.Data = buf.Bytes()
		} else {
			var s string
			if err := json.Unmarshal(data, &s); err != nil {
				return e, fmt.Errorf("data of non-JSON type %q is not a string", e.Attrs["datacontenttype"])
			}
			e.Data = []byte(s)
		}
	}
	return e, e.check()
}

func jsonType(ct string) bool {
	if ct == "" {
		return true // the JSON format: absent datacontenttype means JSON
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// percentDecode undoes the HTTP/NATS header value encoding: first a
// double-quoted string's escapes, then one round of percent-decoding,
// refusing invalid UTF-8.
func percentDecode(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		for i := 1; i < len(v)-1; i++ {
			if v[i] == '\\' && i+1 < len(v)-1 {
				i++
			}
			b.WriteByte(v[i])
		}
		v = b.String()
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			out = append(out, v[i])
			continue
		}
		if i+2 >= len(v) {
			return "", fmt.Errorf("truncated percent escape in %q", v)
		}
		n, err := strconv.ParseUint(v[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad percent escape in %q", v)
		}
		out = append(out, byte(n))
		i += 2
	}
	if !utf8.Valid(out) {
		return "", fmt.Errorf("percent-decoded %q is not valid UTF-8", v)
	}
	return string(out), nil
}

// Kafka decodes a Kafka record: its headers (name to value) and value.
func Kafka(headers map[string]string, value []byte) (Event, error) {
	if isStructured(headers["content-type"]) {
		return JSON(value)
	}
	e := Event{Attrs: map[string]string{}, Data: value}
	for k, v := range headers {
		if name, ok := strings.CutPrefix(k, "ce_"); ok {
			e.Attrs[name] = v
		}
	}
	if ct, ok := headers["content-type"]; ok {
		e.Attrs["datacontenttype"] = ct
	}
	return e, e.check()
}

// HTTP decodes an HTTP request's headers and body (one event; see
// JSONBatch for the batched mode).
func HTTP(h http.Header, body []byte) (Event, error) {
	ct := h.Get("Content-Type")
	if isStructured(ct) {
		return JSON(body)
	}
	e := Event{Attrs: map[string]string{}, Data: body}
	for k, vs := range h {
		if len(k) > 3 && strings.EqualFold(k[:3], "ce-") {
			v, err := percentDecode(vs[0])
			if err != nil {
				return e, fmt.Errorf("header %s: %w", k, err)
			}
			e.Attrs[strings.ToLower(k[3:])] = v
		}
	}
	if ct != "" {
		e.Attrs["datacontenttype"] = ct
	}
	return e, e.check()
}

// NATS decodes a NATS message's headers and data.
func NATS(h map[string][]string, data []byte) (Event, error) {
	ct := ""
	for k, vs := range h {
		if strings.EqualFold(k, "Content-Type") {
			ct = vs[0]
		}
	}
	if isStructured(ct) {
		return JSON(data)
	}
	e := Event{Attrs: map[string]string{}, Data: data}
	for k, vs := range h {
		if len(k) > 3 && strings.EqualFold(k[:3], "ce-") {
			v, err := percentDecode(vs[0])
			if err != nil {
				return e, fmt.Errorf("header %s: %w", k, err)
			}
			e.Attrs[strings.ToLower(k[3:])] = v
		}
	}
	return e, e.check()
}

// AMQP decodes a message's application properties (AMQP 0-9-1 headers),
// content-type property and body.
func AMQP(props map[string]any, contentType string, body []byte) (Event, error) {
	if isStructured(contentType) {
		return JSON(body)
	}
	e := Event{Attrs: map[string]string{}, Data: body}
	for k, v := range props {
		name, ok := strings.CutPrefix(k, "cloudEvents:")
		if !ok {
			name, ok = strings.CutPrefix(k, "cloudEvents_")
		}
		if !ok {
			continue
		}
		switch v := v.(type) {
		case string:
			e.Attrs[name] = v
		case time.Time:
			e.Attrs[name] = v.UTC().Format(time.RFC3339Nano)
		case int64:
			e.Attrs[name] = strconv.FormatInt(v, 10)
		case bool:
			e.Attrs[name] = strconv.FormatBool(v)
		default:
			return e, fmt.Errorf("property %s has type %T", k, v)
		}
	}
	if contentType != "" {
		e.Attrs["datacontenttype"] = contentType
	}
	return e, e.check()
}

// MQTT decodes an MQTT 5 PUBLISH: its user properties, Content Type and
// payload. In binary mode every user property is an attribute.
func MQTT(userProps map[string]string, contentType string, payload []byte) (Event, error) {
	if isStructured(contentType) {
		return JSON(payload)
	}
	e := Event{Attrs: map[string]string{}, Data: payload}
	for k, v := range userProps {
		e.Attrs[k] = v
	}
	if contentType != "" {
		e.Attrs["datacontenttype"] = contentType
	}
	return e, e.check()
}

// Redis decodes a stream entry of Wharf's Redis sink.
func Redis(fields map[string]string) (Event, error) {
	if isStructured(fields["content-type"]) {
		return JSON([]byte(fields["payload"]))
	}
	e := Event{Attrs: map[string]string{}, Data: []byte(fields["payload"])}
	for k, v := range fields {
		if name, ok := strings.CutPrefix(k, "ce_"); ok {
			e.Attrs[name] = v
		}
	}
	return e, e.check()
}
