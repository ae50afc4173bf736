package wharfmqtt

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// BenchmarkPublish is the sink's rate into the real MQTT server, with a QoS 1
// subscriber reading everything (a server drops a message no subscription
// matches, which would flatter the rate).
func BenchmarkPublish(b *testing.B) {
	wharfsinktest.BenchmarkPublish(b, func(b *testing.B) wharf.Sink {
		w := newWorld(b, sharedAddr())
		return w.openSink(b)
	})
}

// BenchmarkDirectPublish is the same workload with paho alone: every message
// of a batch published with QoS 1 at once, whatever its key, the batch done
// when every PUBACK came. It is the baseline BenchmarkPublish is compared
// with.
func BenchmarkDirectPublish(b *testing.B) {
	wharfsinktest.BenchmarkDirect(b, func(b *testing.B) func(context.Context, []*wharf.Message) error {
		w := newWorld(b, sharedAddr())
		ctx, cancel := context.WithCancel(context.Background())
		cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
			ServerUrls:     []*url.URL{{Scheme: "mqtt", Host: w.addr}},
			KeepAlive:      30,
			ConnectTimeout: 5 * time.Second,
			ClientConfig:   paho.ClientConfig{ClientID: "wharftest-direct-" + randomID()},
		})
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		b.Cleanup(func() {
			dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = cm.Disconnect(dctx)
			dcancel()
			cancel()
			<-cm.Done()
		})
		if err := cm.AwaitConnection(ctx); err != nil {
			b.Fatal(err)
		}
		topic := w.prefix + "/" + wharfsinktest.TopicOrders
		return func(ctx context.Context, msgs []*wharf.Message) error {
			errs := make([]error, len(msgs))
			var wg sync.WaitGroup
			for i, m := range msgs {
				wg.Go(func() {
					_, errs[i] = cm.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: m.Payload,
						Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: PropertyMessageID, Value: m.ID}}}})
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		}
	})
}
