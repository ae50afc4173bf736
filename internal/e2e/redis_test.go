package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
)

// SQL enqueue -> wharf relay (a process) -> Redis Streams (the real server)
// -> XRANGE with go-redis: every message by its id field, per-key order of
// first deliveries, an empty outbox.
func TestRelayToRedis(t *testing.T) {
	t.Parallel()
	redisURL := os.Getenv("WHARF_TEST_REDIS_URL")
	if redisURL == "" {
		redisURL = "redis://127.0.0.1:6379"
	}
	opts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	err = rdb.Ping(pctx).Err()
	pcancel()
	if err != nil {
		testtool.Missing(t, "redis-server", fmt.Sprintf("Redis is not reachable at %s (%v): start it with redis-server --daemonize yes", redisURL, err))
	}
	b := setup(t)
	prefix := "e2e:" + randHex(4)
	stream := prefix + ".orders"
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()
	want := enqueueSQL(t, b, "orders", 400, 10)

	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", redisURL+"?stream_template="+prefix+".{{topic}}")
	require.Equalf(t, 0, res.code, "relay to redis: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(entries), 400, "every message must be in the stream (redeliveries may add copies)")
	// enqueueSQL gives message i key k(i%10) and payload {"n":i}.
	payloadOf := map[int64]string{}
	for key, ids := range want {
		k, err := strconv.Atoi(key[1:])
		require.NoError(t, err)
		for j, id := range ids {
			payloadOf[id] = fmt.Sprintf(`{"n":%d}`, j*10+k)
		}
	}
	got := map[string][]int64{}
	for _, e := range entries {
		require.Equal(t, "orders", e.Values["topic"], "entry %s", e.ID)
		id, ok := e.Values["id"].(string)
		require.Truef(t, ok, "entry %s has no id field: %v", e.ID, e.Values)
		n, _, err := wharf.ParseID(id)
		require.NoError(t, err)
		key, _ := e.Values["key"].(string)
		require.Equalf(t, "sql", e.Values["h:origin"], "entry %s: the header origin", e.ID)
		payload, _ := e.Values["payload"].(string)
		require.JSONEqf(t, payloadOf[n], payload, "entry %s (message %d): payload", e.ID, n)
		got[key] = append(got[key], n)
	}
	requireFirstDeliveriesInOrder(t, want, got)
}
