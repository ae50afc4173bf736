package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// SQL enqueue -> wharf relay (a process) -> RabbitMQ (the real broker,
// through amq.direct into a queue of the test's own) -> an amqp091-go
// consumer: every message by its message-id, per-key order of first
// deliveries, the properties the sink sets, an empty outbox.
func TestRelayToRabbitMQ(t *testing.T) {
	t.Parallel()
	brokerURL := os.Getenv("WHARF_TEST_AMQP_URL")
	if brokerURL == "" {
		brokerURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.DialConfig(brokerURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		testtool.Missing(t, "rabbitmq-server", fmt.Sprintf("RabbitMQ is not reachable (%v): start it with rabbitmq-server -detached (guest/guest on 127.0.0.1:5672), or set WHARF_TEST_AMQP_URL", err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	b := setup(t)
	prefix := "e2e." + randHex(4)
	queue := prefix + ".orders"
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-expires": int64(3600000)})
	require.NoError(t, err)
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	require.NoError(t, ch.QueueBind(queue, queue, "amq.direct", false, nil))
	want := enqueueSQL(t, b, "orders", 400, 10)

	sep := "?"
	if strings.Contains(brokerURL, "?") {
		sep = "&"
	}
	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", brokerURL+sep+"exchange=amq.direct&routing_key_template="+prefix+".{{topic}}&name=wharf-e2e")
	require.Equalf(t, 0, res.code, "relay to rabbitmq: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	require.NoError(t, err)
	got := map[string][]int64{}
	seen := map[int64]bool{}
	timeout := time.After(20 * time.Second)
	for len(seen) < 400 {
		select {
		case d, ok := <-deliveries:
			require.True(t, ok, "the consumer's channel closed")
			n, _, err := wharf.ParseID(d.MessageId)
			require.NoErrorf(t, err, "delivery without a Wharf message-id: %q", d.MessageId)
			key, _ := d.Headers["wharf-key"].(string)
			require.Equalf(t, "sql", d.Headers["origin"], "message %d: the header origin", n)
			require.Equalf(t, "orders", d.Type, "message %d: the type property carries the topic", n)
			require.Equalf(t, amqp.Persistent, d.DeliveryMode, "message %d: delivery mode", n)
			got[key] = append(got[key], n)
			seen[n] = true
		case <-timeout:
			t.Fatalf("the queue delivered %d of the 400 messages within 20s", len(seen))
		}
	}
	requireFirstDeliveriesInOrder(t, want, got)
}
