package wharfmqtt

import (
	"net/url"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// FuzzParseURL checks the mqtt:// URL parser on any URL net/url accepts: it
// never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	wharfsinktest.FuzzURL(f, []string{
		"mqtt://127.0.0.1:1883",
		"mqtts://u:s3cr3tpw@h:8883?topic_template=w/{{topic}}&client_id=c&session_expiry=1h&ack_timeout=2s&max_in_flight=5&max_payload=100&require_subscribers=true&ce=binary&ce_source=/s",
		"mqtt://h/x", "mqtt://h:0", "mqtt://h?client_id=", "mqtt://h?session_expiry=1ms", "mqtt://h?bogus=1",
		"mqtt:opaque", "mqtt://h,h2", "mqtt://h#f", "mqtt://:p4ssw0rd@h", "mqtt://h?topic_template={{topic}}{{topic}}",
		"mqtt://h?topic_template=$SYS/{{topic}}", "mqtt://h?topic_template=a/%23", "mqtt://h?tls_ca=/x", "mqtt://h?ce=bogus",
	}, fuzzErrorText,
		func(u *url.URL) (any, error) { return parseURL(u) },
		nil)
}

// fuzzErrorText is the fixed text of parseURL's errors.
const fuzzErrorText = "sink URL wharfmqtt opens mqtt:// and mqtts:// URLs write ://[user:password@]host:port?option=value names no host, or several: write ://host:port port is not a port number want a non-empty identifier without control characters is not a positive duration such as 10s want whole seconds from 1s to 4294967295s (MQTT counts it in seconds) is not a positive number (max_payload at most 268435455) want true or false want binary or structured is a TLS option: use mqtts:// unknown option the mqtt sink takes topic_template, client_id, session_expiry, ack_timeout, max_in_flight, max_payload, require_subscribers, ce, ce_source and, with mqtts, tls_ca, tls_cert and tls_key topic_template: template has a placeholder more than once ({{topic}} or {{topic|dashes}}) unknown placeholder unclosed placeholder in template: templates take {{topic}} or {{topic|dashes}} empty topic the wildcards + and # cannot be published to topics starting with $ are the server's own ($SYS...): put topics under a prefix of your own with topic_template=prefix/{{topic}} not UTF-8, or has a control character " + cloudevents.ErrorText
