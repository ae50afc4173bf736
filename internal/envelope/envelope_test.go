package envelope

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/wharfhq/wharf"
)

// stdlibString is the oracle for appendString: encoding/json without HTML
// escaping.
func stdlibString(t testing.TB, s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(s))
	return strings.TrimSuffix(b.String(), "\n")
}

var weirdStrings = []string{
	"",
	"plain",
	`quote " and backslash \ and slash /`,
	"newline\n carriage\r tab\t backspace\b formfeed\f",
	"\x00\x01\x02\x1f\x7f",
	"line\u2028sep\u2029para",
	"<html>&amp;</html>",
	"invalid \xff\xfe utf8 \xc3",
	"truncated \xe2\x82",
	"surrogate half \xed\xa0\x80",
	"emoji 🦫 and é and 日本",
	"literal \ufffd replacement",
	"\"",
	"\\",
	strings.Repeat("long ", 100),
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range weirdStrings {
		require.Equal(t, stdlibString(t, s), string(appendString(nil, s)), "string %q", s)
	}
	for b := range 256 {
		s := string([]byte{'a', byte(b), 'z'})
		require.Equal(t, stdlibString(t, s), string(appendString(nil, s)), "byte %#x", b)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range weirdStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		require.Equal(t, stdlibString(t, s), string(appendString(nil, s)))
	})
}

var jsonSeeds = []string{
	``, ` `, `1`, `-0`, `-`, `01`, `1.`, `1.5`, `.5`, `1e`, `1e+`, `1E-7`, `-12.5e+30`, `1 2`,
	`true`, `tru`, `truex`, `false`, `null`, `nul`, `"`, `""`, `"\"`, `"\\"`, `"\u00e9"`, `"\u00G9"`,
	`"\ud800"`, `"\x"`, "\"\t\"", "\"\x7f\"", "\"\xff\"", "\"\xed\xa0\x80\"", "\"\xef\xbf\xbd\"",
	"\"\u2028\"", "\xef\xbb\xbf1", `[]`, `[ ]`, `[1,]`, `[,1]`, `[1 2]`, `[1,2]`, `{}`, `{ }`, `{"a"}`,
	`{"a":}`, `{"a":1,}`, `{"a":1 "b":2}`, `{1:2}`, `{"a":[1,{"b":null}],"c":"d"}`, `[}`, `{]`, `[[[]]]`,
	`[[[]]`, "{\r\n \"a\" :\t[1,\n2]\n}\n", "\n1\n", "[\"a\nb\"]", `[1]x`, `{"a":1}}`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat("[", 65) + "\n" + strings.Repeat("]", 65),
	strings.Repeat("[", 200) + strings.Repeat("]", 199),
	strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70),
}

func checkScan(t *testing.T, p []byte) {
	valid, multiline := scanJSON(p)
	require.Equal(t, utf8.Valid(p) && json.Valid(p), valid, "%q", p)
	if !valid {
		return
	}
	require.Equal(t, bytes.ContainsAny(p, "\r\n"), multiline, "%q", p)
	var want bytes.Buffer
	require.NoError(t, json.Compact(&want, p))
	require.Equal(t, want.String(), string(appendCompact([]byte("prefix"), p))[len("prefix"):], "%q", p)
}

func TestScanJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range jsonSeeds {
		checkScan(t, []byte(s))
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	for range 2000 {
		p := randPayload(r)
		checkScan(t, p)
		if len(p) > 0 { // and a mutation of it
			const noise = "{}[],:\"\\ \n0-e.tx\xff"
			p[r.IntN(len(p))] = noise[r.IntN(len(noise))]
			checkScan(t, p)
		}
	}
}

func FuzzScanJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkScan)
}

func TestEncodeLayout(t *testing.T) {
	t.Parallel()
	var e Encoder
	cases := []struct {
		msg  wharf.Message
		want string
	}{
		{
			wharf.Message{ID: wharf.FormatID(int64(123), 1), Seq: int64(123), Topic: "orders", Key: "k1", Headers: map[string]string{"b": "2", "a": "1", "c": "3"}, Payload: []byte(`{"x":1}`)},
			`{"id":"00000000-0000-807b-8000-000000000001","seq":123,"topic":"orders","key":"k1","headers":{"a":"1","b":"2","c":"3"},"payload":{"x":1}}`,
		},
		{
			wharf.Message{ID: wharf.FormatID(int64(-1), 1), Seq: int64(-1), Topic: "t", Headers: map[string]string{"only": "one"}, Payload: []byte(`"str"`)},
			`{"id":"ffffffff-ffff-8fff-8000-000000000001","seq":-1,"topic":"t","key":null,"headers":{"only":"one"},"payload":"str"}`,
		},
		{
			wharf.Message{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Payload: nil},
			`{"id":"00000000-0000-8001-8000-000000000001","seq":1,"topic":"t","key":null,"headers":{},"payload":"","payload_encoding":"base64"}`,
		},
		{
			wharf.Message{ID: wharf.FormatID(int64(2), 1), Seq: int64(2), Topic: "t", Payload: []byte("not json")},
			`{"id":"00000000-0000-8002-8000-000000000001","seq":2,"topic":"t","key":null,"headers":{},"payload":"bm90IGpzb24=","payload_encoding":"base64"}`,
		},
		{
			wharf.Message{ID: wharf.FormatID(int64(3), 1), Seq: int64(3), Topic: "t", Payload: []byte("{\r\n  \"a\": [1,\n 2]\n}\n")},
			`{"id":"00000000-0000-8003-8000-000000000001","seq":3,"topic":"t","key":null,"headers":{},"payload":{"a":[1,2]}}`,
		},
		{
			// Valid to json.Valid, but not UTF-8: kept byte-exact as base64.
			wharf.Message{ID: wharf.FormatID(int64(4), 1), Seq: int64(4), Topic: "t", Payload: []byte("\"\xff\"")},
			`{"id":"00000000-0000-8004-8000-000000000001","seq":4,"topic":"t","key":null,"headers":{},"payload":"Iv8i","payload_encoding":"base64"}`,
		},
		{
			wharf.Message{ID: wharf.FormatID(int64(math.MaxInt64), 1), Seq: int64(math.MaxInt64), Topic: "t", Payload: []byte(` 42 `)},
			`{"id":"ffffffff-ffff-8fff-8000-000000000001","seq":9223372036854775807,"topic":"t","key":null,"headers":{},"payload": 42 }`,
		},
	}
	for _, c := range cases {
		require.Equal(t, c.want, string(e.AppendMessage(nil, &c.msg, Extra{})))
		require.True(t, json.Valid([]byte(c.want)))
	}
}

// randString mixes printable text, escapes and invalid UTF-8.
func randString(r *rand.Rand) string {
	if r.IntN(4) == 0 {
		return weirdStrings[r.IntN(len(weirdStrings))]
	}
	b := make([]byte, r.IntN(20))
	for i := range b {
		switch r.IntN(4) {
		case 0:
			b[i] = byte(r.IntN(256))
		default:
			b[i] = byte(' ' + r.IntN(95))
		}
	}
	return string(b)
}

func randPayload(r *rand.Rand) []byte {
	switch r.IntN(6) {
	case 0:
		return nil
	case 1: // binary
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	case 2: // indented JSON, which must be compacted onto one line
		v := map[string]any{"s": strings.ToValidUTF8(randString(r), "?"), "n": r.Float64(), "a": []int{1, 2, 3}}
		b, _ := json.MarshalIndent(v, "", "\t")
		return append(b, "\r\n"...)
	case 3: // JSON scalar or array on one line
		return []byte([]string{`1`, `-0.5e10`, `true`, `null`, `"x"`, `[]`, `[1,"a\u2028b",{}]`, ` {"a" : 1 } `}[r.IntN(8)])
	case 4:
		return []byte(`{"unterminated":`)
	default:
		b, _ := json.Marshal(map[string]string{"k": strings.ToValidUTF8(randString(r), "")})
		return b
	}
}
