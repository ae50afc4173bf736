package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/testdb"
)

// sqsReceived is one message read back from an SQS queue.
type sqsReceived struct {
	id, topic, key, body, origin, group, dedup string
}

// drainQueue receives and deletes until the queue gave want messages, then
// once more to catch extra copies; the overall bound only guards a hang.
func drainQueue(t *testing.T, c *sqs.Client, queueURL string, want int) []sqsReceived {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got []sqsReceived
	for empty := 0; empty < 2; {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(queueURL),
			MaxNumberOfMessages:         10,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			WaitTimeSeconds:             1,
		})
		require.NoError(t, err)
		if len(out.Messages) == 0 && len(got) >= want {
			empty++
			continue
		}
		var del []sqstypes.DeleteMessageBatchRequestEntry
		for j, m := range out.Messages {
			a := func(k string) string { return aws.ToString(m.MessageAttributes[k].StringValue) }
			got = append(got, sqsReceived{id: a("wharf-id"), topic: a("wharf-topic"), key: a("wharf-key"), origin: a("origin"),
				body: aws.ToString(m.Body), group: m.Attributes["MessageGroupId"], dedup: m.Attributes["MessageDeduplicationId"]})
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: m.ReceiptHandle})
		}
		if len(del) > 0 {
			_, err = c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del})
			require.NoError(t, err)
		}
	}
	return got
}

// checkSQSDeliveries checks every enqueued message arrived with its topic,
// key, payload and header, each key's first deliveries in order.
func checkSQSDeliveries(t *testing.T, want map[string][]int64, got []sqsReceived, fifo bool) {
	t.Helper()
	payloadOf := map[int64]string{}
	n := 0
	for key, ids := range want {
		k, err := strconv.Atoi(key[1:])
		require.NoError(t, err)
		for j, id := range ids {
			payloadOf[id] = fmt.Sprintf(`{"n":%d}`, j*len(want)+k)
			n++
		}
	}
	require.GreaterOrEqual(t, len(got), n, "every message must be in the queue")
	byKey := map[string][]int64{}
	for _, r := range got {
		seq, _, err := wharf.ParseID(r.id)
		require.NoError(t, err)
		require.Equal(t, "orders", r.topic)
		require.Equal(t, "sql", r.origin, "the header origin")
		require.JSONEq(t, payloadOf[seq], r.body)
		if fifo {
			require.Equal(t, r.key, r.group, "the group id is the key")
			require.Equal(t, r.id, r.dedup, "the dedup id is the message id")
		}
		byKey[r.key] = append(byKey[r.key], seq)
	}
	requireFirstDeliveriesInOrder(t, want, byKey)
}

// SQL enqueue -> wharf relay (a process) -> SQS FIFO queue, and -> SNS FIFO
// topic -> subscribed SQS FIFO queue (raw delivery), both on the AWS emulator: every message with
// its attributes, each key in order, an empty outbox. The relay finds its
// credentials and region through the default AWS chain (the environment).
func TestRelayToSQSAndSNS(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	cfg := srv.Config()
	q := sqs.NewFromConfig(cfg)
	s := sns.NewFromConfig(cfg)
	ctx := context.Background()
	prefix := "e2e-" + randHex(4)
	env := append(testdb.CleanEnv(), srv.Env()...)
	endpoint := url.QueryEscape(srv.Endpoint)

	t.Run("sqs", func(t *testing.T) {
		out, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(prefix + "-orders.fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
		require.NoError(t, err)
		b := setup(t)
		want := enqueueSQL(t, b, "orders", 60, 6)
		res := runCLI(t, env, 2*time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
			"--sink", "sqs://?endpoint="+endpoint+"&queue_template="+prefix+"-{{topic}}.fifo")
		require.Equalf(t, 0, res.code, "relay to sqs: %s", res.stderr)
		require.Equal(t, 0, b.outboxCount(t))
		checkSQSDeliveries(t, want, drainQueue(t, q, aws.ToString(out.QueueUrl), 60), true)
	})

	t.Run("sns", func(t *testing.T) {
		qout, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(prefix + "-sub.fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
		require.NoError(t, err)
		attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: qout.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		require.NoError(t, err)
		tout, err := s.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(prefix + "-orders.fifo"), Attributes: map[string]string{"FifoTopic": "true"}})
		require.NoError(t, err)
		_, err = s.Subscribe(ctx, &sns.SubscribeInput{TopicArn: tout.TopicArn, Protocol: aws.String("sqs"),
			Endpoint: aws.String(attrs.Attributes["QueueArn"]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
		require.NoError(t, err)
		b := setup(t)
		want := enqueueSQL(t, b, "orders", 60, 6)
		arnTemplate := "arn:aws:sns:" + awstest.Region + ":123456789012:" + prefix + "-{{topic}}.fifo"
		res := runCLI(t, env, 2*time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
			"--sink", "sns://?endpoint="+endpoint+"&topic_arn_template="+url.QueryEscape(arnTemplate))
		require.Equalf(t, 0, res.code, "relay to sns: %s", res.stderr)
		require.Equal(t, 0, b.outboxCount(t))
		checkSQSDeliveries(t, want, drainQueue(t, q, aws.ToString(qout.QueueUrl), 60), true)
	})
}
