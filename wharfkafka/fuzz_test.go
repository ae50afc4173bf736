package wharfkafka

import (
	"net/url"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// FuzzParseURL checks the kafka:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	wharfsinktest.FuzzURL(f, []string{
		"kafka://k1?ce=binary&ce_source=urn:svc", "kafka://k1?ce=bogus", "kafka://k1?ce_source=/s",
		"kafka://127.0.0.1:9092",
		"kafka://h1,h2:9093?topic_template=x.{{topic}}&client_id=c&max_message_bytes=100&delivery_timeout=3s&compression=zstd&tls=true",
		"kafka://u:p4ssw0rd@h",
		"kafka://h?compression=brotli",
		"kafka://h?max_message_bytes=99999999999",
		"kafka://h?x=1",
		"kafka:opaque",
		"kafka://,",
		"kafka://h/p",
		"kafka://h#frag",
		"kafka://h?delivery_timeout=0s",
		"kafka://[::1]:9092",
	}, fuzzErrorText,
		func(u *url.URL) (any, error) { o, tl, err := parseURL(u); return [2]any{o, tl}, err },
		nil)
}

// fuzzErrorText is the fixed text of parseURL's errors.
const fuzzErrorText = "sink URL wharfkafka opens kafka:// URLs the kafka sink takes no user or password in the URL: for SASL write sasl=plain|scram-sha-256|scram-sha-512&sasl_user=NAME&sasl_password_env=VARIABLE write kafka://host:port[,host:port]?option=value names no broker: unknown option the kafka sink takes topic_template, client_id, max_message_bytes, delivery_timeout, compression, ce, ce_source, tls, tls_ca, tls_cert, tls_key, sasl, sasl_user and sasl_password_env is not a positive number of bytes is not a positive duration such as 30s want snappy, lz4, zstd, gzip or none want true or false template has a placeholder more than once ({{topic}} or {{topic|dashes}}) unknown placeholder unclosed placeholder in template: templates take {{topic}} or {{topic|dashes}}" + " " + cloudevents.ErrorText
