package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The console refuses, with one line and exit status 2, to listen beyond
// loopback without a token, and bad token settings.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte(" \n"), 0o600))
	db := []string{"--database-url", "postgres://x@127.0.0.1:1/x"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"all interfaces", []string{"console", "--addr", ":9751"}, "--addr :9751 is not a loopback address: set --console-token"},
		{"public address", []string{"console", "--addr", "0.0.0.0:9751"}, "--addr 0.0.0.0:9751 is not a loopback address"},
		{"host name", []string{"console", "--addr", "example.com:9751"}, "is not a loopback address"},
		{"token and file", []string{"console", "--console-token", "a", "--console-token-file", empty}, "--console-token and --console-token-file are both set: keep one"},
		{"empty token file", []string{"console", "--console-token-file", empty}, "is empty: write the token in it"},
		{"missing token file", []string{"console", "--console-token-file", filepath.Join(dir, "nope")}, "--console-token-file: open"},
		{"relay console without admin address", append([]string{"relay", "--sink", "null:", "--console"}, db...), "--console needs --admin-addr"},
		{"relay console beyond loopback", append([]string{"relay", "--sink", "null:", "--console", "--admin-addr", ":0"}, db...), "--admin-addr :0 is not a loopback address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := run(tc.args...)
			require.Equal(t, 2, code, errOut)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}

// A token from the environment (or the YAML file) allows a public address.
// Not parallel: it sets an environment variable.
func TestConsoleTokenFromEnvironment(t *testing.T) {
	t.Setenv("WHARF_CONSOLE_TOKEN", "from-env")
	t.Setenv("WHARF_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	code, _, errOut := run("console", "--addr", "0.0.0.0:0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "no database URL", "the address check passed; the command went on to the database")
	t.Setenv("WHARF_CONSOLE_TOKEN", "")
	code, _, errOut = run("--config", writeConfig(t, "console_token: from-yaml\n"), "console", "--addr", "0.0.0.0:0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "no database URL")
}

// lockedBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startCommand runs a long-running command in-process until the test ends,
// and returns the URL its log line reports.
func startCommand(t *testing.T, urlRE *regexp.Regexp, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &lockedBuffer{}
	root := newRoot(ioStreams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr})
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Error("the command did not stop")
		}
	})
	var u string
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the command ended: %v: %s", err, stderr.String())
		default:
		}
		m := urlRE.FindStringSubmatch(stderr.String())
		if m != nil {
			u = m[1]
		}
		return m != nil
	}, 60*time.Second, 20*time.Millisecond, "the command reports its URL: %s", stderr)
	return u
}

func get(t *testing.T, method, url, token, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// `wharf console` serves the console with the token from a file, and
// enforces it.
func TestConsoleCommandServesWithAuth(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	base := startCommand(t, regexp.MustCompile(`console serving" url=(http://\S+/)`),
		b.cmd("console", "--addr", "127.0.0.1:0", "--console-token-file", tokenFile)...)

	code, _, hdr := get(t, "GET", base, "", "")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "./login", hdr.Get("Location"))
	code, _, _ = get(t, "GET", base+"api/status", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = get(t, "GET", base+"api/status", "wrong", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body, _ := get(t, "GET", base+"api/status", "s3cret", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"lanes"`)
	code, body, _ = get(t, "GET", base, "s3cret", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "wharf console")
	// The Flows pages are on, over the same schema.
	code, body, _ = get(t, "GET", base+"api/flows", "s3cret", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"available":true`)
	code, body, _ = get(t, "GET", base+"api/flows/instances/42", "s3cret", "")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "no flow instance 42 in schema "+b.schema)
}

// `wharf relay --console` mounts the console at /console/ next to the
// metrics, here read-only.
func TestRelayConsole(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	base := startCommand(t, regexp.MustCompile(`serving the console" url=(http://\S+/console/)`),
		b.cmd("relay", "--sink", "null:", "--admin-addr", "127.0.0.1:0", "--console", "--console-token", "tok", "--console-read-only")...)

	code, body, _ := get(t, "GET", base+"api/config", "tok", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"read_only":true`)
	code, _, _ = get(t, "GET", base+"api/config", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body, _ = get(t, "POST", base+"api/dead/purge", "tok", `{"ids":["00000000-0000-8001-8000-000000000001"]}`)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "read-only")
	code, body, _ = get(t, "GET", base+"api/flows", "tok", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"available":true`)
	code, body, _ = get(t, "POST", base+"api/flows/retry", "tok", `{"id":1}`)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "read-only")
	code, body, _ = get(t, "GET", strings.TrimSuffix(base, "console/")+"metrics", "", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "wharf_")
}
