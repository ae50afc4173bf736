package wharfamqp_test

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfamqp"
)

// Publish to RabbitMQ with publisher confirms: a message counts as delivered
// once the broker confirmed it, and one no queue takes fails (and is
// retried) unless DropUnroutable is set. Here the default exchange routes
// by queue name. In a relay, pass the sink as wharf.Config.Sink; here it is
// called directly.
func ExampleNew() {
	ctx := context.Background()
	const uri = "amqp://guest:guest@127.0.0.1:5672/"

	// The application's queue, declared by its consumer.
	conn, err := amqp.Dial(uri)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	q, err := ch.QueueDeclare("example-shop.orders", false, true, false, false, nil)
	if err != nil {
		panic(err)
	}

	sink, err := wharfamqp.New(ctx, uri, amqp.Config{}, wharfamqp.Options{
		RoutingKeyTemplate: "example-shop.{{topic}}",
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	msgs := []*wharf.Message{{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}}
	if errs := sink.Publish(ctx, msgs); errs != nil { // nil: every message confirmed
		panic(errors.Join(errs...))
	}

	d, ok, err := ch.Get(q.Name, true)
	if err != nil || !ok {
		panic(fmt.Sprint("no message: ", err))
	}
	fmt.Println(d.RoutingKey, d.MessageId, d.Headers[wharfamqp.HeaderKey], string(d.Body))
	// Output:
	// example-shop.orders 00000000-0001-8002-a3f1-9c2e4d5b6a70 42 {"order":42}
}
