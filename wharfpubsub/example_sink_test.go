package wharfpubsub_test

import (
	"context"
	"fmt"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"

	"github.com/wharfhq/wharf/wharfpubsub"
)

// Publish to Google Cloud Pub/Sub topics named after the wharf topics, with
// ordering keys from the message keys. The client is made as usual
// (pubsub.NewClient uses Application Default Credentials; here none, so
// the example runs anywhere); New makes no request.
func ExampleNew() {
	ctx := context.Background()
	client, err := pubsub.NewClient(ctx, "my-project", option.WithoutAuthentication(), option.WithEndpoint("127.0.0.1:8085"))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	sink, err := wharfpubsub.New(client, wharfpubsub.Options{TopicTemplate: "shop-{{topic}}"})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	fmt.Println(sink.TopicID("orders"))
	// Output:
	// shop-orders
}
