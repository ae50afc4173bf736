package textsink

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/wharfhq/wharf"
)

// benchBatch is 1,000 messages with a 200-byte JSON payload, a key and two
// headers: a typical relay batch.
func benchBatch(b *testing.B) []*wharf.Message {
	msgs := make([]*wharf.Message, 1000)
	pad := make([]byte, 160)
	for i := range pad {
		pad[i] = 'p'
	}
	for i := range msgs {
		msgs[i] = &wharf.Message{
			ID: wharf.FormatID(int64(1_000_000+i), 1), Seq: int64(1_000_000 + i),
			Topic: "orders", Key: fmt.Sprintf("k%d", i%100),
			Headers: map[string]string{"trace-id": "abc", "source": "bench"},
			Payload: fmt.Appendf(nil, `{"id":%d,"pad":"%s"}`, i, pad),
		}
	}
	return msgs
}

// BenchmarkPublishDiscard measures a whole Publish to a writer that costs
// nothing.
func BenchmarkPublishDiscard(b *testing.B) {
	msgs := benchBatch(b)
	s := NewWriter(io.Discard, nil)
	ctx := context.Background()
	s.Publish(ctx, msgs) // grow the buffers first
	b.ReportAllocs()
	for b.Loop() {
		if errs := s.Publish(ctx, msgs); errs != nil {
			b.Fatal(errs[0])
		}
	}
}
