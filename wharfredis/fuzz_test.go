package wharfredis

import (
	"net/url"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// FuzzParseURL checks the redis:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	wharfsinktest.FuzzURL(f, []string{
		"redis://h?ce=structured&ce_source=/svc", "redis://h?ce=bogus", "redis://h?ce_source=/s",
		"redis://127.0.0.1:6379",
		"rediss://u:s3cr3tpw@h:6380/3?stream_template=s.{{topic}}&maxlen=10&timeout=2s&name=n&max_payload=100",
		"redis://h/x",
		"redis://h/-1",
		"redis://h?name=a%20b",
		"redis://h?bogus=1",
		"redis:opaque",
		"redis://h,h2",
		"redis://h#f",
		"redis://:p4ssw0rd@h",
		"redis://h?stream_template={{topic}}{{topic}}",
		"redis://h?maxlen=-1",
		"redis://h?timeout=0s",
	}, fuzzErrorText,
		func(u *url.URL) (any, error) { return parseURL(u) },
		nil)
}

// fuzzErrorText is the fixed text of parseURL's errors.
const fuzzErrorText = "sink URL wharfredis opens redis:// and rediss:// URLs write redis://[user:password@]host:port[/db]?option=value the path is not a database number: write redis://host:port/0 is not a whole number of entries (0 for no trimming) is not a positive duration such as 10s a Redis client name cannot hold spaces is not a positive number of bytes unknown option the redis sink takes stream_template, maxlen, timeout, name and max_payload stream_template: template has a placeholder more than once ({{topic}} or {{topic|dashes}}) unknown placeholder unclosed placeholder in template: templates take {{topic}} or {{topic|dashes}}" + " " + cloudevents.ErrorText
