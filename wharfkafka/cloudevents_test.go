package wharfkafka

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// Each mode's records, read back from the broker, decode as the CloudEvents
// Kafka binding says, with every attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for i, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c := onePartitionCluster(t)
			u, err := url.Parse("kafka://" + strings.Join(c.ListenAddrs(), ",") + "?topic_template=" + testPrefix + "{{topic}}&ce=" + mode + "&ce_source=urn:svc:orders")
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(context.Background(), u)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			cases := cereader.Cases(wharfsinktest.TopicOrders, int64(100*i+1))
			if errs := s.Publish(context.Background(), cereader.Messages(cases)); errs != nil {
				t.Fatalf("Publish: %v", errs)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
				kgo.ConsumeTopics(testPrefix+wharfsinktest.TopicOrders),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var recs []*kgo.Record
			for len(recs) < len(cases) && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
			}
			if len(recs) != len(cases) {
				t.Fatalf("got %d records, want %d", len(recs), len(cases))
			}
			for j, r := range recs {
				h := map[string]string{}
				for _, hd := range r.Headers {
					h[hd.Key] = string(hd.Value)
				}
				ev, err := cereader.Kafka(h, r.Value)
				if err != nil {
					t.Fatalf("record %d: %v (headers %v)", j, err, h)
				}
				tc := cases[j]
				cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
				if string(r.Key) != tc.Msg.Key {
					t.Errorf("record key %q, want the message key %q", r.Key, tc.Msg.Key)
				}
				if h[HeaderMessageID] != tc.Msg.ID {
					t.Errorf("%s = %q, want %q", HeaderMessageID, h[HeaderMessageID], tc.Msg.ID)
				}
			}
			if !strings.Contains(headerNames(recs[0]), "app") {
				t.Errorf("the message's own header app was not kept: %s", headerNames(recs[0]))
			}
		})
	}
}

func headerNames(r *kgo.Record) string {
	var names []string
	for _, h := range r.Headers {
		names = append(names, h.Key)
	}
	return strings.Join(names, ",")
}
