package wharfmqtt_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/eclipse/paho.golang/paho"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmqtt"
)

// Publish to an MQTT 5 server at QoS 1: a message counts as delivered once
// the server answered with a PUBACK. The id and key travel as user
// properties. In a relay, pass the sink as wharf.Config.Sink; here it is
// called directly, with a subscriber to show what arrives.
func ExampleNew() {
	ctx := context.Background()

	// A subscriber of the application.
	conn, err := net.Dial("tcp", "127.0.0.1:1883")
	if err != nil {
		panic(err)
	}
	received := make(chan *paho.Publish, 1)
	sub := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) { received <- pr.Packet; return true, nil },
	}})
	if _, err := sub.Connect(ctx, &paho.Connect{ClientID: "example-subscriber", CleanStart: true, KeepAlive: 30}); err != nil {
		panic(err)
	}
	defer sub.Disconnect(&paho.Disconnect{}) //nolint:errcheck
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "example-shop/#", QoS: 1}}}); err != nil {
		panic(err)
	}

	server, _ := url.Parse("mqtt://127.0.0.1:1883")
	sink, err := wharfmqtt.New(ctx, wharfmqtt.Options{
		Servers:       []*url.URL{server},
		TopicTemplate: "example-shop/{{topic}}",
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	msgs := []*wharf.Message{{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}}
	if errs := sink.Publish(ctx, msgs); errs != nil { // nil: every message acknowledged
		panic(errors.Join(errs...))
	}

	p := <-received
	fmt.Println(p.Topic, p.Properties.User.Get(wharfmqtt.PropertyMessageID), p.Properties.User.Get(wharfmqtt.PropertyKey), string(p.Payload))
	// Output:
	// example-shop/orders 00000000-0001-8002-a3f1-9c2e4d5b6a70 42 {"order":42}
}
