package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	kinesistypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/testdb"
)

// SQL enqueue -> wharf relay (a process) -> Kinesis Data Streams
// (kinesalite) -> GetRecords shard by shard: every record's envelope with
// its id, topic, key, header and payload, the partition key = the key, each
// key's first deliveries in order, an empty outbox.
func TestRelayToKinesis(t *testing.T) {
	t.Parallel()
	srv := awstest.StartKinesalite(t)
	c := kinesis.NewFromConfig(srv.Config())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "e2e-" + randHex(4) + "-"
	stream := prefix + "orders"
	_, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(3)})
	require.NoError(t, err)
	b := setup(t)
	want := enqueueSQL(t, b, "orders", 300, 10)
	res := runCLI(t, append(testdb.CleanEnv(), srv.Env()...), time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", "kinesis://?endpoint="+url.QueryEscape(srv.Endpoint)+"&stream_template="+prefix+"{{topic}}")
	require.Equalf(t, 0, res.code, "relay to kinesis: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	payloadOf := map[int64]string{}
	for key, ids := range want {
		k, err := strconv.Atoi(key[1:])
		require.NoError(t, err)
		for j, id := range ids {
			payloadOf[id] = fmt.Sprintf(`{"n":%d}`, j*10+k)
		}
	}
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	require.NoError(t, err)
	got := map[string][]int64{}
	n := 0
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: sh.ShardId, ShardIteratorType: kinesistypes.ShardIteratorTypeTrimHorizon})
		require.NoError(t, err)
		recs, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it.ShardIterator, Limit: aws.Int32(10000)})
		require.NoError(t, err)
		for _, r := range recs.Records {
			var e struct {
				ID      string            `json:"id"`
				Topic   string            `json:"topic"`
				Key     string            `json:"key"`
				Headers map[string]string `json:"headers"`
				Payload json.RawMessage   `json:"payload"`
			}
			require.NoError(t, json.Unmarshal(r.Data, &e))
			seq, _, err := wharf.ParseID(e.ID)
			require.NoError(t, err)
			require.Equal(t, "orders", e.Topic)
			require.Equal(t, e.Key, aws.ToString(r.PartitionKey), "the partition key is the key")
			require.Equal(t, "sql", e.Headers["origin"])
			require.JSONEq(t, payloadOf[seq], string(e.Payload))
			got[e.Key] = append(got[e.Key], seq)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 300, "every message must be in the stream (redeliveries may add copies)")
	requireFirstDeliveriesInOrder(t, want, got)
}
