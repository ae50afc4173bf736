package envelope

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/wharfhq/wharf"
)

// benchBatch is 1,000 messages with a 200-byte JSON payload, a key and two
// headers: a typical relay batch.
func benchBatch(b *testing.B, payload func(i int) []byte) []*wharf.Message {
	msgs := make([]*wharf.Message, 1000)
	for i := range msgs {
		msgs[i] = &wharf.Message{
			ID: wharf.FormatID(int64(1_000_000+i), 1), Seq: int64(1_000_000 + i),
			Topic:   "orders",
			Key:     fmt.Sprintf("customer-%d", i%97),
			Headers: map[string]string{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "content-type": "application/json"},
			Payload: payload(i),
		}
	}
	return msgs
}

func jsonPayload(i int) []byte {
	p := fmt.Sprintf(`{"order_id":%d,"customer":"c-%d","status":"created","note":"`, i, i%97)
	p += strings.Repeat("x", 200-len(p)-2) + `"}`
	return []byte(p)
}

func batchBytes(msgs []*wharf.Message) int64 {
	var e Encoder
	var n int
	for _, m := range msgs {
		n += len(e.AppendMessage(nil, m, Extra{})) + 1
	}
	return int64(n)
}

// BenchmarkEncode measures encoding one batch into the reused buffer, the
// work Publish does under its lock before the write.
func BenchmarkEncode(b *testing.B) {
	msgs := benchBatch(b, jsonPayload)
	if len(msgs[0].Payload) != 200 {
		b.Fatalf("payload is %d bytes", len(msgs[0].Payload))
	}
	b.SetBytes(batchBytes(msgs))
	benchEncoder(b, msgs)
}

func benchEncoder(b *testing.B, msgs []*wharf.Message) {
	var e Encoder
	var kept []byte
	encode := func() {
		buf := kept[:0]
		for _, m := range msgs {
			buf = e.AppendMessage(buf, m, Extra{})
			buf = append(buf, '\n')
		}
		kept = buf
	}
	encode() // grow the buffers first: steady state is what a relay sees
	b.ReportAllocs()
	for b.Loop() {
		encode()
	}
}

// BenchmarkEncodeBase64 is BenchmarkEncode with 200-byte non-JSON payloads.
func BenchmarkEncodeBase64(b *testing.B) {
	msgs := benchBatch(b, func(i int) []byte {
		p := make([]byte, 200)
		for j := range p {
			p[j] = byte(i + j)
		}
		return p
	})
	b.SetBytes(batchBytes(msgs))
	benchEncoder(b, msgs)
}

// BenchmarkEncodeStdlib is the encoding/json baseline that hand-rolling the
// encoder is meant to beat.
func BenchmarkEncodeStdlib(b *testing.B) {
	type out struct {
		ID      string            `json:"id"`
		Topic   string            `json:"topic"`
		Key     *string           `json:"key"`
		Headers map[string]string `json:"headers"`
		Payload json.RawMessage   `json:"payload"`
	}
	msgs := benchBatch(b, jsonPayload)
	b.SetBytes(batchBytes(msgs))
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		buf = buf[:0]
		for _, m := range msgs {
			line, err := json.Marshal(out{m.ID, m.Topic, &m.Key, m.Headers, m.Payload})
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf, line...), '\n')
		}
	}
}
