package wharfamqp_test

// Code of docs/sinks/rabbitmq.md: the doc pastes these lines, so change both.
// Compiled by go test; the sink's behaviour is tested in this package.

import (
	amqp "github.com/rabbitmq/amqp091-go"
)

// Your store of processed ids, and your handling of a message.
func seen(id string) bool                   { return false }
func markSeen(id string)                    {}
func handle(topic, key string, body []byte) {}

// consume reads the queue "billing" and skips redeliveries by message-id.
func consume(ch *amqp.Channel) error {
	deliveries, err := ch.Consume("billing", "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for d := range deliveries {
		if seen(d.MessageId) { // your store of processed ids
			_ = d.Ack(false)
			continue
		}
		key, _ := d.Headers["wharf-key"].(string)
		handle(d.Type, key, d.Body) // d.Type is the wharf topic
		markSeen(d.MessageId)
		_ = d.Ack(false)
	}
	return nil
}

var _ = consume
