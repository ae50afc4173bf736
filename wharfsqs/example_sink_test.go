package wharfsqs_test

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/wharfhq/wharf/wharfsqs"
)

// Send to SQS queues named after the topics. The client is configured as
// usual for the AWS SDK (config.LoadDefaultConfig reads the environment,
// the shared files and the instance role); New makes no request.
func ExampleNew() {
	client := sqs.NewFromConfig(aws.Config{Region: "eu-west-1"})
	sink, err := wharfsqs.New(client, wharfsqs.Options{
		Template: "shop-{{topic|dashes}}", // queue names cannot have dots
		Body:     wharfsqs.BodyRaw,
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	fmt.Println(sink.Queue("orders.paid"))
	// Output:
	// shop-orders-paid
}

// Publish to SNS topics, named by ARN: FIFO topics (".fifo") get the key as
// message group id and the message id as deduplication id.
func ExampleNewSNS() {
	client := sns.NewFromConfig(aws.Config{Region: "eu-west-1"})
	sink, err := wharfsqs.NewSNS(client, wharfsqs.Options{
		Template: "arn:aws:sns:eu-west-1:123456789012:shop-{{topic|dashes}}",
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	fmt.Println(sink.TopicARN("orders.paid"))
	// Output:
	// arn:aws:sns:eu-west-1:123456789012:shop-orders-paid
}
