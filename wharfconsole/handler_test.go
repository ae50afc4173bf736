package wharfconsole_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
)

type apiClient struct {
	t     *testing.T
	base  string
	token string
	hc    *http.Client
}

func newAPIClient(t *testing.T, base, token string) *apiClient {
	return &apiClient{t: t, base: base, token: token, hc: &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (a *apiClient) do(method, path, body string, hdr ...string) (int, http.Header, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	require.NoError(a.t, err)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := a.hc.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	return resp.StatusCode, resp.Header, string(b)
}

func enqueueOne(t *testing.T, c *wharf.Client, m wharf.Message) string {
	t.Helper()
	ids, err := c.Enqueue(context.Background(), m)
	require.NoError(t, err)
	return ids[0]
}

// The API under a prefix: auth by header and cookie, CSRF refusal, read-only
// refusal, bad input named, and the changes made.
func TestHandlerAPI(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Logger: testLogger()})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", wharfconsole.Handler(c, wharfconsole.WithToken("tok-1"), wharfconsole.WithLogger(testLogger()))))
	mux.Handle("/ro/", http.StripPrefix("/ro", wharfconsole.Handler(c, wharfconsole.WithToken("tok-1"), wharfconsole.WithReadOnly(true))))
	mux.Handle("/open/", http.StripPrefix("/open", wharfconsole.Handler(c)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	later := time.Now().Add(time.Hour)
	id := enqueueOne(t, c, wharf.Message{Topic: "t", Key: "<b>k</b>", Payload: []byte{0xff, 0x00, 0x01}, DeliverAt: later, Headers: map[string]string{"h": "<i>v</i>"}})
	enqueueOne(t, c, wharf.Message{Topic: "t", Key: "<b>k</b>", Payload: []byte("plain text")})

	anon := newAPIClient(t, srv.URL, "")
	code, hdr, _ := anon.do("GET", "/console/", "")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "./login", hdr.Get("Location"))
	code, _, body := anon.do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "Authorization: Bearer")
	code, _, _ = anon.do("GET", "/console/login", "")
	require.Equal(t, http.StatusOK, code)
	code, _, _ = newAPIClient(t, srv.URL, "tok-2").do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = newAPIClient(t, srv.URL, "tok-").do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = anon.do("GET", "/console/api/status", "", "Authorization", "Basic dG9rLTE=")
	require.Equal(t, http.StatusUnauthorized, code)
	// No token configured: open.
	code, _, _ = anon.do("GET", "/open/api/status", "")
	require.Equal(t, http.StatusOK, code)

	// The login form sets an HttpOnly SameSite=Strict cookie that works.
	form := url.Values{"token": {"wrong"}}.Encode()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/console/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := anon.hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Empty(t, resp.Cookies())
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/console/login", strings.NewReader(url.Values{"token": {"tok-1"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = anon.hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, resp.Cookies(), 1)
	ck := resp.Cookies()[0]
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.NotContains(t, ck.Value, "tok-1")
	code, _, _ = anon.do("GET", "/console/api/config", "", "Cookie", ck.Name+"="+ck.Value)
	require.Equal(t, http.StatusOK, code)

	a := newAPIClient(t, srv.URL, "tok-1")
	code, _, body = a.do("GET", "/console/api/pending", "")
	require.Equal(t, http.StatusOK, code, body)
	var pend struct {
		Messages []struct {
			ID      string            `json:"id"`
			Key     string            `json:"key"`
			State   string            `json:"state"`
			Headers map[string]string `json:"headers"`
			Payload struct{ Kind, Body string }
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &pend))
	require.Len(t, pend.Messages, 2)
	require.Equal(t, "<b>k</b>", pend.Messages[0].Key)
	require.Equal(t, "scheduled", pend.Messages[0].State)
	require.Equal(t, "base64", pend.Messages[0].Payload.Kind)
	require.Equal(t, "/wAB", pend.Messages[0].Payload.Body)
	require.Equal(t, "text", pend.Messages[1].Payload.Kind)

	code, _, body = a.do("GET", "/console/api/blocked", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"waiting":1`)

	// Bad input: one line naming the problem.
	code, _, body = a.do("GET", "/console/api/pending?id=nope", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, `id \"nope\"`)
	code, _, body = a.do("GET", "/console/api/dead?limit=0", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "from 1 to 1000")
	code, _, body = a.do("POST", "/console/api/pending/cancel", `{"ids":[]}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "no message selected")
	code, _, _ = a.do("POST", "/console/api/pending/cancel", `{"ids":["`+id+`"]}`, "Content-Type", "text/plain")
	require.Equal(t, http.StatusUnsupportedMediaType, code)
	code, _, body = a.do("POST", "/console/api/pending/reschedule", `{"ids":["`+id+`"],"at":"tomorrow"}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "RFC 3339")
	code, _, _ = a.do("GET", "/console/api/pending/cancel", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)

	// Cross-origin changes are refused, even with the token.
	code, _, body = a.do("POST", "/console/api/pending/cancel", `{"ids":["`+id+`"]}`, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "cross-origin")
	code, _, _ = a.do("POST", "/console/api/pending/cancel", `{"ids":["`+id+`"]}`, "Origin", "https://evil.example")
	require.Equal(t, http.StatusForbidden, code)
	// Read-only refuses.
	code, _, body = a.do("POST", "/ro/api/pending/cancel", `{"ids":["`+id+`"]}`)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "read-only")
	code, _, body = a.do("GET", "/ro/api/config", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"read_only":true`)

	// Reschedule to now, then cancel: the changes happen.
	code, _, body = a.do("POST", "/console/api/pending/reschedule", `{"ids":["`+id+`"],"at":"`+time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339)+`"}`, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"rescheduled":1}`, body)
	code, _, body = a.do("POST", "/console/api/pending/cancel", `{"ids":["`+id+`"]}`)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"cancelled":1}`, body)
	ps, err := c.PendingMessages(context.Background(), wharf.PendingFilter{})
	require.NoError(t, err)
	require.Len(t, ps, 1)

	// Security headers and assets.
	code, hdr, body = a.do("GET", "/console/assets/app.js", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, hdr.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"))
	require.NotContains(t, body, "innerHTML", "the script must put values in the page as text only")
	code, _, _ = a.do("GET", "/console/api/nothing", "")
	require.Equal(t, http.StatusNotFound, code)
}
