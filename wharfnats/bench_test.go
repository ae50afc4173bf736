package wharfnats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// BenchmarkPublish measures the sink's rate into the real JetStream: batches
// of 1,000 messages of 200 bytes over 1,000, 100 or 10 keys, 1 or 4 Publish
// calls in flight, pipelined (the default) and with strict_order=true. Calls
// in flight at once never share a key, as with the relay. The rate is
// reported as msgs/s; BenchmarkDirectPublish is nats.go alone.
func BenchmarkPublish(b *testing.B) {
	for _, mode := range []struct{ name, option string }{{"pipelined", ""}, {"strict_order", "strict_order=true"}} {
		for _, keys := range []int{1000, 100, 10} {
			for _, conc := range []int{1, 4} {
				b.Run(fmt.Sprintf("%s/keys=%d/concurrency=%d", mode.name, keys, conc), func(b *testing.B) {
					_, s := newWorldWith(b, sharedURL, mode.option)
					benchKeyed(b, s, keys, conc)
				})
			}
		}
	}
}

// benchKeyed publishes b.N messages with s in batches of 1,000 over keys keys
// per batch, conc batches at a time; each of the conc publishers has keys of
// its own. The batches are built before the timer starts.
func benchKeyed(b *testing.B, s wharf.Sink, keys, conc int) {
	const batch = 1000
	payload := []byte(strings.Repeat("x", 200))
	queues := make([][][]*wharf.Message, conc)
	seq := time.Now().UnixNano() // ids unique across runs
	for n, left := 0, b.N; left > 0; n, left = n+1, left-batch {
		p := n % conc
		msgs := make([]*wharf.Message, min(batch, left))
		for i := range msgs {
			seq++
			key := fmt.Sprintf("p%d-k%d", p, i%keys)
			msgs[i] = &wharf.Message{ID: wharf.FormatID(seq, rand.Int64()), Seq: seq, Topic: "orders", Key: key, Payload: payload}
		}
		queues[p] = append(queues[p], msgs)
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, q := range queues {
		wg.Go(func() {
			for _, msgs := range q {
				for _, err := range s.Publish(context.Background(), msgs) {
					if err != nil {
						b.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
