package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	pubsubpb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// SQL enqueue -> wharf relay (a process) -> Google Cloud Pub/Sub (pstest,
// the client library's server, in this process) -> the server's own record:
// every message with its attributes and ordering key, each key in order, an
// empty outbox.
func TestRelayToPubSub(t *testing.T) {
	t.Parallel()
	srv := pstest.NewServer()
	defer srv.Close()
	prefix := "e2e-" + randHex(4) + "-"
	topic := "projects/wharf-e2e/topics/" + prefix + "orders"
	_, err := srv.GServer.CreateTopic(t.Context(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	b := setup(t)
	want := enqueueSQL(t, b, "orders", 300, 10)
	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", "pubsub://wharf-e2e?endpoint="+srv.Addr+"&topic_template="+prefix+"{{topic}}")
	require.Equalf(t, 0, res.code, "relay to pubsub: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	payloadOf := map[int64]string{}
	for key, ids := range want {
		k, err := strconv.Atoi(key[1:])
		require.NoError(t, err)
		for j, id := range ids {
			payloadOf[id] = fmt.Sprintf(`{"n":%d}`, j*10+k)
		}
	}
	got := map[string][]int64{}
	msgs := srv.Messages()
	require.GreaterOrEqual(t, len(msgs), 300, "every message must be stored (redeliveries may add copies)")
	for _, m := range msgs {
		require.Equal(t, topic, m.Topic)
		seq, _, err := wharf.ParseID(m.Attributes["wharf-id"])
		require.NoError(t, err)
		require.Equal(t, "orders", m.Attributes["wharf-topic"])
		require.Equal(t, "sql", m.Attributes["origin"], "the header origin")
		require.Equal(t, m.Attributes["wharf-key"], m.OrderingKey, "the ordering key is the key")
		require.True(t, json.Valid(m.Data))
		require.JSONEq(t, payloadOf[seq], string(m.Data))
		got[m.OrderingKey] = append(got[m.OrderingKey], seq)
	}
	requireFirstDeliveriesInOrder(t, want, got)
}
