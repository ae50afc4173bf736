package wharfnats

import (
	"net/url"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// FuzzParseURL checks the nats:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	wharfsinktest.FuzzURL(f, []string{
		"nats://n1?ce=structured&ce_source=/svc", "nats://n1?ce=bogus", "nats://n1?ce_source=/s",
		"nats://127.0.0.1:4222",
		"nats://u:s3cr3tpw@h1:4222,h2:4222?stream=S&create_stream=true&subject_template=app.{{topic}}",
		"nats://h?ack_timeout=10s&strict_order=true&name=x&tls=true",
		"nats://h?subject_template=$JS.{{topic}}",
		"nats://h?subject_template=$JS.x&allow_system_subjects=true",
		"nats://h?create_stream=maybe",
		"nats://h?bogus=1",
		"nats://h/path",
		"nats:opaque",
		"nats://,",
		"nats://u:p%41ss@h#f",
		"nats://h?ack_timeout=-1s",
		"nats://h?create_stream=true",
		"nats://h?subject_template={{topic}}{{topic}}",
	}, fuzzErrorText,
		func(u *url.URL) (any, error) { return parseURL(u) },
		nil)
}

// fuzzErrorText is the fixed text of parseURL's errors.
const fuzzErrorText = "sink URL wharfnats opens nats:// URLs write nats://host:port[,host:port]?option=value names no server: unknown option: the nats sink takes subject_template, stream, create_stream, ack_timeout, strict_order, allow_system_subjects, name and tls want true or false is not a positive duration such as 10s create_stream=true needs stream=NAME needs a subject_template of the form prefix.{{topic}} (the stream takes prefix.>), not use a prefix of your own, or add allow_system_subjects=true template has a placeholder more than once ({{topic}} or {{topic|dashes}}) unknown placeholder unclosed placeholder in template: templates take {{topic}} or {{topic|dashes}}" + " " + cloudevents.ErrorText
