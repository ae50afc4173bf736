package wharfnats

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseURL checks the nats:// URL parser on any URL net/url accepts:
// it never panics; an error is one line and never shows the password; an
// accepted URL written back by net/url parses to the same configuration.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
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
	const fixed = "sink URL wharfnats opens nats:// URLs write nats://host:port[,host:port]?option=value names no server: unknown option: the nats sink takes subject_template, stream, create_stream, ack_timeout, strict_order, allow_system_subjects, name and tls want true or false is not a positive duration such as 10s create_stream=true needs stream=NAME needs a subject_template of the form prefix.{{topic}} (the stream takes prefix.>), not use a prefix of your own, or add allow_system_subjects=true template has {{topic}} more than once"
	if strings.Contains(fixed, p) {
		return "", false
	}
	return p, true
}
