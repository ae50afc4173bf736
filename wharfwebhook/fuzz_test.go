package wharfwebhook

import (
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/wharfhq/wharf/internal/cloudevents"
)

// FuzzParseURL checks the http(s):// sink URL parser on any URL net/url
// accepts: it never panics; an error is one line and shows neither the
// password nor anything RedactURL hides (later path segments, query
// values); an accepted URL written back by net/url parses to the same
// options; and the destination keeps every query parameter but the sink's.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"https://example.com/hook", "http://u:s3cr3tpw@example.com/in/{{topic}}?code=T0k3nT0k3n",
		"https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXX",
		"https://h/x?wharf_mode=batch&wharf_batch_size=10&wharf_concurrency=2&wharf_timeout=3s&wharf_permanent_status=400,410&wharf_allow_private=true&wharf_header_X-Api=k",
		"https://h/x?wharf_mode=single&wharf_batch_size=5", "https://h/x?wharf_secret=abc", "https://h/x?wharf_secret_env=&x=1",
		"https://h/x?wharf_secret_env=A&wharf_secret_file=/f", "https://h/x?wharf_bogus=1", "https://h/x?WHARF_MODE=batch",
		"https://h/x?%zz=1", "https://h/x?wharf_mode=%zz", "ftp://h/x", "https:opaque", "https://h/x#frag",
		"http://2130706433/", "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]/", "https://h/x?q={{topic}}",
		"https://h/x?wharf_permanent_status=none", "https://h/x?wharf_permanent_status=399", "https://h/x?wharf_header_Bad%20Name=v",
		"https://h/%7B%7Btopic%7D%7D/x", "https://h/x?wharf_header_X=a%0Ab",
		"https://h/x?wharf_ce=binary&wharf_ce_source=urn:svc", "https://h/x?wharf_ce=structured&wharf_mode=batch",
		"https://h/x?wharf_ce=binary&wharf_mode=batch", "https://h/x?wharf_ce=bogus", "https://h/x?wharf_ce_source=/s",
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
			for _, s := range hiddenParts(u, raw) {
				if strings.Contains(msg, s) {
					t.Fatalf("parseURL(%q): error shows %q, which RedactURL hides: %s", raw, s, msg)
				}
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
		// The destination is the URL without the sink's own options: same
		// scheme, host and path, and the other parameters in order.
		d, err := url.Parse(cfg.opts.URL)
		if err != nil {
			t.Fatalf("parseURL(%q): destination %q does not parse: %v", raw, cfg.opts.URL, err)
		}
		if d.Scheme != u.Scheme || d.Host != u.Host || d.EscapedPath() != u.EscapedPath() {
			t.Fatalf("parseURL(%q): destination %q is another place", raw, cfg.opts.URL)
		}
		var keep []string
		for part := range strings.SplitSeq(u.RawQuery, "&") {
			k, _, _ := strings.Cut(part, "=")
			if dk, err := url.QueryUnescape(k); part != "" && err == nil && !strings.HasPrefix(strings.ToLower(dk), "wharf_") {
				keep = append(keep, part)
			}
		}
		if d.RawQuery != strings.Join(keep, "&") {
			t.Fatalf("parseURL(%q): destination query %q, want %q", raw, d.RawQuery, strings.Join(keep, "&"))
		}
		// Once normal, the form shown in logs is stable. (Before, a path
		// net/url keeps as typed because it is not validly escaped, such
		// as "/a b", is shown as typed: see the report.)
		u3, err := url.Parse(u2.String())
		if err != nil {
			t.Fatalf("%q: normal form %q does not parse: %v", raw, u2.String(), err)
		}
		if shown, shown3 := redactURL(u2), redactURL(u3); shown != shown3 {
			t.Fatalf("%q is shown as %q, but written again as %q", again, shown, shown3)
		}
	})
}

// hiddenParts returns the parts of u that errors must not show: the
// password, the query values other than the sink's own options, and the
// path segments RedactURL hides; each only when it is long and found once in
// raw, so that seeing it in an error can only mean it leaked.
// fixedText is text the errors hold whatever the URL.
const fixedText = TopicPlaceholder + " is only replaced in the path, not in the query; " + optionNames + " " + cloudevents.ErrorText

func hiddenParts(u *url.URL, raw string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 8 && strings.Count(raw, s) == 1 && !strings.Contains(u.Host, s) && !strings.Contains(u.Scheme, s) &&
			!strings.Contains(fixedText, s) {
			out = append(out, s)
		}
	}
	if u.User != nil {
		p, _ := u.User.Password()
		add(p)
	}
	for part := range strings.SplitSeq(u.RawQuery, "&") {
		if k, v, ok := strings.Cut(part, "="); ok && !strings.HasPrefix(strings.ToLower(k), "wharf_") {
			add(v)
		}
	}
	segs := strings.Split(templatePath(u), "/")
	shown := strings.Split(redactPath(templatePath(u)), "/")
	for i := range segs {
		if shown[i] == hidden {
			add(segs[i])
		}
	}
	return out
}
