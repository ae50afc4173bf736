package wharfredis

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
	"github.com/wharfhq/wharf/internal/testtool"
)

// A redis-server listening only for TLS, with a private CA's certificate and
// client certificates required (tls-auth-clients yes): rediss:// with tls_ca,
// tls_cert and tls_key publishes, and the stream holds the messages; the
// system's roots or another CA fail the open with a certificate error.
func TestTLSWithPrivateCAAndClientCertificate(t *testing.T) {
	t.Parallel()
	bin := testtool.Path(t, "redis-server", "the TLS case runs a private server: apt-get install redis-server")
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", pki.ServerCert, "--tls-key-file", pki.ServerKey, "--tls-ca-cert-file", pki.CA,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--daemonize", "no", "--logfile", "")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	stream := "tls-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	q := url.Values{"stream_template": {stream}, "tls_ca": {pki.CA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}}
	raw := fmt.Sprintf("rediss://localhost:%d/0?%s", port, q.Encode())
	var s wharf.Sink
	deadline := time.Now().Add(serverStartWait)
	for {
		u, _ := url.Parse(raw)
		if s, err = Open(context.Background(), u); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open over TLS: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer s.Close()
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(1, 11), Seq: 1, Topic: "orders", Key: "k", Payload: []byte("one")},
		{ID: wharf.FormatID(2, 12), Seq: 2, Topic: "orders", Key: "k", Payload: []byte("two")},
	}
	for i, err := range publish(t, s, msgs) {
		if err != nil {
			t.Fatalf("message %d over TLS: %v", i, err)
		}
	}

	ctls, err := pki.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls.ServerName = "localhost"
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), TLSConfig: ctls, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, fmt.Sprint(e.Values["id"]))
	}
	if want := msgs[0].ID + "," + msgs[1].ID; strings.Join(ids, ",") != want {
		t.Fatalf("stream holds %v, want %s", ids, want)
	}

	for name, extra := range map[string]url.Values{
		"system roots": {"tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
		"other CA":     {"tls_ca": {pki.OtherCA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey}},
	} {
		u, _ := url.Parse(fmt.Sprintf("rediss://localhost:%d/0?%s", port, extra.Encode()))
		_, err := Open(context.Background(), u)
		if err == nil || !strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: want a one-line certificate verification error, got %v", name, err)
		}
	}
	u, _ := url.Parse(fmt.Sprintf("redis://localhost:%d/0?tls_ca=%s", port, url.QueryEscape(pki.CA)))
	if _, err := Open(context.Background(), u); err == nil || !strings.Contains(err.Error(), "tls_ca is a TLS option: use rediss://") {
		t.Fatalf("redis:// with tls_ca: got %v", err)
	}
}
