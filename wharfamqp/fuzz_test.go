package wharfamqp

import (
	"net/url"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// FuzzParseURL checks the amqp:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	wharfsinktest.FuzzURL(f, []string{
		"amqp://mq?ce=binary&ce_source=/svc", "amqp://mq?ce=bogus", "amqp://mq?ce_source=/s",
		"amqp://guest:guest@127.0.0.1:5672/",
		"amqps://u:s3cr3tpw@h:5671/vh?exchange=ex&routing_key_template={{topic}}.{{key}}&mandatory=false&strict_order=true&confirm_timeout=5s&dial_timeout=2s&max_in_flight=10&max_message_size=0&name=n&heartbeat=10&cacertfile=/ca&certfile=/c&keyfile=/k&server_name_indication=x",
		"amqp://h?heartbeat=0",
		"amqp://h?cacertfile=/x",
		"amqp://h:99999",
		"amqp://h,h2",
		"amqp://h?exchange={{key}}",
		"amqp://h?routing_key_template=amq.x",
		"amqp://h?bogus=1",
		"amqp:opaque",
		"amqp://h#f",
		"amqps://h?certfile=/c",
		"amqp://:5672",
		"amqp://u:p%zz@h",
	}, fuzzErrorText,
		func(u *url.URL) (any, error) { return parseURL(u) },
		func(t *testing.T, raw string, u *url.URL, cfg any) {
			// The URI handed to the AMQP library keeps only its own options
			// and parses again to the same connection settings.
			c, ok := cfg.(urlConfig)
			if !ok {
				t.Fatalf("unexpected config type %T", cfg)
			}
			lib, err := url.Parse(c.uri)
			if err != nil {
				t.Fatalf("parseURL(%q): the library URI %q does not parse: %v", raw, c.uri, err)
			}
			if lib.Host != u.Host || lib.Path != u.Path || lib.User.String() != u.User.String() || lib.Scheme != u.Scheme {
				t.Fatalf("parseURL(%q): the library URI %q names another server", raw, c.uri)
			}
			for k := range lib.Query() {
				switch k {
				case "heartbeat", "cacertfile", "certfile", "keyfile", "server_name_indication":
				default:
					t.Fatalf("parseURL(%q): the library URI %q passes on the sink option %q", raw, c.uri, k)
				}
			}
		})
}

// fuzzErrorText is the fixed text of parseURL's errors.
const fuzzErrorText = "sink URL wharfamqp opens amqp:// and amqps:// URLs write ://user:password@host:port/vhost?option=value names no host, or several: port is not a port number want true or false is not a positive duration such as 10s is not a positive number of messages is not a number of bytes (0 turns the check off) is not a number of seconds (0 to 65535) heartbeat=0 turns heartbeats off, and with them the detection of a dead connection: give a number of seconds is a TLS option: use amqps:// unknown option the amqp sink takes exchange, routing_key_template, mandatory, strict_order, confirm_timeout, max_in_flight, max_message_size, dial_timeout, name, heartbeat and, with amqps, cacertfile, certfile, keyfile and server_name_indication has {{key}}: only {{topic}} may name the exchange (put the key in routing_key_template) on the default exchange names the broker's own queues (amq.*), which the sink refuses: name an exchange of yours with exchange=, or use another routing key exchange is bytes, over AMQP's 255 certfile and keyfile go together" + " " + cloudevents.ErrorText
