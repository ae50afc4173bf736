package wharfwebhook

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
)

// A destination behind a private CA that requires client certificates:
// wharf_tls_ca verifies it and wharf_tls_cert/key authenticate the sink.
// Without the CA, or with another CA, the request fails on verification.
func TestHTTPSWithPrivateCAAndClientCertificate(t *testing.T) {
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "wharf" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		got.Add(1)
	}))
	if srv.TLS, err = pki.ServerTLS(true); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	defer srv.Close()
	base := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/hook?wharf_allow_private=true"
	q := url.Values{"wharf_tls_ca": {pki.CA}, "wharf_tls_cert": {pki.ClientCert}, "wharf_tls_key": {pki.ClientKey}}

	publish := func(raw string) error {
		t.Helper()
		s, err := Open(context.Background(), mustURL(t, raw))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer s.Close()
		if errs := s.Publish(context.Background(), []*wharf.Message{msg(1, "orders", "k", `{"a":1}`)}); errs != nil {
			return errs[0]
		}
		return nil
	}
	if err := publish(base + "&" + q.Encode()); err != nil {
		t.Fatalf("publish over mutual TLS: %v", err)
	}
	if got.Load() != 1 {
		t.Fatalf("the destination saw %d authenticated requests, want 1", got.Load())
	}

	// The system's roots do not know the private CA; another CA does not
	// vouch for the server.
	other := url.Values{"wharf_tls_ca": {pki.OtherCA}, "wharf_tls_cert": {pki.ClientCert}, "wharf_tls_key": {pki.ClientKey}}
	for name, raw := range map[string]string{"system roots": base, "other CA": base + "&" + other.Encode()} {
		err := publish(raw)
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("%s: want a certificate verification error, got %v", name, err)
		}
	}
	if got.Load() != 1 {
		t.Fatalf("unverified requests reached the destination")
	}
}

func TestTLSOptionErrors(t *testing.T) {
	pki, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ raw, want string }{
		{"http://example.com/h?wharf_tls_ca=" + url.QueryEscape(pki.CA), "wharf_tls_ca is a TLS option: use https://"},
		{"https://example.com/h?wharf_tls_ca=/nonexistent/ca.pem", "wharf_tls_ca: cannot read /nonexistent/ca.pem"},
		{"https://example.com/h?wharf_tls_ca=" + url.QueryEscape(pki.ServerKey), "no PEM certificate in the file"},
		{"https://example.com/h?wharf_tls_cert=" + url.QueryEscape(pki.ClientCert), "wharf_tls_cert and wharf_tls_key go together"},
	} {
		_, err := Open(context.Background(), mustURL(t, c.raw))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: want one line containing %q, got %v", c.raw, c.want, err)
		}
	}
}
