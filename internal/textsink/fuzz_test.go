package textsink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/wharfhq/wharf"
)

// tornWriter writes at most limit bytes of its first write and fails it,
// then accepts everything: a full disk that recovers.
type tornWriter struct {
	buf    bytes.Buffer
	limit  int
	failed bool
}

func (w *tornWriter) Write(p []byte) (int, error) {
	if !w.failed {
		w.failed = true
		n := min(w.limit, len(p))
		w.buf.Write(p[:n])
		return n, errors.New("disk full")
	}
	return w.buf.Write(p)
}

// outLine is what a reader of the sink's output gets back.
type outLine struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
}

// FuzzPublishLines publishes a batch of fuzzed messages through a writer
// whose first write fails after a fuzzed number of bytes, then publishes it
// again, and checks the sink's output contract: the failed batch is reported
// failed; after it, every line of the retried batch is one valid JSON object
// that reads back as its message (payload bytes, headers, key, topic), in
// order, whatever the torn line before it.
func FuzzPublishLines(f *testing.F) {
	f.Add("orders", "k1", "h", "v", []byte(`{"a":1}`), "t2", "", []byte("\xff\x00bin"), uint16(7), uint8(3))
	f.Add("", "", "", "", []byte{}, "", "", []byte("\n"), uint16(0), uint8(1))
	f.Add("a\nb", "k\u2028", "h\x00", "v\"", []byte("[1,\n2]"), "t", "k", []byte(`"x"`), uint16(500), uint8(5))
	f.Fuzz(func(t *testing.T, topic1, key1, hk, hv string, p1 []byte, topic2, key2 string, p2 []byte, limit uint16, n uint8) {
		n = n%8 + 1
		msgs := make([]*wharf.Message, n)
		for i := range msgs {
			m := &wharf.Message{ID: wharf.FormatID(int64(i), int64(i)), Seq: int64(i), Topic: topic1, Key: key1, Payload: p1, Headers: map[string]string{hk: hv}}
			if i%2 == 1 {
				m.Topic, m.Key, m.Payload, m.Headers = topic2, key2, p2, nil
			}
			msgs[i] = m
		}
		w := &tornWriter{limit: int(limit)}
		s := NewWriter(w, nil)
		errs := s.Publish(context.Background(), msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("failed write: %d errors for %d messages", len(errs), len(msgs))
		}
		for _, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("failed write acknowledged or misreported: %v", err)
			}
		}
		torn := w.buf.Len()
		if errs := s.Publish(context.Background(), msgs); errs != nil {
			t.Fatalf("second Publish: %v", errs)
		}
		out := w.buf.Bytes()[torn:]
		if !bytes.HasSuffix(out, []byte("\n")) {
			t.Fatalf("batch does not end with a newline: %q", out)
		}
		sc := bufio.NewScanner(bytes.NewReader(w.buf.Bytes()))
		sc.Buffer(nil, 1<<20)
		var lines [][]byte
		for sc.Scan() {
			lines = append(lines, bytes.Clone(sc.Bytes()))
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if len(lines) < len(msgs) {
			t.Fatalf("%d lines for %d messages: %q", len(lines), len(msgs), w.buf.Bytes())
		}
		// The last len(msgs) lines are the retried batch, each complete.
		for i, raw := range lines[len(lines)-len(msgs):] {
			m := msgs[i]
			var l outLine
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&l); err != nil {
				t.Fatalf("line %d %q: %v (whole output %q)", i, raw, err, w.buf.Bytes())
			}
			if l.ID != m.ID || l.Seq != m.Seq || l.Topic != readBack(m.Topic) {
				t.Fatalf("line %d %q is not message %d", i, raw, i)
			}
			if (m.Key == "") != (l.Key == nil) || l.Key != nil && *l.Key != readBack(m.Key) {
				t.Fatalf("line %d %q: key %v, want %q", i, raw, l.Key, m.Key)
			}
			if len(m.Headers) != len(l.Headers) || m.Headers != nil && l.Headers[readBack(hk)] != readBack(hv) {
				t.Fatalf("line %d %q: headers %q, want %q", i, raw, l.Headers, m.Headers)
			}
			var got []byte
			if l.PayloadEncoding == "base64" {
				var s string
				if err := json.Unmarshal(l.Payload, &s); err != nil {
					t.Fatal(err)
				}
				got, _ = base64.StdEncoding.DecodeString(s)
				if !bytes.Equal(got, m.Payload) {
					t.Fatalf("line %d: payload %q, want %q", i, got, m.Payload)
				}
				continue
			}
			var a, b any
			if json.Unmarshal(l.Payload, &a) != nil || json.Unmarshal(m.Payload, &b) != nil {
				t.Fatalf("line %d: embedded payload %q of %q is not JSON", i, l.Payload, m.Payload)
			}
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if !bytes.Equal(ja, jb) {
				t.Fatalf("line %d: payload %q reads back as %s, want %s", i, m.Payload, ja, jb)
			}
		}
	})
}

// readBack is s as a JSON reader gets it back (invalid UTF-8 as U+FFFD).
func readBack(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}
