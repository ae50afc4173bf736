package sinkurl

import (
	"context"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/wharfhq/wharf"
)

// errWouldOpenFile stands for a file sink the fuzz registry does not open:
// fuzzed paths must not create files anywhere on the machine.
var errWouldOpenFile = errors.New("file sink accepted")

// fuzzRegistry is the built-in registry with the file opener cut off just
// before it touches the file system: every check of the URL still runs,
// through the real openFile, on a URL whose path it is given separately.
func fuzzRegistry(seen *[]*url.URL) *registry {
	r := newRegistry()
	r.openers["file"] = func(ctx context.Context, u *url.URL, shown string) (wharf.Sink, error) {
		*seen = append(*seen, u)
		if u.Opaque != "" {
			if _, err := url.PathUnescape(u.Opaque); err != nil {
				return openFile(ctx, u, shown) // fails before any open
			}
		}
		return checkFileURL(u, shown)
	}
	r.openers["dummy"] = func(_ context.Context, u *url.URL, shown string) (wharf.Sink, error) {
		return nil, errors.New("sink URL " + strings.ReplaceAll(shown, "\n", " ") + ": dummy")
	}
	return r
}

// checkFileURL runs openFile on u with its path moved under a directory
// that does not exist, so that openFile's own checks decide and the open
// itself fails without creating anything.
func checkFileURL(u *url.URL, shown string) (wharf.Sink, error) {
	probe := *u
	const jail = "/nonexistent-wharf-fuzz-dir/"
	switch {
	case probe.Opaque != "":
		p, _ := url.PathUnescape(probe.Opaque)
		probe.Opaque = ""
		probe.Path = jail + strings.ReplaceAll(p, "..", "__")
	case probe.Path != "":
		probe.Path = jail + strings.ReplaceAll(probe.Path, "..", "__")
		probe.RawPath = ""
	}
	s, err := openFile(context.Background(), &probe, shown)
	if err == nil {
		_ = s.Close()
		return nil, errors.New("fuzz: a file under " + jail + " was opened")
	}
	if strings.Contains(err.Error(), "does not exist: create it") {
		return nil, errWouldOpenFile // every check passed: Open would open the file
	}
	return nil, err
}

// FuzzOpen checks Open on any text: it never panics; an error is one line
// and never holds the URL's password; an accepted URL is accepted again in
// its normalised form with the same kind of sink; and a bare scheme name
// means the same as the scheme with a colon.
func FuzzOpen(f *testing.F) {
	for _, s := range []string{
		"", "stdout", "stdout:", "STDOUT", "stdout://", "null:", "null://host", "file:///var/log/x.jsonl",
		"file:rel/x.jsonl", "file://localhost/x.jsonl", "file://var/log/x.jsonl", "file:///tmp/",
		"file:%zz", "file:///x?sync=0", "file://u:p4ssw0rd@host/x", "kafak://x", "out.jsonl", "/abs/x.jsonl",
		"dummy://user:hunter2secret@host:1/x", "dummy://user:pa/ss?w#rd@host", "dummy://u:p%zzword@h",
		"stdout:\nfile:x", "dummy://:@", "dummy://a:b@c@d", "  null:  ", "C:\\x.jsonl",
	} {
		f.Add(s)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw string) {
		var seen []*url.URL
		r := fuzzRegistry(&seen)
		s, err := r.open(ctx, raw)
		if s != nil {
			_ = s.Close()
		}
		if err == nil && s == nil {
			t.Fatalf("Open(%q): nil sink and nil error", raw)
		}
		if err != nil && !errors.Is(err, errWouldOpenFile) {
			msg := err.Error()
			if strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("Open(%q): error is not one line: %q", raw, msg)
			}
			if pw, ok := password(raw); ok && strings.Contains(msg, pw) {
				t.Fatalf("Open(%q): error shows the password %q: %s", raw, pw, msg)
			}
		}
		// Deterministic.
		var seen2 []*url.URL
		s2, err2 := fuzzRegistry(&seen2).open(ctx, raw)
		if s2 != nil {
			_ = s2.Close()
		}
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("Open(%q) twice: %v, then %v", raw, err, err2)
		}
		if reflect.TypeOf(s) != reflect.TypeOf(s2) {
			t.Fatalf("Open(%q) twice: %T, then %T", raw, s, s2)
		}
		accepted := err == nil || errors.Is(err, errWouldOpenFile)
		if !accepted {
			return
		}
		// An accepted URL, written back by net/url, is accepted again and
		// means the same sink.
		var u *url.URL
		if len(seen) > 0 {
			u = seen[0]
		} else {
			trimmed := strings.TrimSpace(raw)
			if r.lookup(strings.ToLower(trimmed)) != nil {
				trimmed += ":"
			}
			var perr error
			if u, perr = url.Parse(trimmed); perr != nil {
				t.Fatalf("Open(%q) accepted a URL net/url rejects: %v", raw, perr)
			}
		}
		again := u.String()
		if again != strings.TrimSpace(again) {
			// Open trims the text it is given, so a normal form that
			// starts or ends with a space (a file named " ", from
			// "file: #") is not the same URL to it. See the report.
			return
		}
		var seen3 []*url.URL
		s3, err3 := fuzzRegistry(&seen3).open(ctx, again)
		if s3 != nil {
			_ = s3.Close()
		}
		if err3 != nil && !errors.Is(err3, errWouldOpenFile) {
			t.Fatalf("Open(%q) accepted, but its normal form %q is refused: %v", raw, again, err3)
		}
		if (err == nil) != (err3 == nil) || reflect.TypeOf(s) != reflect.TypeOf(s3) {
			t.Fatalf("Open(%q) gave %T, %v; its normal form %q gave %T, %v", raw, s, err, again, s3, err3)
		}
		if len(seen) > 0 {
			if len(seen3) == 0 || filePath(seen[0]) != filePath(seen3[0]) {
				t.Fatalf("file URL %q names %q, its normal form %q names another file", raw, filePath(seen[0]), again)
			}
		}
	})
}

// FuzzOpenPassword puts a distinctive password, with whatever characters the
// fuzzer chooses in its middle (unescaped '/', '?', '#', '@', ':' and
// invalid escapes included), into URLs of every built-in and a registered
// scheme, and checks no error shows it.
func FuzzOpenPassword(f *testing.F) {
	f.Add("file", "user", "s3cr3t", "host", "/x.jsonl")
	f.Add("dummy", "user", "pa/ss", "host:5", "/vhost?x=1")
	f.Add("dummy", "", "a?b#c", "h", "")
	f.Add("null", "u", "%zz", "h", "")
	f.Add("stdout", "u", "p@q:r", "h", "#frag")
	f.Add("kafak", "u", "x\ny", "h", "")
	f.Add("dummy", "u\n", "zz", "h\r", "/\n")
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, scheme, user, pass, host, rest string) {
		if strings.ContainsAny(scheme, ":/?#@") || strings.ContainsAny(user, "/?#") {
			// Then the text after "://" is a path, a query or a
			// fragment, not user info: "0:///:x@h" has no password.
			return
		}
		pw := "Qv7" + pass + "Jk2"
		raw := scheme + "://" + user + ":" + pw + "@" + host + rest
		if strings.Count(raw, pw) != 1 || strings.Contains(user+host+rest+scheme, "Qv7") || strings.Contains(user+host+rest+scheme, "Jk2") {
			return // the password text is also elsewhere in the URL
		}
		var seen []*url.URL
		_, err := fuzzRegistry(&seen).open(ctx, raw)
		if err == nil || errors.Is(err, errWouldOpenFile) {
			return
		}
		msg := err.Error()
		if strings.ContainsAny(msg, "\r\n") {
			t.Fatalf("Open(%q): error is not one line: %q", raw, msg)
		}
		if strings.Contains(msg, pw) {
			t.Fatalf("Open(%q): error shows the password %q: %s", raw, pw, msg)
		}
		// Its escaped and unescaped forms are the password too.
		if dec, derr := url.PathUnescape(pw); derr == nil && len(dec) >= 6 && strings.Contains(msg, dec) {
			t.Fatalf("Open(%q): error shows the unescaped password %q: %s", raw, dec, msg)
		}
	})
}

// password returns the password url.Parse sees in raw, when it is long and
// distinctive enough that finding it in an error can only mean it leaked.
func password(raw string) (string, bool) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.User == nil {
		return "", false
	}
	p, ok := u.User.Password()
	if !ok || len(p) < 6 || p == "xxxxx" || strings.Count(raw, p) != 1 {
		return "", false
	}
	// Text the messages hold whatever the URL; a password inside it cannot
	// be told from it.
	for _, fixed := range []string{"sink URL", "the file sink takes no user, query or fragment: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl", "unknown sink scheme", "use one of file, null, stdout, dummy", "has no scheme", "is malformed", "expected e.g. stdout: or file:///var/log/wharf.jsonl", "dummy"} {
		if strings.Contains(fixed, p) {
			return "", false
		}
	}
	return p, true
}

func filePath(u *url.URL) string {
	if u.Opaque != "" {
		p, _ := url.PathUnescape(u.Opaque)
		return p
	}
	return u.Path
}
