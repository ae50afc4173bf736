package wharfconsole_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfconsole"
)

// fakeClock is the console's clock in these tests: it moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// offlineClient is a client without a pool: enough for /api/config and the
// auth in front of every route.
func offlineClient(t *testing.T) *wharf.Client {
	t.Helper()
	c, err := wharf.NewClient(nil, &wharf.Config{Schema: "wharf"})
	require.NoError(t, err)
	return c
}

// call sends one request to h as a browser at host would, from the peer
// remote, and returns the response.
type call struct {
	method, path, body string
	host, remote       string
	cookie             *http.Cookie
	bearer             string
	hdr                map[string]string
	tls                bool
}

// answer is a response, read.
type answer struct {
	StatusCode int
	Header     http.Header
	Body       string
	Cookies    []*http.Cookie
}

func (c call) do(h http.Handler) answer {
	if c.host == "" {
		c.host = "127.0.0.1:9751"
	}
	if c.remote == "" {
		c.remote = "127.0.0.1:50000"
	}
	r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
	r.Host = c.host
	r.RemoteAddr = c.remote
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	if c.method == http.MethodPost && c.path == "/login" {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else if c.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if c.cookie != nil {
		r.AddCookie(c.cookie)
	}
	if c.bearer != "" {
		r.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	for k, v := range c.hdr {
		r.Header.Set(k, v)
	}
	if c.tls {
		r.TLS = &tls.ConnectionState{}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp := w.Result()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{StatusCode: resp.StatusCode, Header: resp.Header, Body: string(b), Cookies: resp.Cookies()}
}

func login(token string) call {
	return call{method: http.MethodPost, path: "/login", body: url.Values{"token": {token}}.Encode()}
}

func sessionCookie(t *testing.T, resp answer) *http.Cookie {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for _, ck := range resp.Cookies {
		if ck.Name == "wharf_console" {
			return ck
		}
	}
	t.Fatal("no session cookie")
	return nil
}

// A console without a token answers only loopback Host names: a page whose
// domain was rebound to 127.0.0.1 is the console's origin to the browser
// (same-origin, so CrossOriginProtection lets it through), and must be
// refused by its Host.
func TestConsoleWithoutTokenRefusesRebindingHosts(t *testing.T) {
	t.Parallel()
	h := wharfconsole.Handler(offlineClient(t), wharfconsole.WithLogger(testLogger()))
	for _, host := range []string{
		"attacker.example:9751", "attacker.example", "localhost.attacker.example:9751", "127.0.0.1.nip.io:9751",
		"0.0.0.0:9751", "10.0.0.1:9751", "[fe80::1%25lo]:9751", "[::ffff:10.0.0.1]:9751",
	} {
		for _, c := range []call{
			{method: http.MethodGet, path: "/api/config"},
			{method: http.MethodGet, path: "/"},
			{method: http.MethodPost, path: "/api/dead/purge", body: `{"ids":["` + wharf.FormatID(1, 1) + `"]}`,
				hdr: map[string]string{"Origin": "http://" + host}},
		} {
			c.host = host
			resp := c.do(h)
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s with Host %q", c.method, c.path, host)
			b := resp.Body
			require.Contains(t, b, "a console without a token answers only to localhost", host)
			require.Equal(t, 1, strings.Count(strings.TrimSpace(b), "\n")+1, "one line")
		}
	}
	// No Host at all (HTTP/1.0): refused too.
	r := httptest.NewRequest(http.MethodGet, "/api/config", nil)
	r.Host = ""
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusForbidden, w.Code)
	for _, host := range []string{"127.0.0.1:9751", "127.0.0.1", "127.8.9.10:80", "localhost:9751", "LocalHost", "[::1]:9751", "[::1]", "[::ffff:127.0.0.1]:9751"} {
		resp := call{method: http.MethodGet, path: "/api/config", host: host}.do(h)
		require.Equal(t, http.StatusOK, resp.StatusCode, "Host %q", host)
	}
	// With a token the name does not matter: the token protects it.
	ht := wharfconsole.Handler(offlineClient(t), wharfconsole.WithToken("tok"), wharfconsole.WithLogger(testLogger()))
	resp := call{method: http.MethodGet, path: "/api/config", host: "console.example.com", bearer: "tok"}.do(ht)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = call{method: http.MethodGet, path: "/api/config", host: "console.example.com"}.do(ht)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// A session is a random id kept on the server: a logout ends it for every
// copy of the cookie, and it ends 12 hours after the login however much it is
// used.
func TestConsoleSessionsEndAtLogoutAndAfterTwelveHours(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h := wharfconsole.Handler(offlineClient(t), wharfconsole.WithToken("tok-1"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithClock(clock.now))
	status := func(ck *http.Cookie) int {
		return call{method: http.MethodGet, path: "/api/config", cookie: ck}.do(h).StatusCode
	}

	ck := sessionCookie(t, login("tok-1").do(h))
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, 12*60*60, ck.MaxAge)
	require.False(t, ck.Secure, "plain HTTP from a browser on this machine")
	require.NotContains(t, ck.Value, "tok-1")
	require.Equal(t, http.StatusOK, status(ck))
	other := sessionCookie(t, login("tok-1").do(h))
	require.NotEqual(t, ck.Value, other.Value, "each login is a session of its own")

	// Logout ends the session on the server: the copied cookie is refused.
	copied := *ck
	resp := call{method: http.MethodPost, path: "/logout", cookie: ck}.do(h)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, http.StatusUnauthorized, status(&copied))
	require.Equal(t, http.StatusSeeOther, call{method: http.MethodGet, path: "/", cookie: &copied}.do(h).StatusCode, "the page sends it to the login form")
	require.Equal(t, http.StatusOK, status(other), "another session is not ended")

	// Twelve hours after the login, used or not, the session ends.
	clock.advance(12*time.Hour - time.Second)
	require.Equal(t, http.StatusOK, status(other))
	clock.advance(time.Second)
	require.Equal(t, http.StatusUnauthorized, status(other))
	require.Equal(t, http.StatusOK, status(sessionCookie(t, login("tok-1").do(h))), "a new login works")
	// A made-up cookie is no session.
	require.Equal(t, http.StatusUnauthorized, status(&http.Cookie{Name: "wharf_console", Value: "x"}))
}

// The cookie is Secure when the browser came over TLS: Go terminated it, or
// a proxy on this machine says so; the header from a peer elsewhere is not
// believed.
func TestConsoleCookieSecureOverTLS(t *testing.T) {
	t.Parallel()
	h := wharfconsole.Handler(offlineClient(t), wharfconsole.WithToken("tok-1"), wharfconsole.WithLogger(testLogger()))
	c := login("tok-1")
	c.tls = true
	require.True(t, sessionCookie(t, c.do(h)).Secure, "TLS terminated by Go")
	c = login("tok-1")
	c.hdr = map[string]string{"X-Forwarded-Proto": "https"}
	require.True(t, sessionCookie(t, c.do(h)).Secure, "TLS terminated by a proxy on this machine")
	c.remote = "[::1]:40000"
	require.True(t, sessionCookie(t, c.do(h)).Secure, "TLS terminated by a proxy on this machine (IPv6)")
	c.remote = "192.0.2.7:40000"
	require.False(t, sessionCookie(t, c.do(h)).Secure, "X-Forwarded-Proto from a peer elsewhere")
	c = login("tok-1")
	c.hdr = map[string]string{"X-Forwarded-Proto": "http"}
	require.False(t, sessionCookie(t, c.do(h)).Secure)
}

// Wrong tokens slow a client down: after 10 in a row it must wait 1 s before
// its next token is checked, twice as long after each further failure, up to
// a minute; a correct token clears the count. Other clients are not slowed.
// The clock is the test's: every decision is checked at a known time.
func TestConsoleSlowsDownWrongTokens(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h := wharfconsole.Handler(offlineClient(t), wharfconsole.WithToken("tok-1"), wharfconsole.WithLogger(testLogger()), wharfconsole.WithClock(clock.now))
	from := func(c call, remote string) answer {
		c.remote = remote
		return c.do(h)
	}
	const a, b = "192.0.2.1:1000", "192.0.2.2:1000"
	for i := 0; i < 10; i++ {
		require.Equal(t, http.StatusUnauthorized, from(login("wrong"), a).StatusCode, "wrong token %d", i+1)
	}
	// The 11th attempt waits, even with the right token, by the form or
	// the header.
	resp := from(login("tok-1"), a)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Empty(t, resp.Cookies)
	require.Contains(t, resp.Body, "Too many wrong tokens from your address: try again in 1 s.")
	resp = from(call{method: http.MethodGet, path: "/api/config", bearer: "tok-1"}, a)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Contains(t, resp.Body, "too many wrong tokens")
	require.Equal(t, http.StatusSeeOther, from(login("tok-1"), b).StatusCode, "another client is not slowed")

	// A second later one attempt is checked; failing doubles the wait.
	clock.advance(time.Second)
	require.Equal(t, http.StatusUnauthorized, from(call{method: http.MethodGet, path: "/api/config", bearer: "wrong"}, a).StatusCode)
	clock.advance(time.Second)
	resp = from(login("tok-1"), a)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	clock.advance(time.Second)
	for want := 4 * time.Second; want <= 4*time.Minute; want *= 2 {
		require.Equal(t, http.StatusUnauthorized, from(login("wrong"), a).StatusCode)
		wait := min(want, time.Minute)
		clock.advance(wait - time.Second)
		resp = from(login("wrong"), a)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "waiting %s", wait)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		clock.advance(time.Second)
	}
	// The right token, once checked, clears the count.
	require.Equal(t, http.StatusSeeOther, from(login("tok-1"), a).StatusCode)
	require.Equal(t, http.StatusUnauthorized, from(login("wrong"), a).StatusCode)
	require.Equal(t, http.StatusUnauthorized, from(login("wrong"), a).StatusCode, "the count started again")

	// An IPv6 client is counted by its /64.
	for i := 0; i < 10; i++ {
		require.Equal(t, http.StatusUnauthorized, from(login("wrong"), fmt.Sprintf("[2001:db8:1:2::%x]:1000", i+1)).StatusCode)
	}
	require.Equal(t, http.StatusTooManyRequests, from(login("tok-1"), "[2001:db8:1:2::ffff]:1000").StatusCode)
	require.Equal(t, http.StatusSeeOther, from(login("tok-1"), "[2001:db8:1:3::1]:1000").StatusCode)

	// Failures an hour old are forgotten.
	c := "192.0.2.3:1000"
	for i := 0; i < 9; i++ {
		require.Equal(t, http.StatusUnauthorized, from(login("wrong"), c).StatusCode)
	}
	clock.advance(time.Hour)
	require.Equal(t, http.StatusUnauthorized, from(login("wrong"), c).StatusCode)
	require.Equal(t, http.StatusUnauthorized, from(login("wrong"), c).StatusCode, "the count started again")
}
