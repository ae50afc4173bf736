package wharfkinesis_test

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/wharfhq/wharf/wharfkinesis"
)

// Write to Kinesis Data Streams named after the topics; the key is the
// partition key, so a key's messages stay in one shard, in order. The client
// is configured as usual for the AWS SDK (config.LoadDefaultConfig); New
// makes no request.
func ExampleNew() {
	client := kinesis.NewFromConfig(aws.Config{Region: "eu-west-1"})
	sink, err := wharfkinesis.New(client, wharfkinesis.Options{
		StreamTemplate: "shop-{{topic}}",
		Format:         wharfkinesis.FormatRaw, // the payload alone, not the JSON envelope
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	fmt.Println(sink.Stream("orders"))
	// Output:
	// shop-orders
}
