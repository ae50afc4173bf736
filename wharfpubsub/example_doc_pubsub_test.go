package wharfpubsub_test

// Code of docs/sinks/pubsub.md ("Try it locally"): the doc pastes these
// lines, so change both.

import (
	"context"
	"fmt"
	"net/url"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfpubsub"
)

// localPubSub starts the Pub/Sub client library's in-process server
// (pstest) on port (0: any free port) and creates the topics in project.
// Point the sink at the address it returns: endpoint=ADDR in the sink URL,
// or PUBSUB_EMULATOR_HOST=ADDR.
func localPubSub(ctx context.Context, port int, project string, topics ...string) (srv *pstest.Server, err error) {
	srv = pstest.NewServerWithPort(port)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	admin, err := pubsub.NewClient(ctx, project, option.WithGRPCConn(conn))
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	for _, t := range topics {
		name := "projects/" + project + "/topics/" + t
		if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: name}); err != nil {
			return nil, err
		}
	}
	return srv, nil
}

// Try the Pub/Sub sink without gcloud or credentials: pstest in process,
// the sink opened from the URL wharf relay would take.
func Example_localPubSub() {
	ctx := context.Background()
	srv, err := localPubSub(ctx, 0, "test", "wharf-orders-paid")
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	u, _ := url.Parse("pubsub://test?endpoint=" + srv.Addr + "&topic_template=wharf-{{topic|dashes}}")
	sink, err := wharfpubsub.Open(ctx, u)
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	msg := &wharf.Message{ID: "00000000-0000-8001-8000-000000000001", Seq: 1, Topic: "orders.paid", Key: "42", Payload: []byte(`{"order":42}`)}
	if errs := sink.Publish(ctx, []*wharf.Message{msg}); errs != nil {
		panic(fmt.Sprint(errs))
	}
	for _, m := range srv.Messages() {
		fmt.Println(m.Topic, m.OrderingKey, string(m.Data))
	}
	// Output:
	// projects/test/topics/wharf-orders-paid 42 {"order":42}
}
