package textsink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// weirdStrings are texts JSON encoders get wrong (the envelope package's
// tests check each against encoding/json).
var weirdStrings = []string{
	"", `quote " and backslash \ and slash /`, "newline\n carriage\r tab\t", "\x00\x01\x1f\x7f",
	"line\u2028sep\u2029para", "<html>&amp;</html>", "invalid \xff\xfe utf8 \xc3", "truncated \xe2\x82",
	"surrogate half \xed\xa0\x80", "emoji 🦫 and é and 日本", "literal \ufffd replacement", strings.Repeat("long ", 100),
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

// stdlibString is s as encoding/json writes it, without HTML escaping.
func stdlibString(t testing.TB, s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(s))
	return strings.TrimSuffix(b.String(), "\n")
}

// sanitize is what any JSON reader gets back for s.
func sanitize(t testing.TB, s string) string {
	var out string
	require.NoError(t, json.Unmarshal([]byte(stdlibString(t, s)), &out))
	return out
}

type line struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
}

// fieldOrder returns the top-level keys of obj in order, and the keys of its
// "headers" object in order.
func fieldOrder(t testing.TB, obj []byte) (top, headers []string) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok)
	for dec.More() {
		tok, err := dec.Token()
		require.NoError(t, err)
		name := tok.(string)
		top = append(top, name)
		if name != "headers" {
			var skip json.RawMessage
			require.NoError(t, dec.Decode(&skip))
			continue
		}
		_, err = dec.Token()
		require.NoError(t, err)
		for dec.More() {
			k, err := dec.Token()
			require.NoError(t, err)
			headers = append(headers, k.(string))
			_, err = dec.Token()
			require.NoError(t, err)
		}
		_, err = dec.Token()
		require.NoError(t, err)
	}
	return top, headers
}

func TestRandomBatchRoundTrips(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))

	msgs := make([]*wharf.Message, 2000)
	for i := range msgs {
		seq := r.Int64() - math.MaxInt64/2
		m := &wharf.Message{ID: wharf.FormatID(seq, 1), Seq: seq, Topic: randString(r), Payload: randPayload(r)}
		if r.IntN(3) > 0 {
			m.Key = randString(r)
		}
		if n := r.IntN(4); n > 0 {
			m.Headers = map[string]string{}
			seen := map[string]bool{}
			for range n {
				// Two keys that read back alike would collapse; skip those.
				k := randString(r)
				if sk := sanitize(t, k); !seen[sk] {
					seen[sk] = true
					m.Headers[k] = randString(r)
				}
			}
		}
		msgs[i] = m
	}

	var out bytes.Buffer
	s := NewWriter(&out, nil)
	require.Nil(t, s.Publish(context.Background(), msgs[:1000]))
	require.Nil(t, s.Publish(context.Background(), msgs[1000:]))
	require.NoError(t, s.Close())

	require.True(t, bytes.HasSuffix(out.Bytes(), []byte("\n")))
	raw := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n"))
	require.Len(t, raw, len(msgs))
	for i, l := range raw {
		m := msgs[i]
		require.True(t, utf8.Valid(l), "line %d is not UTF-8", i)
		var got line
		require.NoError(t, json.Unmarshal(l, &got), "line %d: %s", i, l)

		require.Equal(t, m.ID, got.ID)
		require.Equal(t, m.Seq, got.Seq)
		require.Equal(t, sanitize(t, m.Topic), got.Topic)
		if m.Key == "" {
			require.Nil(t, got.Key)
		} else {
			require.NotNil(t, got.Key)
			require.Equal(t, sanitize(t, m.Key), *got.Key)
		}
		want := map[string]string{}
		for k, v := range m.Headers {
			want[sanitize(t, k)] = sanitize(t, v)
		}
		require.Equal(t, want, got.Headers)

		// Headers come in the order of their keys as sent, not as read back.
		var wantOrder []string
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			wantOrder = append(wantOrder, sanitize(t, k))
		}
		top, hdrs := fieldOrder(t, l)
		require.Equal(t, wantOrder, hdrs)
		order := []string{"id", "seq", "topic", "key", "headers", "payload"}
		if utf8.Valid(m.Payload) && json.Valid(m.Payload) {
			require.Empty(t, got.PayloadEncoding)
			var wantc, gotc bytes.Buffer
			require.NoError(t, json.Compact(&wantc, m.Payload))
			require.NoError(t, json.Compact(&gotc, got.Payload))
			require.Equal(t, wantc.String(), gotc.String())
		} else {
			order = append(order, "payload_encoding")
			require.Equal(t, "base64", got.PayloadEncoding)
			var b64 string
			require.NoError(t, json.Unmarshal(got.Payload, &b64))
			dec, err := base64.StdEncoding.DecodeString(b64)
			require.NoError(t, err)
			require.Equal(t, string(m.Payload), string(dec))
		}
		require.Equal(t, order, top)
	}
}

// recorder is an io.Writer that remembers each Write call and catches
// overlapping calls.
type recorder struct {
	mu       sync.Mutex
	writes   [][]byte
	inFlight atomic.Int32
	overlap  atomic.Bool
	err      error
	n        int // bytes to report written when err != nil
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.inFlight.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.inFlight.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		r.writes = append(r.writes, slices.Clone(p[:r.n]))
		return r.n, r.err
	}
	r.writes = append(r.writes, slices.Clone(p))
	return len(p), nil
}

func batch(first int64, n int) []*wharf.Message {
	msgs := make([]*wharf.Message, n)
	for i := range msgs {
		msgs[i] = &wharf.Message{ID: wharf.FormatID(first+int64(i), 1), Seq: first + int64(i), Topic: "t", Key: "k", Payload: []byte(`{"n":1}`)}
	}
	return msgs
}

func TestPublishOneWritePerBatchThenSync(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	var events []string
	s := NewWriter(writerFunc(func(p []byte) (int, error) {
		events = append(events, "write")
		return rec.Write(p)
	}), func() error {
		events = append(events, "sync")
		return nil
	})
	require.Nil(t, s.Publish(context.Background(), batch(1, 10)))
	require.Nil(t, s.Publish(context.Background(), batch(11, 5)))
	require.Nil(t, s.Publish(context.Background(), nil), "empty batch")
	require.Equal(t, []string{"write", "sync", "write", "sync"}, events)
	require.Len(t, rec.writes, 2)
	require.Equal(t, 10, bytes.Count(rec.writes[0], []byte("\n")))
	require.Equal(t, 5, bytes.Count(rec.writes[1], []byte("\n")))
	require.NoError(t, s.Close())
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestPublishWriteErrorFailsWholeBatch(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	synced := false
	s := NewWriter(&recorder{err: boom}, func() error { synced = true; return nil })
	errs := s.Publish(context.Background(), batch(1, 3))
	require.Len(t, errs, 3)
	for _, err := range errs {
		require.ErrorIs(t, err, boom)
		require.EqualError(t, err, "write writer: boom")
	}
	require.False(t, synced, "must not sync after a failed write")
}

func TestPublishShortWriteWithoutErrorIsNotAcked(t *testing.T) {
	t.Parallel()
	s := NewWriter(writerFunc(func(p []byte) (int, error) { return len(p) - 1, nil }), nil)
	errs := s.Publish(context.Background(), batch(1, 2))
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], io.ErrShortWrite)
}

func TestPublishSyncErrorFailsWholeBatch(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk on fire")
	s := NewWriter(io.Discard, func() error { return boom })
	errs := s.Publish(context.Background(), batch(1, 4))
	require.Len(t, errs, 4)
	for _, err := range errs {
		require.ErrorIs(t, err, boom)
		require.EqualError(t, err, "fsync writer: disk on fire")
	}
}

func TestPublishAfterTornWriteStartsOnANewLine(t *testing.T) {
	t.Parallel()
	rec := &recorder{err: errors.New("no space"), n: 5}
	s := NewWriter(rec, nil)
	require.Len(t, s.Publish(context.Background(), batch(1, 2)), 2)
	rec.mu.Lock()
	rec.err = nil
	rec.mu.Unlock()
	require.Nil(t, s.Publish(context.Background(), batch(3, 1)))
	require.Nil(t, s.Publish(context.Background(), batch(4, 1)))
	require.Equal(t, `{"id"`, string(rec.writes[0]))
	require.Equal(t, byte('\n'), rec.writes[1][0], "torn line must be terminated first")
	require.Equal(t, byte('{'), rec.writes[2][0], "only once")
}

func TestPublishRespectsDoneContext(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s := NewWriter(rec, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := s.Publish(ctx, batch(1, 3))
	require.Equal(t, []error{context.Canceled, context.Canceled, context.Canceled}, errs)
	require.Empty(t, rec.writes)
}

func TestPublishConcurrentCallsDoNotOverlap(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s := NewWriter(rec, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for b := range 20 {
				require.Nil(t, s.Publish(context.Background(), batch(int64(g*10000+b*100), 50)))
			}
		})
	}
	wg.Wait()
	require.False(t, rec.overlap.Load())
	require.Len(t, rec.writes, 160)
	seen := map[int64]bool{}
	for _, w := range rec.writes {
		for l := range bytes.Lines(w) {
			var got line
			require.NoError(t, json.Unmarshal(l, &got))
			require.False(t, seen[got.Seq])
			seen[got.Seq] = true
		}
	}
	require.Len(t, seen, 8*20*50)
}

func TestOpenFileAppendsAndSyncs(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "out.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("earlier line\n"), 0o600))

	s, err := OpenFile(path)
	require.NoError(t, err)
	require.Nil(t, s.Publish(context.Background(), batch(1, 3)))
	s2, err := OpenFile(path)
	require.NoError(t, err)
	require.Nil(t, s2.Publish(context.Background(), batch(4, 2)))
	require.NoError(t, s2.Close())
	require.Nil(t, s.Publish(context.Background(), batch(6, 1)))
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Equal(t, "earlier line", lines[0])
	require.Len(t, lines, 7)
	for i, l := range lines[1:] {
		var got line
		require.NoError(t, json.Unmarshal([]byte(l), &got))
		require.Equal(t, int64(i+1), got.Seq)
	}

	errs := s.Publish(context.Background(), batch(7, 2))
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], fs.ErrClosed)
	require.ErrorContains(t, errs[0], path)
}

func TestOpenFileCreatesWithMode0644(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "new.jsonl")
	s, err := OpenFile(path)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Zero(t, fi.Mode().Perm()&^0o644, "mode %v", fi.Mode())
}

func TestOpenFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope", "deeper")
	_, err := OpenFile(filepath.Join(missing, "out.jsonl"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, fmt.Sprintf("directory %q does not exist", missing))

	_, err = OpenFile(dir)
	require.ErrorContains(t, err, fmt.Sprintf("cannot open %q for appending", dir))

	_, err = OpenFile("")
	require.EqualError(t, err, "textsink: file sink path is empty")
}

func TestStdoutCloseDoesNothing(t *testing.T) {
	t.Parallel()
	s := Stdout()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	// Empty batches write nothing, so this does not disturb the test output.
	require.Nil(t, s.Publish(context.Background(), nil))
}

func TestMultilinePayloadStaysOnOneLine(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s := NewWriter(&out, nil)
	big := bytes.Repeat([]byte(`"x",`), 10000)
	payload := append(append([]byte("[\n"), big...), "1\n]"...)
	require.Nil(t, s.Publish(context.Background(), []*wharf.Message{{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t", Payload: payload}}))
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	require.True(t, sc.Scan())
	require.True(t, json.Valid(sc.Bytes()))
	require.False(t, sc.Scan())
}

// lateCancel is a context that ends at its n-th Err call, as the relay's does
// when its lease ends while the sink encodes a batch.
type lateCancel struct {
	context.Context
	calls, n int
}

func (c *lateCancel) Err() error {
	c.calls++
	if c.calls >= c.n {
		return context.Canceled
	}
	return nil
}

// The sink asks the context once more right before the write: a lease that
// ended during the encoding writes nothing.
func TestNoWriteWhenContextEndsDuringEncoding(t *testing.T) {
	var out bytes.Buffer
	s := NewWriter(&out, nil)
	msgs := []*wharf.Message{{ID: "a", Topic: "t", Payload: []byte(`1`)}}
	for n := 1; ; n++ {
		ctx := &lateCancel{Context: context.Background(), n: n}
		errs := s.Publish(ctx, msgs)
		if errs == nil {
			if out.Len() == 0 {
				t.Fatal("acknowledged without writing")
			}
			// Checks on entry and after the lock come before the
			// encoding; a third must come after it.
			if n-1 < 3 {
				t.Fatalf("wrote after only %d context checks: want one after the encoding", n-1)
			}
			return
		}
		if out.Len() != 0 {
			t.Fatalf("context ended at check %d, but the sink wrote %q", n, out.String())
		}
	}
}
