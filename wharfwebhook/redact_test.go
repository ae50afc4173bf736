package wharfwebhook

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		// Slack, Discord, Teams, Zapier: the token is in the path.
		"https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/XXXXXXXXXXXXXXXXXXXXXXXX":                  "https://hooks.slack.com/services/…/…/…",
		"https://discord.com/api/webhooks/123456789012345678/abcdefTOKENghijkl":                          "https://discord.com/api/…/…/…",
		"https://acme.webhook.office.com/webhookb2/1111-2222@3333-4444/IncomingWebhook/abcdef/5555-6666": "https://acme.webhook.office.com/webhookb2/…/…/…/…",
		"https://hooks.zapier.com/hooks/catch/123456/abcdef/":                                            "https://hooks.zapier.com/hooks/…/…/…/",
		// Azure Functions and SAS URLs: the token is in the query.
		"https://fn.azurewebsites.net/api/orders?code=SECRETCODE==&clientId=default":             "https://fn.azurewebsites.net/api/…?…",
		"https://acct.blob.core.windows.net/c/blob?sv=2022-11-02&sig=SIGNATURE%3D&se=2030-01-01": "https://acct.blob.core.windows.net/c/…?…",
		"https://h.example/in?TOKENALONE":                                                        "https://h.example/in?…",
		"https://h.example/?":                                                                    "https://h.example/?…",
		// User info is dropped, password or not.
		"https://user:p%40ssword@hooks.example.com:8443/in/{{topic}}": "https://hooks.example.com:8443/in/{{topic}}",
		"https://TOKENASUSER@hooks.example.com/in":                    "https://hooks.example.com/in",
		// A long first segment may be a token itself.
		"https://hook.eu1.make.com/abcdefghijklmnopqrstuvwxyz012345": "https://hook.eu1.make.com/…",
		"https://h.example/%7B%7Btopic%7D%7D/x/%7b%7btopic%7d%7d":    "https://h.example/{{topic}}/…/{{topic}}",
		"https://[2001:db8::1]:8443":                                 "https://[2001:db8::1]:8443",
		"http://h.example/a#fragment-SECRET":                         "http://h.example/a",
		"mailto:SECRET@example.com":                                  "mailto:…",
		"http://h.example/a b%zz":                                    "(unparsable URL)",
	} {
		got := RedactURL(raw)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// echoServer answers every request with status, its body repeating the
// request line and the headers a careless server might echo.
func echoServer(t *testing.T, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "cannot POST "+r.RequestURI+" auth="+r.Header.Get("Authorization")+" cookie="+r.Header.Get("Cookie"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The errors the sink returns are logged and stored as the message's last
// error: a 503 from a URL with credentials in its path, query, user info and
// static headers shows none of them, even when the server echoes the request.
func TestErrorsHideURLSecrets(t *testing.T) {
	t.Parallel()
	srv := echoServer(t, http.StatusServiceUnavailable)
	u, _ := url.Parse(srv.URL)
	base := "http://user:SECRET4@" + u.Host + "/services/T1/B2/SECRET?code=SECRET2&wharf_allow_private=true" +
		"&wharf_header_Authorization=Bearer%20SECRET3&wharf_header_Cookie=session%3DSECRET5"
	for _, mode := range []string{"single", "batch"} {
		s := openURL(t, base+"&wharf_mode="+mode)
		errs := publish(t, s, msg(1, "orders", "k", "{}"))
		err := errAt(errs, 0)
		if err == nil || wharf.IsPermanent(err) || !strings.Contains(err.Error(), "503 Service Unavailable") {
			t.Fatalf("%s: %v, want a retryable 503", mode, err)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: the error shows a secret: %s", mode, err)
		}
		want := "POST " + srv.URL + "/services/…/…/…:"
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `cannot POST /services/T1/B2/…?code=… auth=… cookie=…`) {
			t.Errorf("%s: %q, want it to name %q and keep the rest of the body", mode, err, want)
		}
	}

	// net/http sends the user info as Basic authorization, which the server
	// echoes too.
	s := openURL(t, "http://user:SECRET4@"+u.Host+"/services/T1/B2/SECRET?wharf_allow_private=true")
	basic := base64.StdEncoding.EncodeToString([]byte("user:SECRET4"))
	err := errAt(publish(t, s, msg(1, "orders", "k", "{}")), 0)
	if err == nil || strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), basic) || !strings.Contains(err.Error(), "auth=Basic …") {
		t.Errorf("user info: %v, want an error without the password, even base64-encoded", err)
	}

	// The same URL refused, timed out, redirected, misconfigured.
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	cu, _ := url.Parse(closed.URL)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client leaving
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	su, _ := url.Parse(slow.URL)
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://other.example/services/T9/B9/SECRET6?sig=SECRET7")
		w.WriteHeader(http.StatusFound)
	}))
	defer moved.Close()
	mu, _ := url.Parse(moved.URL)
	secretPath := "/services/T1/B2/SECRET?code=SECRET2&wharf_allow_private=true&wharf_timeout=200ms"
	for what, raw := range map[string]string{
		"connection refused": "http://user:SECRET4@" + cu.Host + secretPath,
		"timeout":            "http://user:SECRET4@" + su.Host + secretPath,
		"redirect":           "http://user:SECRET4@" + mu.Host + secretPath,
	} {
		s := openURL(t, raw)
		for _, err := range publish(t, s, msg(1, "t", "", "{}")) {
			if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "/services/…/…/…") {
				t.Errorf("%s: %v, want an error naming /services/…/…/… without the secrets", what, err)
			}
		}
	}
	for _, raw := range []string{
		"http://user:SECRET4@" + u.Host + "/services/T1/B2/SECRET?code=SECRET2&wharf_mode=fast",
		"http://user:SECRET4@127.0.0.1/services/T1/B2/SECRET?code=SECRET2",
		"http://user:SECRET4@" + u.Host + "/services/T1/B2/SECRET?code=SECRET2&wharf_header_Host=SECRET9",
	} {
		_, err := Open(context.Background(), mustURL(t, raw))
		if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "/services/…/…/…") {
			t.Errorf("Open: %v, want an error naming /services/…/…/… without the secrets", err)
		}
	}
	_, err = New(Options{URL: "http://user:SECRET4@127.0.0.1/services/T1/B2/SECRET?code=SECRET2"})
	if err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("New: %v, want an error without the secrets", err)
	}
}

// With {{topic}} in the path, errors show the topic where it stands.
func TestErrorsShowTopic(t *testing.T) {
	t.Parallel()
	srv := echoServer(t, http.StatusBadRequest)
	s := openURL(t, srv.URL+"/in/SECRETSEGMENT/{{topic}}?wharf_allow_private=true")
	err := errAt(publish(t, s, msg(1, "orders.paid", "", "{}")), 0)
	if want := "POST " + srv.URL + "/in/…/orders.paid: 400 Bad Request"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want it to say %q", err, want)
	}
	if strings.Contains(err.Error(), "SECRETSEGMENT") {
		t.Fatalf("%q shows a hidden segment", err)
	}
}
