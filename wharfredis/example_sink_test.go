package wharfredis_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfredis"
)

// Append to Redis Streams: each message becomes an entry (XADD) of the
// stream the template makes of its topic, with fields id, topic, key,
// payload and one "h:<name>" per header. In a relay, pass the sink as
// wharf.Config.Sink; here it is called directly.
func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	defer rdb.Del(ctx, "example-shop:orders")

	sink, err := wharfredis.New(rdb, wharfredis.Options{
		StreamTemplate: "example-shop:{{topic}}",
		MaxLen:         100000,
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	msgs := []*wharf.Message{{ID: "00000000-0001-8002-a3f1-9c2e4d5b6a70", Topic: "orders", Key: "42",
		Headers: map[string]string{"tenant": "acme"}, Payload: []byte(`{"order":42}`)}}
	if errs := sink.Publish(ctx, msgs); errs != nil { // nil: every message acknowledged
		panic(errors.Join(errs...))
	}

	entries, err := rdb.XRange(ctx, "example-shop:orders", "-", "+").Result()
	if err != nil {
		panic(err)
	}
	e := entries[0].Values
	fmt.Println(e[wharfredis.FieldID], e[wharfredis.FieldTopic], e[wharfredis.FieldKey], e[wharfredis.HeaderPrefix+"tenant"], e[wharfredis.FieldPayload])
	// Output:
	// 00000000-0001-8002-a3f1-9c2e4d5b6a70 orders 42 acme {"order":42}
}
