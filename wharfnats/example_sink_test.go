package wharfnats_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfnats"
)

// Publish to JetStream: each message goes to the subject the template makes
// of its topic, with its id in Nats-Msg-Id and its key in Wharf-Key, and
// counts as delivered once the stream stored it. In a relay, pass the sink
// as wharf.Config.Sink; here it is called directly.
func ExampleNew() {
	ctx := context.Background()
	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EXAMPLE_SHOP", Subjects: []string{"example-shop.>"}})
	if err != nil {
		panic(err)
	}
	defer js.DeleteStream(ctx, "EXAMPLE_SHOP") //nolint:errcheck

	sink, err := wharfnats.New(nc, wharfnats.Options{
		SubjectTemplate: "example-shop.{{topic}}",
		Stream:          "EXAMPLE_SHOP",
		AckTimeout:      5 * time.Second,
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	msgs := []*wharf.Message{{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}}
	if errs := sink.Publish(ctx, msgs); errs != nil { // nil: every message acknowledged
		panic(errors.Join(errs...))
	}

	stored, err := stream.GetLastMsgForSubject(ctx, "example-shop.orders")
	if err != nil {
		panic(err)
	}
	fmt.Println(stored.Subject, stored.Header.Get(wharfnats.HeaderKey), stored.Header.Get(jetstream.MsgIDHeader), string(stored.Data))
	// Output:
	// example-shop.orders 42 00000000-0001-8002-a3f1-9c2e4d5b6a70 {"order":42}
}
