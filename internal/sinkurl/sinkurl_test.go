package sinkurl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		raw  string
		want string // exact message, or a fragment when contains is set
		// contains marks want as a fragment, for messages that hold an
		// operating system's wording.
		contains bool
	}{
		{raw: "", want: "sink URL is empty: pass --sink (one of: file, null, stdout)"},
		{raw: "  \t", want: "sink URL is empty: pass --sink (one of: file, null, stdout)"},
		{raw: "file://%zz", want: `sink URL "file://%zz" is malformed: invalid URL escape "%zz"; expected e.g. stdout: or file:///var/log/wharf.jsonl`},
		{raw: "kafak://x", want: `unknown sink scheme "kafak" in "kafak://x": use one of file, null, stdout`},
		{raw: "KAFAK://x", want: `unknown sink scheme "kafak" in "KAFAK://x": use one of file, null, stdout`},
		{raw: "out.jsonl", want: `sink URL "out.jsonl" has no scheme: for a file write file:out.jsonl, or use one of file, null, stdout`},
		{raw: "/var/log/out.jsonl", want: `sink URL "/var/log/out.jsonl" has no scheme: for a file write file:///var/log/out.jsonl, or use one of file, null, stdout`},
		{raw: "file:", want: `sink URL "file:" has no file path: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "file", want: `sink URL "file:" has no file path: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "file://", want: `sink URL "file://" has no file path: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "file:///tmp/", want: `sink URL "file:///tmp/" names a directory, not a file: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "file://var/log/out.jsonl", want: `sink URL "file://var/log/out.jsonl" names host "var", but the file sink only writes local files: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "file:///tmp/x.jsonl?sync=0", want: `sink URL "file:///tmp/x.jsonl?sync=0": the file sink takes no user, query or fragment: write file:///abs/path.jsonl (three slashes) or file:relative/path.jsonl`},
		{raw: "stdout:foo", want: `sink URL "stdout:foo": the stdout sink takes no host, path or options: write stdout:`},
		{raw: "null://host", want: `sink URL "null://host": the null sink takes no host, path or options: write null:`},
		{raw: "file:///nonexistent-wharf-dir/sub/out.jsonl", want: `directory "/nonexistent-wharf-dir/sub" does not exist: create it or choose another path`, contains: true},
		{raw: "stdout:\nfile:x", want: `sink URL "stdout:\nfile:x" is malformed: net/url: invalid control character in URL; expected e.g. stdout: or file:///var/log/wharf.jsonl`},
	}
	for _, c := range cases {
		t.Run(c.raw, func(t *testing.T) {
			t.Parallel()
			s, err := Open(context.Background(), c.raw)
			require.Nil(t, s)
			if c.contains {
				require.ErrorContains(t, err, c.want)
			} else {
				require.EqualError(t, err, c.want)
			}
			require.NotContains(t, err.Error(), "\n", "errors must be one line")
		})
	}
}

func TestOpenErrorsHidePasswords(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t"
	for _, raw := range []string{
		"kafka://user:s3cr3t@broker:9092/topic",   // unknown scheme, parses
		"kafka://user:s3cr3t@broker:9092/%zz",     // malformed elsewhere
		"kafka://user:s3cr3t%zz@broker:9092",      // malformed inside the password
		"kafka://user:s3cr3t/x@broker:9092",       // unescaped '/' in the password
		"kafka://user:s3cr3t/x@broker:bad",        // ... and malformed
		"nats://user:s3cr3t@host\x7f:4222",        // control character
		"file://user:s3cr3t@localhost/tmp/x",      // credentials the file sink refuses
		"stdout://user:s3cr3t@localhost",          // credentials the stdout sink refuses
		"kafka://user:s3cr3t@@broker/topic?a=b#f", // two '@'
	} {
		_, err := Open(context.Background(), raw)
		require.Error(t, err, raw)
		require.NotContains(t, err.Error(), secret, raw)
		require.NotContains(t, err.Error(), "s3c", raw)
		require.NotContains(t, err.Error(), "\n", raw)
		t.Log(err)
	}
}

func TestRedactLeavesPathsAlone(t *testing.T) {
	t.Parallel()
	require.Equal(t, "file:///a:b@c.jsonl", redact("file:///a:b@c.jsonl"))
	require.Equal(t, "file:a:b@c", redact("file:a:b@c"))
	require.Equal(t, "kafka://user@host", redact("kafka://user@host"))
	require.Equal(t, "kafka://user:xxxxx@host", redact("kafka://user:pw@host"))
	require.Equal(t, "//user:xxxxx@host", redact("//user:pw@host"))
}

func TestOpenBuiltins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{"stdout:", "stdout", "stdout://", "STDOUT", " stdout: "} {
		s, err := Open(ctx, raw)
		require.NoError(t, err, raw)
		require.NotNil(t, s)
		require.NoError(t, s.Close())
	}

	for _, raw := range []string{"null:", "null", "null://"} {
		s, err := Open(ctx, raw)
		require.NoError(t, err, raw)
		ns, ok := s.(*NullSink)
		require.True(t, ok, "%s opens a %T", raw, s)
		require.Nil(t, ns.Publish(ctx, make([]*wharf.Message, 7)))
		require.Nil(t, ns.Publish(ctx, make([]*wharf.Message, 3)))
		require.Equal(t, int64(10), ns.Count())
		require.NoError(t, ns.Close())
	}

	dir := t.TempDir()
	abs := filepath.Join(dir, "a b.jsonl")
	for _, raw := range []string{
		(&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String(), // file:///…/a%20b.jsonl
		"file://localhost" + filepath.ToSlash(abs),
		"file:" + filepath.ToSlash(abs),
	} {
		s, err := Open(ctx, raw)
		require.NoError(t, err, raw)
		require.Nil(t, s.Publish(ctx, []*wharf.Message{{ID: wharf.FormatID(int64(1), 1), Seq: int64(1), Topic: "t"}}))
		require.NoError(t, s.Close())
	}
	data, err := os.ReadFile(abs)
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(string(data), "\n"))
}

// The relative form resolves against the working directory, which a parallel
// test must not change; so this only checks that it is read as a path.
func TestOpenRelativeFilePath(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), "file:no-such-dir-for-wharf/x%20y.jsonl")
	require.ErrorContains(t, err, `"no-such-dir-for-wharf/x y.jsonl"`)
	require.ErrorContains(t, err, `directory "no-such-dir-for-wharf" does not exist`)
}

func TestSchemesAndRegister(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"file", "null", "stdout"}, Schemes())

	r := newRegistry()
	var got *url.URL
	r.register("kafka", adapt(func(_ context.Context, u *url.URL) (wharf.Sink, error) {
		got = u
		return &NullSink{}, nil
	}))
	require.Equal(t, []string{"file", "kafka", "null", "stdout"}, r.list())
	s, err := r.open(context.Background(), "KAFKA://user:pw@broker:9092/orders?acks=all")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.Equal(t, "broker:9092", got.Host)
	require.Equal(t, "all", got.Query().Get("acks"))

	_, err = r.open(context.Background(), "")
	require.EqualError(t, err, "sink URL is empty: pass --sink (one of: file, kafka, null, stdout)")
	_, err = r.open(context.Background(), "kafak://x")
	require.EqualError(t, err, `unknown sink scheme "kafak" in "kafak://x": use one of file, kafka, null, stdout`)

	noop := func(context.Context, *url.URL) (wharf.Sink, error) { return nil, errors.New("unused") }
	require.PanicsWithValue(t, `sinkurl: Register: scheme "kafka" registered twice`, func() { r.register("kafka", openNull) })
	require.PanicsWithValue(t, `sinkurl: Register: scheme "file" registered twice`, func() { Register("file", noop) })
	require.Panics(t, func() { Register("Kafka", noop) })
	require.Panics(t, func() { Register("", noop) })
	require.Panics(t, func() { Register("1x", noop) })
	require.PanicsWithValue(t, `sinkurl: Register: nil opener for scheme "x"`, func() { Register("x", nil) })
	require.Equal(t, []string{"file", "null", "stdout"}, Schemes())
}

// TestFileSinkConcurrentAppends checks what several relays sharing a file
// depend on: each batch lands as whole lines, nothing is lost or doubled, and
// what was in the file stays.
func TestFileSinkConcurrentAppends(t *testing.T) {
	t.Parallel()
	const (
		sinks      = 2
		goroutines = 3 // per sink
		batches    = 50
		perBatch   = 100
	)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	const before = "{\"pre\":\"existing line\"}\n"
	require.NoError(t, os.WriteFile(path, []byte(before), 0o644))

	ctx := context.Background()
	// Payloads large enough that a batch (~30 KiB) exceeds any pipe or page
	// size, where torn appends would show.
	pad := strings.Repeat("p", 200)
	var wg sync.WaitGroup
	for si := range sinks {
		s, err := Open(ctx, "file://"+filepath.ToSlash(path))
		require.NoError(t, err)
		var sg sync.WaitGroup
		for g := range goroutines {
			sg.Go(func() {
				for b := range batches {
					msgs := make([]*wharf.Message, perBatch)
					for i := range msgs {
						id := int64(((si*goroutines+g)*batches+b)*perBatch + i)
						msgs[i] = &wharf.Message{
							ID: wharf.FormatID(id, 1), Seq: id,
							Topic:   "orders",
							Key:     fmt.Sprintf("k%d", id%13),
							Headers: map[string]string{"g": fmt.Sprint(g), "s": fmt.Sprint(si)},
							Payload: fmt.Appendf(nil, `{"id":%d,"pad":%q}`, id, pad),
						}
					}
					if errs := s.Publish(ctx, msgs); errs != nil {
						t.Errorf("publish: %v", errs[0])
						return
					}
				}
			})
		}
		wg.Go(func() {
			sg.Wait()
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	wg.Wait()

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	require.True(t, sc.Scan())
	require.Equal(t, strings.TrimSuffix(before, "\n"), sc.Text(), "pre-existing content must be kept")
	const total = sinks * goroutines * batches * perBatch
	seen := make([]bool, total)
	n := 0
	for sc.Scan() {
		var l struct {
			Seq     int64             `json:"seq"`
			Topic   string            `json:"topic"`
			Key     string            `json:"key"`
			Headers map[string]string `json:"headers"`
			Payload struct {
				ID  int64  `json:"id"`
				Pad string `json:"pad"`
			} `json:"payload"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "line %d: %.200s", n+2, sc.Text())
		require.True(t, l.Seq >= 0 && l.Seq < total, "id %d", l.Seq)
		require.False(t, seen[l.Seq], "id %d written twice", l.Seq)
		seen[l.Seq] = true
		require.Equal(t, l.Seq, l.Payload.ID)
		require.Equal(t, pad, l.Payload.Pad)
		require.Equal(t, fmt.Sprintf("k%d", l.Seq%13), l.Key)
		require.Len(t, l.Headers, 2)
		n++
	}
	require.NoError(t, sc.Err())
	require.Equal(t, total, n)
}
