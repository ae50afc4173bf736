package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
)

// decoded is what a reader of an envelope line gets back.
type decoded struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
	CreatedAt       *string           `json:"created_at"`
	Attempt         *int              `json:"attempt"`
}

// asRead is s as a JSON reader gets it back: itself when it is valid UTF-8,
// otherwise with each invalid byte read as U+FFFD (encoding/json's oracle).
func asRead(t *testing.T, s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// FuzzAppendMessage encodes a message made of fuzzed fields and checks that
// the line is one line of valid JSON that encoding/json reads back as the
// same message: id, seq, topic, key (null when empty), headers, the payload
// bytes (embedded JSON as is when one line, compacted otherwise, or base64), created_at and attempt; and
// that ValidJSON and every string's escaping agree with encoding/json.
func FuzzAppendMessage(f *testing.F) {
	f.Add("00000000-0001-8002-a3f1-9c2e4d5b6a70", int64(42), "orders.paid", "42", "a", "b", "trace", "x\ny", []byte(`{"amount": 5,`+"\n"+` "n":[1, 2.5e3, -0, true, null, "é"]}`), int64(1700000000123456789), 3, uint8(3))
	f.Add("", int64(-1), "", "", "", "", "", "", []byte{}, int64(0), 0, uint8(0))
	f.Add("id\u2028", int64(1<<62), "t\xff", "k\x00", "h\"", "v\\", "\xed\xa0\x80", "\u2029", []byte("\xff\xfe not json"), int64(-5), -1, uint8(1))
	f.Add("i", int64(0), "t", "k", "k", "v", "k2", "v2", []byte(`"str\u00e9"`), int64(1), 1, uint8(2))
	f.Add("i", int64(0), "t", "k", "k", "v", "k2", "v2", []byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`), int64(1), 1, uint8(2))
	f.Add("i", int64(0), "t", "k", "", "", "", "", []byte("{\"a\":\"\xff\"}"), int64(1), 1, uint8(0))
	f.Add("i", int64(0), "t", "k", "", "", "", "", []byte(" 1 \r\n"), int64(1), 1, uint8(0))
	f.Add("i", int64(0), "t", "k", "", "", "", "", []byte(`01`), int64(1), 1, uint8(0))
	f.Fuzz(func(t *testing.T, id string, seq int64, topic, key, hk1, hv1, hk2, hv2 string, payload []byte, createdNanos int64, attempt int, flags uint8) {
		m := &wharf.Message{ID: id, Seq: seq, Topic: topic, Key: key, Payload: payload, Attempt: attempt}
		if flags&4 == 0 {
			m.Headers = map[string]string{hk1: hv1}
			if flags&8 == 0 {
				m.Headers[hk2] = hv2
			}
		}
		if createdNanos != 0 {
			m.CreatedAt = time.Unix(0, createdNanos)
		}
		x := Extra{CreatedAt: flags&1 != 0, Attempt: flags&2 != 0}
		var e Encoder
		prefix := []byte("prefix")
		line := e.AppendMessage(prefix, m, x)
		if !bytes.HasPrefix(line, prefix) {
			t.Fatalf("AppendMessage changed what was in dst")
		}
		line = line[len(prefix):]
		if bytes.ContainsAny(line, "\r\n") || bytes.Contains(line, []byte("\u2028")) || bytes.Contains(line, []byte("\u2029")) {
			t.Fatalf("line holds a line break: %q", line)
		}
		if !utf8.Valid(line) || !json.Valid(line) {
			t.Fatalf("line is not valid UTF-8 JSON: %q", line)
		}
		var d decoded
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("decoding %q: %v", line, err)
		}
		if d.ID != asRead(t, id) || d.Seq != seq || d.Topic != asRead(t, topic) {
			t.Fatalf("id/seq/topic: got %q %d %q from %q", d.ID, d.Seq, d.Topic, line)
		}
		switch {
		case key == "" && d.Key != nil:
			t.Fatalf("empty key encoded as %q, want null", *d.Key)
		case key != "" && (d.Key == nil || *d.Key != asRead(t, key)):
			t.Fatalf("key %q decoded as %v from %q", key, d.Key, line)
		}
		want := map[string]string{}
		for k, v := range m.Headers {
			want[asRead(t, k)] = asRead(t, v)
		}
		if len(m.Headers) == len(want) && !maps.Equal(d.Headers, want) {
			t.Fatalf("headers %q decoded as %q from %q", m.Headers, d.Headers, line)
		}
		valid := utf8.Valid(payload) && json.Valid(payload)
		if ValidJSON(payload) != valid {
			t.Fatalf("ValidJSON(%q) = %v, encoding/json says %v", payload, !valid, valid)
		}
		if valid {
			if d.PayloadEncoding != "" {
				t.Fatalf("valid JSON payload %q sent as %s", payload, d.PayloadEncoding)
			}
			var c bytes.Buffer
			if err := json.Compact(&c, payload); err != nil {
				t.Fatal(err)
			}
			// A one-line payload goes out as it is; a multi-line one
			// compacted (its line breaks can only be whitespace).
			wantP := payload
			if bytes.ContainsAny(payload, "\r\n") {
				wantP = c.Bytes()
			}
			// (A reader's raw value starts and ends at the value itself.)
			wantP = bytes.Trim(wantP, " \t\r\n")
			if !bytes.Equal(d.Payload, wantP) {
				t.Fatalf("payload %q embedded as %q, want %q", payload, d.Payload, wantP)
			}
		} else {
			if d.PayloadEncoding != "base64" {
				t.Fatalf("payload %q: payload_encoding %q, want base64", payload, d.PayloadEncoding)
			}
			var s string
			if err := json.Unmarshal(d.Payload, &s); err != nil {
				t.Fatalf("base64 payload is not a string: %q", d.Payload)
			}
			got, err := base64.StdEncoding.DecodeString(s)
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("payload %q came back as %q (%v)", payload, got, err)
			}
		}
		if wantCreated := x.CreatedAt && !m.CreatedAt.IsZero(); wantCreated != (d.CreatedAt != nil) {
			t.Fatalf("created_at present = %v, want %v: %q", d.CreatedAt != nil, wantCreated, line)
		} else if wantCreated {
			ts, err := time.Parse(time.RFC3339Nano, *d.CreatedAt)
			if err != nil || !ts.Equal(m.CreatedAt) || !strings.HasSuffix(*d.CreatedAt, "Z") {
				t.Fatalf("created_at %q, want %s in UTC (%v)", *d.CreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano), err)
			}
		}
		if x.Attempt != (d.Attempt != nil) || x.Attempt && *d.Attempt != attempt {
			t.Fatalf("attempt: got %v, want %d (set %v): %q", d.Attempt, attempt, x.Attempt, line)
		}
		// Strings are escaped exactly as encoding/json escapes them.
		for _, s := range []string{id, topic, key, hk1, hv1} {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(s); err != nil {
				t.Fatal(err)
			}
			if got := string(appendString(nil, s)); got != strings.TrimSuffix(b.String(), "\n") {
				t.Fatalf("appendString(%q) = %s, encoding/json writes %s", s, got, b.String())
			}
		}
		// The same message encodes to the same line, reusing the encoder.
		if again := e.AppendMessage(nil, m, x); !bytes.Equal(again, line) {
			t.Fatalf("second encoding differs:\n%q\n%q", line, again)
		}
	})
}
