package wharfnats

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
	"github.com/wharfhq/wharf/internal/testtool"
)

// A nats-server that only speaks TLS, with a certificate of a private CA and
// client certificates required: tls_ca verifies it, tls_cert and tls_key
// authenticate the sink, and the stream holds what was published. The
// system's roots or another CA fail the open with a certificate error.
func TestTLSWithPrivateCAAndClientCertificate(t *testing.T) {
	t.Parallel()
	bin := testtool.Path(t, "nats-server", "the TLS case runs a private server: apt-get install nats-server", "/usr/sbin/nats-server")
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	body := fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n  timeout: 2\n}\n", pki.ServerCert, pki.ServerKey, pki.CA)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", t.TempDir(), "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	stream := "TLS_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	q := url.Values{"stream": {stream}, "create_stream": {"true"}, "subject_template": {"tls.{{topic}}"},
		"tls_ca": {pki.CA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}}
	raw := fmt.Sprintf("nats://localhost:%d?%s", port, q.Encode())
	var s *Sink
	deadline := time.Now().Add(serverStartWait)
	for {
		ws, err := Open(context.Background(), mustParse(t, raw))
		if err == nil {
			s = ws.(*Sink)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open over TLS: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer s.Close()
	msgs := []*wharf.Message{newMsg(1, "orders", "k1", `{"n":1}`), newMsg(2, "orders", "k1", `{"n":2}`)}
	for i, err := range publish(t, s, msgs...) {
		if err != nil {
			t.Fatalf("message %d over TLS: %v", i, err)
		}
	}

	// Read back through a verified, authenticated connection of our own.
	ctls, err := pki.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls.ServerName = "localhost"
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.Secure(ctls))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stored(t, js, stream), idsOf(msgs...); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stream holds %v, want %v", got, want)
	}

	for name, extra := range map[string]url.Values{
		"system roots": {"tls": {"true"}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
		"other CA":     {"tls_ca": {pki.OtherCA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
	} {
		u := fmt.Sprintf("nats://localhost:%d?stream=%s&%s", port, stream, extra.Encode())
		_, err := Open(context.Background(), mustParse(t, u))
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("%s: want a certificate verification error, got %v", name, err)
		}
	}
	_, err = Open(context.Background(), mustParse(t, fmt.Sprintf("nats://localhost:%d?tls=false&tls_ca=%s", port, url.QueryEscape(pki.CA))))
	if err == nil || !strings.Contains(err.Error(), "tls=false with tls_ca") {
		t.Fatalf("tls=false with a CA: got %v", err)
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
