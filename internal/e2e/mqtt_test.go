package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
	"github.com/wharfhq/wharf/internal/testtool"
)

// mqttPublish is one PUBLISH as a subscriber got it.
type mqttPublish struct {
	topic, contentType string
	props              map[string]string
	payload            []byte
}

// subscribeMQTT subscribes to filter with QoS 1 on the server at addr and
// returns a function that waits for at least n PUBLISHes and returns them.
func subscribeMQTT(t *testing.T, addr, filter string) func(n int) []mqttPublish {
	t.Helper()
	var mu sync.Mutex
	var got []mqttPublish
	subscribed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{{Scheme: "mqtt", Host: addr}},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		ConnectTimeout:                5 * time.Second,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				_, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
				select {
				case subscribed <- err:
				default:
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "wharf-e2e-" + randHex(6),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				p := mqttPublish{topic: pr.Packet.Topic, payload: pr.Packet.Payload, props: map[string]string{}}
				if pp := pr.Packet.Properties; pp != nil {
					p.contentType = pp.ContentType
					for _, u := range pp.User {
						p.props[u.Key] = u.Value
					}
				}
				mu.Lock()
				got = append(got, p)
				mu.Unlock()
				return true, nil
			}},
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = cm.Disconnect(dctx)
		dcancel()
		cancel()
		<-cm.Done()
	})
	select {
	case err := <-subscribed:
		require.NoError(t, err, "subscribe to %s", filter)
	case <-time.After(time.Minute):
		t.Fatalf("no subscription to %s within a minute", filter)
	}
	return func(n int) []mqttPublish {
		deadline := time.Now().Add(time.Minute)
		for {
			mu.Lock()
			out := append([]mqttPublish(nil), got...)
			mu.Unlock()
			if len(out) >= n || time.Now().After(deadline) {
				return out
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func mqttAddr(t *testing.T) string {
	addr := os.Getenv("WHARF_TEST_MQTT_ADDR")
	if addr == "" {
		addr = "127.0.0.1:1883"
	}
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		testtool.Missing(t, "mosquitto", fmt.Sprintf("no MQTT server at %s (%v): start it with mosquitto -d -c /etc/mosquitto/mosquitto.conf", addr, err))
	}
	_ = c.Close()
	return addr
}

// SQL enqueue -> wharf relay (a process) -> MQTT 5 (Mosquitto, the real
// server) -> a paho subscriber: every message by its wharf-message-id user
// property, per-key order of first deliveries, the key and the headers as
// user properties, an empty outbox.
func TestRelayToMQTT(t *testing.T) {
	t.Parallel()
	addr := mqttAddr(t)
	b := setup(t)
	prefix := "wharf-e2e/" + randHex(4)
	wait := subscribeMQTT(t, addr, prefix+"/#")
	want := enqueueSQL(t, b, "orders", 400, 10)

	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", "mqtt://"+addr+"?topic_template="+prefix+"/{{topic}}")
	require.Equalf(t, 0, res.code, "relay to mqtt: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	got := map[string][]int64{}
	for _, p := range wait(400) {
		require.Equal(t, prefix+"/orders", p.topic)
		n, _, err := wharf.ParseID(p.props["wharf-message-id"])
		require.NoErrorf(t, err, "PUBLISH without a wharf-message-id user property: %v", p.props)
		require.Equal(t, "sql", p.props["origin"], "the header origin as a user property")
		key := p.props["wharf-key"]
		got[key] = append(got[key], n)
	}
	requireFirstDeliveriesInOrder(t, want, got)
}

// The same through a relay with ce=binary: every PUBLISH decodes as a
// CloudEvent by the MQTT binding, id the message id, type the topic, subject
// the key, time the enqueue time, in per-key order.
func TestRelayToMQTTCloudEvents(t *testing.T) {
	t.Parallel()
	addr := mqttAddr(t)
	b := setup(t)
	prefix := "wharf-e2e/" + randHex(4)
	wait := subscribeMQTT(t, addr, prefix+"/#")
	want := enqueueSQL(t, b, "orders", 200, 5)
	start := time.Now().Add(-time.Hour) // the database's clock may differ a little from ours

	res := runCLI(t, nil, time.Minute, "relay", "--drain", "--schema", b.schema, "--database-url", databaseURL, "--log-level", "warn",
		"--sink", "mqtt://"+addr+"?topic_template="+prefix+"/{{topic}}&ce=binary&ce_source=urn:e2e:orders")
	require.Equalf(t, 0, res.code, "relay to mqtt: %s", res.stderr)
	require.Equal(t, 0, b.outboxCount(t))

	got := map[string][]int64{}
	for _, p := range wait(200) {
		ev, err := cereader.MQTT(p.props, p.contentType, p.payload)
		require.NoError(t, err)
		require.Equal(t, "urn:e2e:orders", ev.Attrs["source"])
		require.Equal(t, "orders", ev.Attrs["type"])
		require.Equal(t, "application/json", ev.Attrs["datacontenttype"])
		tm, err := time.Parse(time.RFC3339Nano, ev.Attrs["time"])
		require.NoError(t, err)
		require.Truef(t, tm.After(start) && tm.Before(time.Now().Add(time.Hour)), "time %s is not the enqueue time", tm)
		n, _, err := wharf.ParseID(ev.Attrs["id"])
		require.NoError(t, err)
		got[ev.Attrs["subject"]] = append(got[ev.Attrs["subject"]], n)
	}
	requireFirstDeliveriesInOrder(t, want, got)
}
