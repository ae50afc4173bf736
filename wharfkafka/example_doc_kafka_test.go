package wharfkafka_test

// Code of docs/sinks/kafka.md: the doc pastes these lines, so change both.
// Compiled by go test; the sink's behaviour is tested in this package.

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/wharfhq/wharf/wharfkafka"
)

// newSink builds the sink in Go, with SCRAM-SHA-512 and a TLS
// configuration of your own: any kgo option goes after the Options.
func newSink(password string) (*wharfkafka.Sink, error) {
	return wharfkafka.New(wharfkafka.Options{
		Brokers:         []string{"kafka-1:9093", "kafka-2:9093"},
		TopicTemplate:   "prod.{{topic}}", // "" = "{{topic}}"
		ClientID:        "orders-relay",   // "" = "wharf"
		MaxMessageBytes: 1000012,          // 0 = 1000012
		DeliveryTimeout: 30 * time.Second, // 0 = 30s
		Compression:     "zstd",           // "" = snappy
	},
		kgo.SASL(scram.Auth{User: "wharf", Pass: password}.AsSha512Mechanism()),
		kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}),
	)
}

// Your store of processed ids, and your handling of a message.
func seen(id string) bool                      { return false }
func markSeen(id string)                       {}
func handle(topic, key string, payload []byte) {}

// consume reads the relay's records and skips redeliveries by their
// wharf-message-id header.
func consume(ctx context.Context) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers("kafka-1:9092"),
		kgo.ConsumeTopics("prod.orders.paid"),
		kgo.ConsumerGroup("billing"),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			var id string
			for _, h := range r.Headers {
				if h.Key == "wharf-message-id" {
					id = string(h.Value)
				}
			}
			if !seen(id) { // your store of processed ids
				handle(r.Topic, string(r.Key), r.Value)
				markSeen(id)
			}
		})
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return err
		}
	}
	return ctx.Err()
}

var (
	_ = newSink
	_ = consume
)
