package cli

import (
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfamqp"
	"github.com/wharfhq/wharf/wharfkafka"
	"github.com/wharfhq/wharf/wharfkinesis"
	"github.com/wharfhq/wharf/wharfmqtt"
	"github.com/wharfhq/wharf/wharfnats"
	"github.com/wharfhq/wharf/wharfpubsub"
	"github.com/wharfhq/wharf/wharfredis"
	"github.com/wharfhq/wharf/wharfsqs"
	"github.com/wharfhq/wharf/wharfwebhook"
)

// The broker sinks live in their own packages so a library user who only
// enqueues does not pull in their clients; the CLI offers all of them.
func init() {
	sinkurl.Register("amqp", wharfamqp.Open)
	sinkurl.Register("amqps", wharfamqp.Open)
	sinkurl.Register("kafka", wharfkafka.Open)
	sinkurl.Register("mqtt", wharfmqtt.Open)
	sinkurl.Register("mqtts", wharfmqtt.Open)
	sinkurl.Register("kinesis", wharfkinesis.Open)
	sinkurl.Register("nats", wharfnats.Open)
	sinkurl.Register("pubsub", wharfpubsub.Open)
	sinkurl.Register("redis", wharfredis.Open)
	sinkurl.Register("rediss", wharfredis.Open)
	sinkurl.Register("sqs", wharfsqs.Open)
	sinkurl.Register("sns", wharfsqs.OpenSNS)
	sinkurl.Register("http", wharfwebhook.Open)
	sinkurl.Register("https", wharfwebhook.Open)
}
