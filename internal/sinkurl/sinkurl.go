// Package sinkurl opens the sink a URL names, such as the value of the CLI's
// --sink flag: "stdout:", "file:///var/log/wharf.jsonl", "null:", and the
// broker schemes other packages add with [Register].
//
// Every error it returns is one line that names the bad value and says how to
// fix it, and never shows a password from the URL, because these errors end
// up in terminals and logs.
package sinkurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/textsink"
)

// opener opens a sink from its parsed URL; shown is the URL as typed, with
// any password hidden, for its error messages.
type opener func(ctx context.Context, u *url.URL, shown string) (wharf.Sink, error)

// registry maps schemes to openers. It is a type, not just package state, so
// tests can exercise registration without changing what Open knows.
type registry struct {
	mu      sync.RWMutex
	openers map[string]opener
}

func newRegistry() *registry {
	return &registry{openers: map[string]opener{
		"file":   openFile,
		"null":   openNull,
		"stdout": openStdout,
	}}
}

var schemes = newRegistry()

// Register adds a sink scheme, so that broker sinks can live in their own
// packages and be linked in only when used. open gets the parsed URL; its
// errors must not echo the URL's password (use url.URL.Redacted). Register
// panics when scheme is not a lowercase URL scheme, is already registered, or
// open is nil: these are programming errors, best found at init time.
func Register(scheme string, open func(context.Context, *url.URL) (wharf.Sink, error)) {
	schemes.register(scheme, adapt(open))
}

// adapt turns a registered opener into the internal kind; nil stays nil so
// register can reject it.
func adapt(open func(context.Context, *url.URL) (wharf.Sink, error)) opener {
	if open == nil {
		return nil
	}
	return func(ctx context.Context, u *url.URL, _ string) (wharf.Sink, error) { return open(ctx, u) }
}

// Schemes lists the registered schemes, sorted, for help texts and errors.
func Schemes() []string { return schemes.list() }

// Open returns the sink a URL names:
//
//   - "stdout:" (also "stdout" and "stdout://"): JSON lines on standard output;
//   - "file:///abs/path.jsonl" (also "file:relative/path.jsonl"): JSON lines
//     appended to a file, fsynced before each acknowledgement;
//   - "null:": acknowledges everything at once, for benchmarks (a *[NullSink]);
//   - any scheme added with [Register].
//
// A bare scheme name such as "stdout" is accepted because it is what people
// type on a command line.
func Open(ctx context.Context, raw string) (wharf.Sink, error) { return schemes.open(ctx, raw) }

func (r *registry) register(scheme string, open opener) {
	if !validScheme(scheme) {
		panic(fmt.Sprintf("sinkurl: Register: invalid scheme %q: want lowercase letters, digits, '+', '-' or '.', starting with a letter", scheme))
	}
	if open == nil {
		panic(fmt.Sprintf("sinkurl: Register: nil opener for scheme %q", scheme))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.openers[scheme]; dup {
		panic(fmt.Sprintf("sinkurl: Register: scheme %q registered twice", scheme))
	}
	r.openers[scheme] = open
}

func (r *registry) list() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s := make([]string, 0, len(r.openers))
	for k := range r.openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

func (r *registry) lookup(scheme string) opener {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.openers[scheme]
}

func validScheme(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func (r *registry) open(ctx context.Context, raw string) (wharf.Sink, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fmt.Errorf("sink URL is empty: pass --sink (one of: %s)", strings.Join(r.list(), ", "))
	}
	if r.lookup(strings.ToLower(raw)) != nil {
		raw += ":"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("sink URL %q is malformed: %s; expected e.g. stdout: or file:///var/log/wharf.jsonl", redact(raw), parseProblem(raw))
	}
	if u.Scheme == "" {
		// The suggestion is built from the redacted text, and quoted when
		// it holds a control character, so the error stays one line and
		// shows no password.
		shown := redact(raw)
		hint := fileURLFor(shown)
		if strings.IndexFunc(hint, func(c rune) bool { return c < 0x20 || c == 0x7f }) >= 0 {
			hint = fmt.Sprintf("%q", hint)
		}
		return nil, fmt.Errorf("sink URL %q has no scheme: for a file write %s, or use one of %s", shown, hint, strings.Join(r.list(), ", "))
	}
	open := r.lookup(u.Scheme) // url.Parse lowercased the scheme
	if open == nil {
		return nil, fmt.Errorf("unknown sink scheme %q in %q: use one of %s", u.Scheme, redact(raw), strings.Join(r.list(), ", "))
	}
	return open(ctx, u, redact(raw))
}

// redact hides the password of a URL that may not even parse. Beyond what
// url.URL.Redacted does, it treats everything between the first ':' and the
// last '@' of the authority as the password, so that a password with an
// unescaped '/', '?' or '#' (which url.Parse splits elsewhere) is hidden too.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			raw = u.Redacted() // only then, to echo other URLs as typed
		}
	}
	i := strings.Index(raw, "://")
	if i < 0 {
		return redactOpaque(raw)
	}
	rest := raw[i+3:]
	if strings.HasPrefix(rest, "/") {
		return raw // no authority, e.g. file:///path, whose ':' and '@' are a path's
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return raw
	}
	colon := strings.IndexByte(rest[:at], ':')
	if colon < 0 || rest[colon+1:at] == "xxxxx" {
		return raw
	}
	return raw[:i+3] + rest[:colon+1] + "xxxxx" + rest[at:]
}

// redactOpaque hides the password of a URL typed without "//", such as
// user:password@host:port with the scheme forgotten (url.Parse then takes the
// user for a scheme and the rest for opaque data, with no user info to
// redact): everything from the first ':' to the last '@', unless a path
// follows the ':' or the URL is a file: one (whose ':' and '@' are a path's).
func redactOpaque(raw string) string {
	colon := strings.IndexByte(raw, ':')
	at := strings.LastIndexByte(raw, '@')
	if colon < 0 || at < colon || strings.EqualFold(raw[:colon], "file") || strings.HasPrefix(raw[colon+1:], "/") || raw[colon+1:at] == "xxxxx" {
		return raw
	}
	return raw[:colon+1] + "xxxxx" + raw[at:]
}

// parseProblem explains why raw does not parse without quoting the password:
// url.Parse's error repeats the whole URL and its detail may quote a piece of
// the password, so the redacted URL is parsed again for the explanation.
func parseProblem(raw string) string {
	_, err := url.Parse(redact(raw))
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	if err != nil {
		return err.Error()
	}
	return "its user name or password has a character that must be percent-encoded"
}

// fileURLFor suggests the file URL a scheme-less value probably meant.
func fileURLFor(path string) string {
	if filepath.IsAbs(path) {
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String()
	}
	return "file:" + path
}

// checkBare rejects parts of a URL a built-in scheme has no use for, rather
// than ignoring what may be a typo or an option of a later version.
func checkBare(u *url.URL, shown, want string) error {
	if u.User != nil || u.Host != "" || u.Path != "" || u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("sink URL %q: the %s sink takes no host, path or options: write %s", shown, u.Scheme, want)
	}
	return nil
}

func openStdout(_ context.Context, u *url.URL, shown string) (wharf.Sink, error) {
	if err := checkBare(u, shown, "stdout:"); err != nil {
		return nil, err
	}
	return textsink.Stdout(), nil
}

func openNull(_ context.Context, u *url.URL, shown string) (wharf.Sink, error) {
	if err := checkBare(u, shown, "null:"); err != nil {
		return nil, err
	}
	return &NullSink{}, nil
}

func openFile(_ context.Context, u *url.URL, shown string) (wharf.Sink, error) {
	const how = "write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl"
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("sink URL %q: the file sink takes no user, query or fragment: %s", shown, how)
	}
	if u.Host != "" && u.Host != "localhost" {
		// file://var/log/x.jsonl parses with host "var": a missing slash.
		return nil, fmt.Errorf("sink URL %q names host %q, but the file sink only writes local files: %s", shown, u.Host, how)
	}
	path := u.Path
	if u.Opaque != "" {
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return nil, fmt.Errorf("sink URL %q has a malformed path: %w: %s", shown, err, how)
		}
		path = p
	}
	if path == "" {
		return nil, fmt.Errorf("sink URL %q has no file path: %s", shown, how)
	}
	if strings.HasSuffix(path, "/") {
		return nil, fmt.Errorf("sink URL %q names a directory, not a file: %s", shown, how)
	}
	if runtime.GOOS == "windows" && len(path) >= 3 && path[0] == '/' && path[2] == ':' {
		path = path[1:] // file:///C:/dir/x.jsonl
	}
	return textsink.OpenFile(filepath.FromSlash(path))
}

// NullSink acknowledges every message at once without sending it anywhere,
// to measure the relay without a broker's cost. It counts what it was given
// so a benchmark can check that everything arrived.
type NullSink struct {
	n atomic.Int64
}

// Publish acknowledges msgs without looking at them.
func (s *NullSink) Publish(_ context.Context, msgs []*wharf.Message) []error {
	s.n.Add(int64(len(msgs)))
	return nil
}

// Close does nothing: the sink holds no resources.
func (s *NullSink) Close() error { return nil }

// Count returns how many messages Publish acknowledged so far.
func (s *NullSink) Count() int64 { return s.n.Load() }
