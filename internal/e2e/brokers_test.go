package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// enqueueSQL enqueues n messages over keys with the SQL function, as an
// application in any language would, and returns the ids by key in order.
func enqueueSQL(t *testing.T, b *bundle, topic string, n, keys int) map[string][]int64 {
	t.Helper()
	byKey := map[string][]int64{}
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k%d", i%keys)
		var id string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT "+b.schema+".enqueue($1, $2, $3::jsonb, '{\"origin\":\"sql\"}')", topic, key, fmt.Sprintf(`{"n":%d}`, i)).Scan(&id))
		seq, _, err := wharf.ParseID(id)
		require.NoError(t, err)
		byKey[key] = append(byKey[key], seq)
	}
	return byKey
}

// requireFirstDeliveriesInOrder checks that for each key the first delivery
// of each id came in id order and that every id arrived.
func requireFirstDeliveriesInOrder(t *testing.T, want map[string][]int64, got map[string][]int64) {
	t.Helper()
	for key, ids := range want {
		seen := map[int64]bool{}
		var first []int64
		for _, id := range got[key] {
			if !seen[id] {
				seen[id] = true
				first = append(first, id)
			}
		}
		require.Equalf(t, ids, first, "key %s: first deliveries must be every id, in id order", key)
	}
}

// SQL enqueue -> wharf relay (a process) -> Kafka (kfake, the real protocol)
// -> a franz-go consumer: every message, per-key order, the message id header.
func TestRelayToKafka(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "e2e.orders"))
	require.NoError(t, err)
	defer cluster.Close()
	want := enqueueSQL(t, b, "orders", 600, 20)

	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", "kafka://"+cluster.ListenAddrs()[0]+"?topic_template=e2e.{{topic}}")
	require.Equalf(t, 0, res.code, "relay to kafka: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("e2e.orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	got := map[string][]int64{}
	total := 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for total < 600 && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			var id string
			for _, h := range r.Headers {
				if h.Key == "wharf-message-id" {
					id = string(h.Value)
				}
			}
			n, _, err := wharf.ParseID(id)
			require.NoErrorf(t, err, "record without a wharf-message-id header: %v", r.Headers)
			got[string(r.Key)] = append(got[string(r.Key)], n)
			total++
		})
	}
	requireFirstDeliveriesInOrder(t, want, got)
}

// SQL enqueue -> wharf relay (a process) -> NATS JetStream (the real server)
// -> a nats.go reader: every message, per-key order, Nats-Msg-Id.
func TestRelayToNATS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := os.Getenv("WHARF_TEST_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		testtool.Missing(t, "nats-server", fmt.Sprintf("NATS is not reachable at %s (%v): start it with nats-server -js -a 127.0.0.1 -p 4222 -sd /var/lib/nats-server", url, err))
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	prefix := "e2e" + randHex(4)
	stream := "WHARF_E2E_" + randHex(4)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}, MaxAge: time.Hour})
	require.NoError(t, err)
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	want := enqueueSQL(t, b, "orders", 400, 10)

	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", url+"?stream="+stream+"&subject_template="+prefix+".{{topic}}")
	require.Equalf(t, 0, res.code, "relay to nats: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 400, info.State.Msgs, "JetStream deduplicates on Nats-Msg-Id: exactly one copy of each message")
	got := map[string][]int64{}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		require.Equal(t, prefix+".orders", m.Subject)
		n, _, err := wharf.ParseID(m.Header.Get("Nats-Msg-Id"))
		require.NoError(t, err)
		got[m.Header.Get("Wharf-Key")] = append(got[m.Header.Get("Wharf-Key")], n)
	}
	requireFirstDeliveriesInOrder(t, want, got)
}
