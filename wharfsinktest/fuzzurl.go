package wharfsinktest

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// FuzzURL fuzzes a sink's URL parser on any URL net/url accepts and checks
// that it never panics, that an error is one line and never shows the URL's
// password, and that an accepted URL written back by net/url parses to an
// equal configuration. errorText is the fixed text of the parser's errors: a
// password found in it could appear in an error without leaking, so it is
// not checked. check, when not nil, tests an accepted configuration further.
func FuzzURL(f *testing.F, seeds []string, errorText string, parse func(*url.URL) (any, error),
	check func(t *testing.T, raw string, u *url.URL, cfg any)) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		cfg, err := parse(u)
		if err != nil {
			msg := err.Error()
			if strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("parse(%q): error is not one line: %q", raw, msg)
			}
			if pw, ok := distinctivePassword(u, raw, errorText); ok && strings.Contains(msg, pw) {
				t.Fatalf("parse(%q): error shows the password %q: %s", raw, pw, msg)
			}
			return
		}
		again := u.String()
		u2, err := url.Parse(again)
		if err != nil {
			t.Fatalf("parse(%q) accepted a URL whose normal form %q does not parse: %v", raw, again, err)
		}
		cfg2, err := parse(u2)
		if err != nil {
			t.Fatalf("parse(%q) accepted, its normal form %q is refused: %v", raw, again, err)
		}
		if !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("parse(%q) and parse(%q) differ:\n%#v\n%#v", raw, again, cfg, cfg2)
		}
		if check != nil {
			check(t, raw, u, cfg)
		}
	})
}

// distinctivePassword returns u's password when it is distinctive enough
// (long, once in the URL, not part of the errors' fixed text) that finding
// it in an error can only mean it leaked.
func distinctivePassword(u *url.URL, raw, errorText string) (string, bool) {
	if u.User == nil {
		return "", false
	}
	p, ok := u.User.Password()
	if !ok || len(p) < 6 || p == "xxxxx" || strings.Count(raw, p) != 1 || strings.Contains(errorText, p) {
		return "", false
	}
	return p, true
}
