// Package envelope is the one JSON form of a message that users parse: the
// lines of the stdout and file sinks and the elements of webhook batch
// bodies.
//
//	{"id":"<uuid>","seq":42,"topic":"orders.paid","key":"42","headers":{"a":"b"},"payload":{...}}
//
// key is null for an unkeyed message; headers are sorted by name; payload is
// the JSON value itself when the payload is valid UTF-8 JSON (compacted onto
// one line), otherwise a base64 string followed by "payload_encoding":"base64".
// Webhook batches add "created_at" and "attempt" (see Extra).
package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
)

// Encoder holds the scratch space reused across batches so that encoding a
// batch allocates nothing once the buffers have grown. It is not safe for
// concurrent use.
type Encoder struct {
	keys []string
}

// Extra selects the optional fields after the payload.
type Extra struct {
	CreatedAt bool // "created_at": RFC 3339 in UTC, omitted when zero
	Attempt   bool // "attempt": the delivery attempt, from 1
}

// AppendMessage appends m as one JSON object, without a trailing newline.
func (e *Encoder) AppendMessage(dst []byte, m *wharf.Message, x Extra) []byte {
	dst = e.appendFields(dst, m)
	if x.CreatedAt && !m.CreatedAt.IsZero() {
		dst = append(dst, `,"created_at":"`...)
		dst = m.CreatedAt.UTC().AppendFormat(dst, time.RFC3339Nano)
		dst = append(dst, '"')
	}
	if x.Attempt {
		dst = append(dst, `,"attempt":`...)
		dst = strconv.AppendInt(dst, int64(m.Attempt), 10)
	}
	return append(dst, '}')
}

// ValidJSON reports whether p is valid UTF-8 JSON: such a payload is embedded
// as the JSON value itself, any other one as base64.
func ValidJSON(p []byte) bool {
	valid, _ := scanJSON(p)
	return valid
}

func (e *Encoder) appendFields(dst []byte, m *wharf.Message) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, m.ID)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, m.Seq, 10)
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

func (e *Encoder) appendPayload(dst, p []byte) []byte {
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
