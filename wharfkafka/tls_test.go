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

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
)

// A cluster that only speaks TLS with a private CA's certificate and requires
// client certificates: tls_ca, tls_cert and tls_key publish, and a verified
// consumer reads the records back; the system's roots or another CA fail the
// publish with a certificate error.
func TestTLSWithPrivateCAAndClientCertificate(t *testing.T) {
	t.Parallel()
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stls, err := pki.ServerTLS(true)
	if err != nil {
		t.Fatal(err)
	}
	topic := testPrefix + "tls"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(stls), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := strings.Replace(c.ListenAddrs()[0], "127.0.0.1", "localhost", 1)

	open := func(extra url.Values) wharf.Sink {
		t.Helper()
		extra.Set("topic_template", topic)
		extra.Set("delivery_timeout", "5s")
		u, err := url.Parse(fmt.Sprintf("kafka://%s?%s", addr, extra.Encode()))
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
	s := open(url.Values{"tls_ca": {pki.CA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}})
	msgs := []*wharf.Message{msg(1, "orders", "k", "one"), msg(2, "orders", "k", "two")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if errs := s.Publish(ctx, msgs); errs != nil {
		t.Fatalf("publish over TLS: %v", errs)
	}

	ctls, err := pki.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls.ServerName = "localhost"
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTLSConfig(ctls), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
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

	for name, extra := range map[string]url.Values{
		"system roots": {"tls": {"true"}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
		"other CA":     {"tls_ca": {pki.OtherCA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
	} {
		bad := open(extra)
		errs := bad.Publish(ctx, []*wharf.Message{msg(3, "orders", "k", "three")})
		if errs == nil || errs[0] == nil || !strings.Contains(errs[0].Error(), "certificate") {
			t.Fatalf("%s: want a certificate verification error, got %v", name, errs)
		}
	}
}

// With no broker listening, franz-go retries the dial until delivery_timeout;
// the publish error still names why it never reached a broker.
func TestUnreachableBrokerErrorNamesTheDialFailure(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	addr := c.ListenAddrs()[0]
	c.Close() // nothing listens there now
	u, err := url.Parse(fmt.Sprintf("kafka://%s?topic_template=t&delivery_timeout=2s", addr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := s.Publish(context.Background(), []*wharf.Message{msg(1, "orders", "k", "one")})
	if errs == nil || errs[0] == nil {
		t.Fatal("publish to a closed port succeeded")
	}
	if got := errs[0].Error(); !strings.Contains(got, "failed: ") || !strings.Contains(got, "refused") {
		t.Fatalf("want the dial failure named, got %v", got)
	}
}
