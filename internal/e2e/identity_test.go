package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// outbox is one outbox the identity test relays from: a schema in a database.
type outbox struct {
	name   string
	url    string
	schema string
	pool   *pgxpool.Pool
}

func (o *outbox) enqueue(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		var id string
		require.NoError(t, o.pool.QueryRow(context.Background(),
			"SELECT "+o.schema+`.enqueue('orders', 'k', '{"n":1}')`).Scan(&id))
		ids = append(ids, id)
	}
	return ids
}

func (o *outbox) relay(t *testing.T, sink string) {
	t.Helper()
	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", o.schema, "--database-url", o.url, "--log-level", "warn", "--sink", sink)
	require.Equalf(t, 0, res.code, "relay %s: %s", o.name, res.stderr)
}

// secondDatabase creates a database of its own on the test server.
func secondDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	defer admin.Close()
	name := "wharf_id_" + randHex(4)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		a, err := pgxpool.New(context.Background(), databaseURL)
		if err == nil {
			_, _ = a.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			a.Close()
		}
	})
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

func newOutbox(t *testing.T, name, dbURL string) *outbox {
	t.Helper()
	ctx := context.Background()
	schema := "wi_" + randHex(5)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	m, err := wharfmigrate.New(schema)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	return &outbox{name: name, url: dbURL, schema: schema, pool: pool}
}

// Outboxes that know nothing of each other — two schemas of one database, a
// second database, and one outbox migrated down and up again — all start
// their seqs at 1. Relayed into one NATS stream, one Kafka topic, one Redis
// stream and one webhook receiver that deduplicates on webhook-id, every
// message arrives: their ids differ, so no destination takes one for
// another's duplicate.
func TestOutboxesNeverShareMessageIDs(t *testing.T) {
	t.Parallel()
	other := secondDatabase(t)
	type destination struct {
		sink string
		ids  func(t *testing.T) []string // the message ids the destination holds
	}
	dests := map[string]func(t *testing.T) destination{
		"nats": func(t *testing.T) destination {
			addr := os.Getenv("WHARF_TEST_NATS_URL")
			if addr == "" {
				addr = "nats://127.0.0.1:4222"
			}
			nc, err := nats.Connect(addr, nats.Timeout(3*time.Second))
			require.NoErrorf(t, err, "NATS must run at %s", addr)
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			prefix, stream := "id"+randHex(4), "WHARF_ID_"+randHex(4)
			ctx := context.Background()
			_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}, Duplicates: time.Hour})
			require.NoError(t, err)
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
			return destination{
				sink: addr + "?stream=" + stream + "&subject_template=" + prefix + ".{{topic}}",
				ids: func(t *testing.T) []string {
					s, err := js.Stream(ctx, stream)
					require.NoError(t, err)
					info, err := s.Info(ctx)
					require.NoError(t, err)
					var ids []string
					for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
						m, err := s.GetMsg(ctx, seq)
						require.NoError(t, err)
						ids = append(ids, m.Header.Get("Nats-Msg-Id"))
					}
					return ids
				},
			}
		},
		"kafka": func(t *testing.T) destination {
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "id.orders"))
			require.NoError(t, err)
			t.Cleanup(cluster.Close)
			return destination{
				sink: "kafka://" + cluster.ListenAddrs()[0] + "?topic_template=id.{{topic}}",
				ids: func(t *testing.T) []string {
					cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("id.orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
					require.NoError(t, err)
					defer cl.Close()
					// The relays drained before this reads: it reads until
					// it has seen the 12 messages sent (a hang guard of a
					// minute ends it otherwise, and the test says what is
					// missing).
					var ids []string
					seen := map[string]bool{}
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					for ctx.Err() == nil && len(seen) < 12 {
						cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
							for _, h := range r.Headers {
								if h.Key == "wharf-message-id" {
									ids = append(ids, string(h.Value))
									seen[string(h.Value)] = true
								}
							}
						})
					}
					return ids
				},
			}
		},
		"redis": func(t *testing.T) destination {
			addr := os.Getenv("WHARF_TEST_REDIS_URL")
			if addr == "" {
				addr = "redis://127.0.0.1:6379"
			}
			opts, err := redis.ParseURL(addr)
			require.NoError(t, err)
			rdb := redis.NewClient(opts)
			t.Cleanup(func() { _ = rdb.Close() })
			stream := "id:" + randHex(4)
			t.Cleanup(func() { _ = rdb.Del(context.Background(), stream+".orders").Err() })
			return destination{
				sink: addr + "?stream_template=" + stream + ".{{topic}}",
				ids: func(t *testing.T) []string {
					entries, err := rdb.XRange(context.Background(), stream+".orders", "-", "+").Result()
					require.NoError(t, err)
					var ids []string
					for _, e := range entries {
						id, _ := e.Values["id"].(string)
						ids = append(ids, id)
					}
					return ids
				},
			}
		},
		"webhook": func(t *testing.T) destination {
			// A Standard Webhooks receiver: a webhook-id it has seen is
			// acknowledged and dropped.
			var mu sync.Mutex
			kept := map[string]bool{}
			var ids []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				id := r.Header.Get("webhook-id")
				mu.Lock()
				if !kept[id] {
					kept[id] = true
					ids = append(ids, id)
				}
				mu.Unlock()
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			return destination{
				sink: srv.URL + "/hook/{{topic}}?wharf_allow_private=true",
				ids: func(*testing.T) []string {
					mu.Lock()
					defer mu.Unlock()
					return append([]string(nil), ids...)
				},
			}
		},
	}
	for name, mk := range dests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dest := mk(t)
			outboxes := []*outbox{
				newOutbox(t, "schema a", databaseURL),
				newOutbox(t, "schema b", databaseURL),
				newOutbox(t, "another database", other),
			}
			var sent []string
			for _, o := range outboxes {
				sent = append(sent, o.enqueue(t, 3)...)
				o.relay(t, dest.sink)
			}
			// The first outbox again, after `migrate down` and `up`: its
			// sequence starts over.
			o := outboxes[0]
			m, err := wharfmigrate.New(o.schema)
			require.NoError(t, err)
			_, err = m.Down(context.Background(), o.pool, 0)
			require.NoError(t, err)
			_, err = m.Up(context.Background(), o.pool)
			require.NoError(t, err)
			sent = append(sent, o.enqueue(t, 3)...)
			o.relay(t, dest.sink)

			seqs := map[int64]int{}
			for _, id := range sent {
				seq, _, err := wharf.ParseID(id)
				require.NoError(t, err)
				seqs[seq]++
			}
			require.Equal(t, map[int64]int{1: 4, 2: 4, 3: 4}, seqs, "every outbox handed out seqs 1, 2, 3")
			got := map[string]bool{}
			all := dest.ids(t)
			for _, id := range all {
				got[id] = true
			}
			for _, id := range sent {
				require.Truef(t, got[id], "message %s never reached %s (it holds %s)", id, name, strings.Join(all, " "))
			}
			require.Len(t, got, 12)
		})
	}
}
