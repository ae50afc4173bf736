package wharfkafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/wharfhq/wharf"
)

var _ wharf.Pinger = (*Sink)(nil)

// Ping asks the cluster: fine while it runs, failing within the context once
// it is gone.
func TestPingFollowsTheCluster(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Brokers: c.ListenAddrs(), TopicTemplate: testPrefix + TopicPlaceholder})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping with the cluster up: %v", err)
	}
	c.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if err := s.Ping(ctx2); err == nil {
		t.Fatal("ping succeeded with the cluster gone")
	}
}
