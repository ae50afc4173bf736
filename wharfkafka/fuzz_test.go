package wharfkafka

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseURL checks the kafka:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
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
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		cfg, err := func() (any, error) { o, tl, err := parseURL(u); return [2]any{o, tl}, err }()
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
		cfg2, err := func() (any, error) { o, tl, err := parseURL(u2); return [2]any{o, tl}, err }()
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
	const fixed = "sink URL wharfkafka opens kafka:// URLs the kafka sink takes no user or password in the URL: for SASL build the sink with wharfkafka.New and kgo.SASL write kafka://host:port[,host:port]?option=value names no broker: unknown option the kafka sink takes topic_template, client_id, max_message_bytes, delivery_timeout, compression and tls is not a positive number of bytes is not a positive duration such as 30s want snappy, lz4, zstd, gzip or none want true or false"
	if strings.Contains(fixed, p) {
		return "", false
	}
	return p, true
}
