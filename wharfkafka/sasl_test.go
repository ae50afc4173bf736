package wharfkafka

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
)

// The settings Azure Event Hubs' Kafka endpoint takes (TLS, SASL PLAIN with
// the user "$ConnectionString" and the namespace's connection string as the
// password), against a cluster that requires exactly that: the sink
// publishes, a consumer with the same credentials reads the records back,
// and a wrong password fails the publish with the broker's refusal.
func TestSASLPlainOverTLSAsEventHubsTakesIt(t *testing.T) {
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stls, err := pki.ServerTLS(false)
	if err != nil {
		t.Fatal(err)
	}
	const user = "$ConnectionString"
	const secret = "Endpoint=sb://wharf-test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=abc="
	topic := testPrefix + "sasl"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(stls), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", user, secret), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := strings.Replace(c.ListenAddrs()[0], "127.0.0.1", "localhost", 1)
	open := func(passEnv string) wharf.Sink {
		t.Helper()
		q := url.Values{"topic_template": {topic}, "delivery_timeout": {"5s"}, "tls_ca": {pki.CA},
			"sasl": {"plain"}, "sasl_user": {user}, "sasl_password_env": {passEnv}}
		u, err := url.Parse(fmt.Sprintf("kafka://%s?%s", addr, q.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(context.Background(), u)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	t.Setenv("WHARF_TEST_EVENTHUBS", secret)
	t.Setenv("WHARF_TEST_WRONG", secret+"x")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs := []*wharf.Message{msg(1, "orders", "k", "one"), msg(2, "orders", "k", "two")}
	if errs := open("WHARF_TEST_EVENTHUBS").Publish(ctx, msgs); errs != nil {
		t.Fatalf("publish with SASL PLAIN over TLS: %v", errs)
	}
	ctls, err := pki.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls.ServerName = "localhost"
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTLSConfig(ctls), kgo.SASL(plain.Auth{User: user, Pass: secret}.AsMechanism()),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for len(got) < len(msgs) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if strings.Join(got, ",") != "one,two" {
		t.Fatalf("consumer read %v, want [one two]", got)
	}
	errs := open("WHARF_TEST_WRONG").Publish(ctx, []*wharf.Message{msg(3, "orders", "k", "three")})
	if errs == nil || errs[0] == nil || !strings.Contains(strings.ToLower(errs[0].Error()), "sasl") {
		t.Fatalf("wrong password: want a SASL authentication error, got %v", errs)
	}
}

// Bad SASL options: one line naming what is wrong, the password never read
// from the URL.
func TestSASLOptionErrors(t *testing.T) {
	t.Parallel()
	env := func(name string) (string, bool) {
		if name == "SET" {
			return "pw", true
		}
		return "", false
	}
	for raw, want := range map[string]string{
		"kafka://h?sasl_user=u":                                          "need sasl=plain",
		"kafka://h?sasl=plain&tls=true":                                  "needs sasl_user=NAME and sasl_password_env=VARIABLE",
		"kafka://h?sasl=plain&tls=true&sasl_user=u&sasl_password_env=NO": "the environment variable NO is not set",
		"kafka://h?sasl=plain&sasl_user=u&sasl_password_env=SET":         "sends the password in clear: add tls=true",
		"kafka://h?sasl=gssapi&sasl_user=u&sasl_password_env=SET":        "want plain, scram-sha-256 or scram-sha-512",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, tlsOn, err := parseURL(u)
		if err != nil {
			t.Fatalf("%s: parseURL: %v", raw, err)
		}
		_, err = saslFromURL(u, tlsOn, env)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line containing %q", raw, err, want)
		}
	}
	for _, raw := range []string{"kafka://h?sasl=scram-sha-256&sasl_user=u&sasl_password_env=SET", "kafka://h?tls=true&sasl=PLAIN&sasl_user=u&sasl_password_env=SET"} {
		u, _ := url.Parse(raw)
		_, tlsOn, err := parseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := saslFromURL(u, tlsOn, env); err != nil || m == nil {
			t.Errorf("%s: got %v, %v, want a mechanism", raw, m, err)
		}
	}
}
