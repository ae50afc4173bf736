// Package textsink implements the sinks that write messages as JSON lines: to
// standard output (stdout:) and appended to a file (file:///path.jsonl).
//
// Each message becomes one line:
//
//	{"id":123,"topic":"orders","key":"k1","headers":{"a":"b"},"payload":{...}}
//
// The payload is embedded as JSON when it is valid UTF-8 JSON, so that tools
// like jq can read it directly; anything else is base64 and marked with
// "payload_encoding":"base64", so that no byte is lost or altered.
package textsink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
)

// maxKeptBuffer bounds the encode buffer a sink keeps between batches, so one
// huge batch does not pin its memory for the life of the relay.
const maxKeptBuffer = 4 << 20

type sink struct {
	mu     sync.Mutex
	w      io.Writer
	sync   func() error
	close  func() error
	name   string // names the destination in errors
	closed bool
	// torn is set when a failed write may have left a partial line behind;
	// the next batch then starts with a newline so its first line parses.
	torn bool
	enc  encoder
}

// NewWriter returns a sink writing JSON lines to w. It acknowledges a batch
// only after one Write of the whole batch returned without error and, when
// sync != nil, after sync() returned nil: a sink must not acknowledge what the
// destination has not durably accepted, and only the caller knows what makes w
// durable. Close does not close w, because the caller owns it.
func NewWriter(w io.Writer, sync func() error) wharf.Sink {
	return &sink{w: w, sync: sync, name: "writer"}
}

// OpenFile opens path with O_WRONLY|O_CREATE|O_APPEND (mode 0644), never
// truncating, because the file is a log that earlier runs and other relay
// processes also append to. Each Publish writes the whole batch with one write
// call, so appends of several processes do not interleave within a line on a
// local file system, and fsyncs before acknowledging. Close closes the file.
func OpenFile(path string) (wharf.Sink, error) {
	if path == "" {
		return nil, errors.New("textsink: file sink path is empty")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		cause := err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			cause = pe.Err // the path is in our message already
		}
		dir := filepath.Dir(path)
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
				return nil, &hintError{fmt.Sprintf("textsink: cannot open %q: directory %q does not exist: create it or choose another path", path, dir), cause}
			}
		}
		return nil, fmt.Errorf("textsink: cannot open %q for appending: %w", path, cause)
	}
	// fsync of the file alone does not make a newly created directory entry
	// durable; without this a crash could lose a file whose lines were acked.
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, fmt.Errorf("textsink: cannot fsync directory of %q: %w", path, err)
	}
	return &sink{w: f, sync: f.Sync, close: f.Close, name: path}, nil
}

// hintError says what to do instead of repeating what the system said, and
// still matches the system's error with errors.Is.
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// Stdout returns a sink writing to os.Stdout. It acknowledges once the write
// returned: a pipe or terminal offers nothing more durable to wait for. Its
// Close does nothing, because the process owns standard output.
func Stdout() wharf.Sink {
	return &sink{w: os.Stdout, name: "stdout"}
}

func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil // directories cannot be opened for FlushFileBuffers there
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	err = d.Sync()
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, syscall.EINVAL) {
		return nil // the file system has no directory fsync; nothing to wait for
	}
	return err
}

func (s *sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Waiting for the lock may have outlasted the context.
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), err)
	}
	if s.closed {
		return wharf.FailAll(len(msgs), &fs.PathError{Op: "write", Path: s.name, Err: fs.ErrClosed})
	}

	buf := s.enc.buf[:0]
	if s.torn {
		buf = append(buf, '\n')
	}
	for _, m := range msgs {
		buf = s.enc.appendMessage(buf, m)
		buf = append(buf, '\n')
	}
	n, err := s.w.Write(buf)
	if err == nil && n != len(buf) {
		err = io.ErrShortWrite // a broken io.Writer; never ack a partial batch
	}
	n = max(0, min(n, len(buf)))
	if err != nil {
		if n > 0 {
			s.torn = buf[n-1] != '\n'
		}
	} else {
		s.torn = false
	}
	if cap(buf) <= maxKeptBuffer {
		s.enc.buf = buf[:0]
	} else {
		s.enc.buf = nil
	}
	if err != nil {
		return wharf.FailAll(len(msgs), s.wrap("write", err))
	}
	if s.sync != nil {
		if err := s.sync(); err != nil {
			return wharf.FailAll(len(msgs), s.wrap("fsync", err))
		}
	}
	return nil
}

// wrap names the sink's destination in err, replacing the *fs.PathError an
// *os.File returns so the path is not printed twice.
func (s *sink) wrap(op string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &fs.PathError{Op: op, Path: s.name, Err: err}
}

func (s *sink) Close() error {
	if s.close == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.close(); err != nil {
		return s.wrap("close", err)
	}
	return nil
}

// encoder holds the scratch space reused across batches so that encoding a
// batch allocates nothing once the buffers have grown.
type encoder struct {
	buf  []byte
	keys []string
}

// appendMessage appends m as one JSON object without a trailing newline.
func (e *encoder) appendMessage(dst []byte, m *wharf.Message) []byte {
	return append(e.appendFields(dst, m), '}')
}

func (e *encoder) appendFields(dst []byte, m *wharf.Message) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, m.ID, 10)
	dst = append(dst, `,"topic":`...)
	dst = appendString(dst, m.Topic)
	dst = append(dst, `,"key":`...)
	if m.Key == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, m.Key)
	}
	dst = append(dst, `,"headers":{`...)
	switch len(m.Headers) {
	case 0:
	case 1:
		for k, v := range m.Headers {
			dst = appendString(dst, k)
			dst = append(dst, ':')
			dst = appendString(dst, v)
		}
	default:
		// Sorted so that the same message always encodes to the same line.
		keys := e.keys[:0]
		for k := range m.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, k)
			dst = append(dst, ':')
			dst = appendString(dst, m.Headers[k])
		}
		clear(keys) // do not keep the batch's strings alive
		e.keys = keys[:0]
	}
	dst = append(dst, `},"payload":`...)
	return e.appendPayload(dst, m.Payload)
}

func (e *encoder) appendPayload(dst, p []byte) []byte {
	switch valid, multiline := scanJSON(p); {
	case valid && !multiline:
		return append(dst, p...)
	case valid:
		return appendCompact(dst, p)
	}
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, p)
	return append(dst, `","payload_encoding":"base64"`...)
}

// maxScanDepth is the nesting scanJSON tracks in a bit stack; deeper payloads,
// which are rare, go to encoding/json instead.
const maxScanDepth = 64

// scanJSON reports whether p is what json.Valid accepts and is also valid
// UTF-8 (json.Valid lets invalid UTF-8 through inside strings, which a reader
// would turn into U+FFFD or reject, so such payloads go out as base64), and
// whether p holds a CR or LF, which in valid JSON can only be whitespace.
// It exists because json.Valid was two thirds of the encoding time.
func scanJSON(p []byte) (valid, multiline bool) {
	var (
		objects uint64 // bit d is set when nesting level d is an object
		depth   int
		i       int
		ok      bool
		n       = len(p)
	)
value:
	i, multiline = skipSpace(p, i, multiline)
	if i >= n {
		return false, false
	}
	switch c := p[i]; c {
	case '{', '[':
		i, multiline = skipSpace(p, i+1, multiline)
		if i < n && p[i] == c+2 { // '}' is '{'+2 and ']' is '['+2
			i++
			goto end
		}
		if depth == maxScanDepth {
			return utf8.Valid(p) && json.Valid(p), bytes.ContainsAny(p, "\r\n")
		}
		if c == '{' {
			objects |= 1 << depth
			depth++
			goto key
		}
		objects &^= 1 << depth
		depth++
		goto value
	case '"':
		if i, ok = scanString(p, i); !ok {
			return false, false
		}
	case 't':
		if !bytes.HasPrefix(p[i:], []byte("true")) {
			return false, false
		}
		i += 4
	case 'f':
		if !bytes.HasPrefix(p[i:], []byte("false")) {
			return false, false
		}
		i += 5
	case 'n':
		if !bytes.HasPrefix(p[i:], []byte("null")) {
			return false, false
		}
		i += 4
	default:
		if i, ok = scanNumber(p, i); !ok {
			return false, false
		}
	}
end: // after a value
	i, multiline = skipSpace(p, i, multiline)
	if depth == 0 {
		return i == n, multiline && i == n
	}
	if i >= n {
		return false, false
	}
	switch inObject := objects>>(depth-1)&1 == 1; p[i] {
	case ',':
		i++
		if inObject {
			goto key
		}
		goto value
	case '}', ']':
		if inObject != (p[i] == '}') {
			return false, false
		}
		i++
		depth--
		goto end
	default:
		return false, false
	}
key:
	i, multiline = skipSpace(p, i, multiline)
	if i >= n || p[i] != '"' {
		return false, false
	}
	if i, ok = scanString(p, i); !ok {
		return false, false
	}
	i, multiline = skipSpace(p, i, multiline)
	if i >= n || p[i] != ':' {
		return false, false
	}
	i++
	goto value
}

func skipSpace(p []byte, i int, multiline bool) (int, bool) {
	for ; i < len(p); i++ {
		switch p[i] {
		case ' ', '\t':
		case '\n', '\r':
			multiline = true
		default:
			return i, multiline
		}
	}
	return i, multiline
}

// plainInString marks the bytes a JSON string holds as they are: ASCII other
// than control characters, '"' and '\\'.
var plainInString = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// scanString returns the index after the string starting at p[i] == '"'.
func scanString(p []byte, i int) (int, bool) {
	n := len(p)
	for i++; i < n; {
		for i+8 <= n && plainWord(load64(p[i:])) {
			i += 8
		}
		if i >= n {
			break
		}
		c := p[i]
		if plainInString[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= n {
				return 0, false
			}
			switch p[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > n || !isHex(p[i+2]) || !isHex(p[i+3]) || !isHex(p[i+4]) || !isHex(p[i+5]) {
					return 0, false
				}
				i += 6
			default:
				return 0, false
			}
		case c < 0x20:
			return 0, false
		default:
			r, size := utf8.DecodeRune(p[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, false
			}
			i += size
		}
	}
	return 0, false
}

const (
	lsbs = 0x0101010101010101
	msbs = 0x8080808080808080
)

// plainWord reports whether all 8 bytes of w stand for themselves inside a
// JSON string: none is a control character, '"', '\\' or non-ASCII. Strings
// are mostly such bytes, and checking 8 at a time makes scanning and
// escaping them several times faster.
func plainWord(w uint64) bool {
	q := w ^ (lsbs * '"')
	b := w ^ (lsbs * '\\')
	// x-lsbs*k & ^x sets the top bit of a byte below k (exact while no byte
	// has its top bit set, and w's own top bits rule out those words).
	return ((w-lsbs*0x20)&^w|(q-lsbs)&^q|(b-lsbs)&^b|w)&msbs == 0
}

// load64 reads 8 bytes little-endian; the compiler makes it one load.
func load64[T string | []byte](s T) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// scanNumber returns the index after the number starting at p[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(p []byte, i int) (int, bool) {
	n := len(p)
	if i < n && p[i] == '-' {
		i++
	}
	switch {
	case i < n && p[i] == '0':
		i++
	case i < n && isDigit(p[i]):
		for i++; i < n && isDigit(p[i]); i++ {
		}
	default:
		return 0, false
	}
	if i < n && p[i] == '.' {
		i++
		if i >= n || !isDigit(p[i]) {
			return 0, false
		}
		for i++; i < n && isDigit(p[i]); i++ {
		}
	}
	if i < n && (p[i] == 'e' || p[i] == 'E') {
		i++
		if i < n && (p[i] == '+' || p[i] == '-') {
			i++
		}
		if i >= n || !isDigit(p[i]) {
			return 0, false
		}
		for i++; i < n && isDigit(p[i]); i++ {
		}
	}
	return i, true
}

// appendCompact appends p, which scanJSON accepted, without the whitespace
// outside its strings, as json.Compact would, but without a bytes.Buffer.
func appendCompact(dst, p []byte) []byte {
	start := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case ' ', '\t', '\n', '\r':
			dst = append(dst, p[start:i]...)
			start = i + 1
		case '"':
			end, _ := scanString(p, i)
			i = end - 1
		}
	}
	return append(dst, p[start:]...)
}

const hexDigits = "0123456789abcdef"

// safeASCII reports the ASCII bytes that appear unescaped inside a JSON string.
// Unlike encoding/json's default, <, > and & are not escaped: the output is
// not meant for embedding in HTML and the escapes would only cost bytes.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendString appends s as a JSON string, escaping exactly as encoding/json
// does with HTML escaping off: control characters, '"', '\\', U+2028 and
// U+2029, and each byte of invalid UTF-8 becomes \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) && plainWord(load64(s[i:])) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		b := s[i]
		if b < utf8.RuneSelf {
			if safeASCII[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			// Valid JSON, but line terminators to JavaScript.
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
