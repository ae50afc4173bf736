package wharfredis

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseURL checks the redis:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
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
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		cfg, err := parseURL(u)
		if err != nil {
			msg := err.Error()
			if strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("parseURL(%q): error is not one line: %q", raw, msg)
			}
			if pw, ok := fuzzPassword(u, raw); ok && strings.Contains(msg, pw) {
				t.Fatalf("parseURL(%q): error shows the password %q: %s", raw, pw, msg)
			}
			return
		}
		again := u.String()
		u2, err := url.Parse(again)
		if err != nil {
			t.Fatalf("parseURL(%q) accepted a URL whose normal form %q does not parse: %v", raw, again, err)
		}
		cfg2, err := parseURL(u2)
		if err != nil {
			t.Fatalf("parseURL(%q) accepted, its normal form %q is refused: %v", raw, again, err)
		}
		if !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("parseURL(%q) and parseURL(%q) differ:\n%#v\n%#v", raw, again, cfg, cfg2)
		}
	})
}

// fuzzPassword returns u's password when it is distinctive enough (long,
// once in the URL, not part of the fixed text of the errors) that finding
// it in an error can only mean it leaked.
func fuzzPassword(u *url.URL, raw string) (string, bool) {
	if u.User == nil {
		return "", false
	}
	p, ok := u.User.Password()
	if !ok || len(p) < 6 || p == "xxxxx" || strings.Count(raw, p) != 1 {
		return "", false
	}
	const fixed = "sink URL wharfredis opens redis:// and rediss:// URLs write redis://[user:password@]host:port[/db]?option=value the path is not a database number: write redis://host:port/0 is not a whole number of entries (0 for no trimming) is not a positive duration such as 10s a Redis client name cannot hold spaces is not a positive number of bytes unknown option the redis sink takes stream_template, maxlen, timeout, name and max_payload stream_template: template has {{topic}} more than once"
	if strings.Contains(fixed, p) {
		return "", false
	}
	return p, true
}
