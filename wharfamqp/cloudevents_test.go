package wharfamqp

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// Each mode's messages, read back from a queue, decode as the CloudEvents
// AMQP binding says (application properties as 0-9-1 headers), with every
// attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			admin := requireBroker(t)
			ch, err := admin.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			q := "wharftest.ce." + randomID()
			if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-expires": int64(queueExpiresMilli)}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if ch, err := admin.Channel(); err == nil {
					_, _ = ch.QueueDelete(q, false, false, false)
					_ = ch.Close()
				}
			})
			// The default exchange routes to the queue the routing key names.
			s := openSink(t, sinkURL(brokerURL(), "routing_key_template="+q, "ce="+mode, "ce_source=urn:svc:orders"))
			cases := cereader.Cases("orders", int64(100*i+1))
			if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
				t.Fatalf("Publish: %v", errs)
			}
			deadline := time.Now().Add(time.Minute)
			for j := 0; j < len(cases); {
				d, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					if time.Now().After(deadline) {
						t.Fatalf("got %d messages, want %d", j, len(cases))
					}
					time.Sleep(10 * time.Millisecond) // basic.get does not wait
					continue
				}
				tc := cases[j]
				ev, err := cereader.AMQP(d.Headers, d.ContentType, d.Body)
				if err != nil {
					t.Fatalf("message %d: %v (headers %v, content-type %q)", j, err, d.Headers, d.ContentType)
				}
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if d.MessageId != tc.Msg.ID {
					t.Errorf("message-id %q, want %q", d.MessageId, tc.Msg.ID)
				}
				j++
			}
		})
	}
}
