package wharfkafka_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfkafka"
)

// Produce to Kafka with an idempotent producer: a message counts as
// delivered once every in-sync replica has it. The key is the record key,
// so a key's messages stay in one partition, in order. Here the brokers are
// an in-process fake cluster (kfake); in a relay, pass the sink as
// wharf.Config.Sink.
func ExampleNew() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "shop.orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	sink, err := wharfkafka.New(wharfkafka.Options{
		Brokers:       cluster.ListenAddrs(),
		TopicTemplate: "shop.{{topic}}",
		Compression:   "zstd",
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	msgs := []*wharf.Message{{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}}
	if errs := sink.Publish(ctx, msgs); errs != nil { // nil: every record acknowledged
		panic(errors.Join(errs...))
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("shop.orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer consumer.Close()
	r := consumer.PollFetches(ctx).Records()[0]
	fmt.Println(r.Topic, string(r.Key), string(r.Value))
	// Output:
	// shop.orders 42 {"order":42}
}
