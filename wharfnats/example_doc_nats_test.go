package wharfnats_test

// Code of docs/sinks/nats.md: the doc pastes these lines, so change both.
// Compiled by go test; the sink's behaviour is tested in this package.

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Your store of processed ids, and your handling of a message.
func seen(id string) bool                     { return false }
func markSeen(id string)                      {}
func handle(subject, key string, data []byte) {}

// consume reads the stream WHARF and skips redeliveries by Nats-Msg-Id; it
// returns when ctx ends.
func consume(ctx context.Context, js jetstream.JetStream) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, "WHARF", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "wharf.orders.>",
	})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		id := m.Headers().Get("Nats-Msg-Id")
		if !seen(id) { // your store of processed ids
			handle(m.Subject(), m.Headers().Get("Wharf-Key"), m.Data())
			markSeen(id)
		}
		_ = m.Ack()
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	<-ctx.Done()
	return nil
}

var _ = consume
