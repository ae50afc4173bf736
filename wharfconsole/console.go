// Package wharfconsole serves a web console for operators of a wharf outbox:
// the backlog and throughput live, the relays and their lane leases, the
// keys held behind a scheduled or retrying message and why, the pending
// messages and dead letters, which it can cancel, reschedule, retry or purge,
// and with [WithFlows] the durable flows (package wharfflow), which it can
// retry, cancel or signal.
//
//	client, _ := wharf.NewClient(pool, cfg)
//	flows, _ := wharfflow.NewClient(pool, cfg.Schema)
//	mux.Handle("/console/", http.StripPrefix("/console", wharfconsole.Handler(client,
//		wharfconsole.WithToken(os.Getenv("CONSOLE_TOKEN")), wharfconsole.WithFlows(flows))))
//
// The pages, script and style sheet are embedded in the binary (no CDN, no
// build step). Every value read from the database is put in the page as
// text, never as markup, and the Content-Security-Policy allows scripts and
// styles from the console itself only.
//
// # Security
//
// With [WithToken], every request needs the token: as an Authorization:
// Bearer header, or the session cookie the login form sets. The cookie
// (HttpOnly, SameSite=Strict, Secure when the request came over TLS, see
// below) holds a random session id, not the token; the session ends 12 hours
// after the login, however much it is used, or when it logs out, which ends
// it on the server too, for every copy of the cookie. Sessions live in the
// handler's memory: a restart logs everybody out. The cookie is Secure when
// Go terminated TLS, or when a proxy on the same machine (a loopback peer)
// sends X-Forwarded-Proto: https; a proxy elsewhere is not trusted with that
// header. Tokens are compared in constant time. Wrong tokens (login form or
// Bearer header) are counted per client address (an IPv6 client by its
// /64): after 10 in a row, the client must wait 1 s before its next token is
// checked (answered 429 with Retry-After meanwhile), twice as long after
// each further failure, up to a minute; a correct token clears the count.
// Behind a proxy every client is the proxy.
//
// Without a token anyone who reaches the handler may use it: serve it on a
// loopback address only. It then answers only requests whose Host is
// localhost or a loopback IP literal (127.0.0.0/8, [::1]), with any port,
// and refuses others (403): a web page whose domain an attacker points at
// 127.0.0.1 (DNS rebinding) would otherwise be the console's own origin to
// the browser, and could read and change the outbox.
//
// Changes (cancel, reschedule, retry, purge; a flow's retry, cancel and
// signal) are POST requests with a JSON body, refused from other origins
// ([http.CrossOriginProtection]: the Sec-Fetch-Site and Origin headers).
// [WithReadOnly] refuses them all (403) and the pages hide their buttons.
package wharfconsole

import (
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfflow"
)

//go:embed assets
var assets embed.FS

// Option configures [Handler].
type Option func(*options)

type options struct {
	token    string
	readOnly bool
	logger   *slog.Logger
	flows    *wharfflow.Client // WithFlows
	now      func() time.Time  // the sessions' and the login back-off's clock
}

// WithToken requires token on every request (see the package
// documentation). An empty token requires nothing.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithReadOnly refuses every change (403) and hides the pages' buttons.
func WithReadOnly(readOnly bool) Option { return func(o *options) { o.readOnly = readOnly } }

// WithLogger sets where the console logs the changes it makes and the errors
// it meets. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// cookieName is the session cookie set by the login form.
const cookieName = "wharf_console"

type console struct {
	c        *wharf.Client
	o        options
	sessions *sessions
	failures *failures
	static   http.Handler
	login    *template.Template
	// indexHTML is the pages' one document.
	indexHTML []byte
}

// Handler serves the console for c. Paths are relative, so it works mounted
// under any prefix with [http.StripPrefix]:
//
//   - / : the pages (one document; #/overview, #/relays, #/lanes, #/blocked,
//     #/pending, #/dead, #/flows and #/flow?id=N);
//   - /assets/ : its script and style sheet;
//   - /login, /logout : the token form, when a token is set;
//   - /api/ : the JSON API the pages use (GET reads, POST changes).
func Handler(c *wharf.Client, opts ...Option) http.Handler {
	o := options{logger: slog.Default(), now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is part of the build
	}
	h := &console{
		c:      c,
		o:      o,
		static: http.StripPrefix("/assets", http.FileServerFS(sub)),
		login:  template.Must(template.ParseFS(assets, "assets/login.html")),
	}
	if h.indexHTML, err = assets.ReadFile("assets/index.html"); err != nil {
		panic(err)
	}
	h.sessions = newSessions(o.now)
	h.failures = newFailures(o.now)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.index)
	mux.HandleFunc("GET /index.html", h.index)
	mux.Handle("GET /assets/", h.static)
	mux.HandleFunc("GET /login", h.loginPage)
	mux.HandleFunc("POST /login", h.loginSubmit)
	mux.HandleFunc("POST /logout", h.logout)
	h.api(mux)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: use the console from its own address")
	}))
	return h.loopbackOnly(cop.Handler(h.secure(mux)))
}

// loopbackOnly refuses, on a console without a token, requests whose Host is
// not a loopback name (see the package documentation: DNS rebinding).
func (h *console) loopbackOnly(next http.Handler) http.Handler {
	if h.o.token != "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("Host %q refused: a console without a token answers only to localhost, 127.0.0.1 or [::1]; open it by one of those, or set a token to serve it under other names", r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// secure sets the security headers, and asks for the token on everything but
// the login form and the assets it uses.
func (h *console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		if r.URL.Path == "" {
			r.URL.Path = "/" // mounted with StripPrefix("/console") and asked for /console
		}
		if h.o.token == "" || r.URL.Path == "/login" || r.URL.Path == "/assets/app.css" {
			next.ServeHTTP(w, r)
			return
		}
		switch h.authorized(w, r) {
		case authOK:
			next.ServeHTTP(w, r)
			return
		case authAnswered:
			return
		}
		if strings.HasPrefix(r.URL.Path, "/api/") || r.Method != http.MethodGet {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wharf console"`)
			writeError(w, http.StatusUnauthorized, "the console needs its token: send Authorization: Bearer <token> or log in on the login page")
			return
		}
		redirect(w, r.URL.Path, "login")
	})
}

// redirect sends a relative redirect from path (within the console) to
// target (also within it), so that it works under any mount prefix.
func redirect(w http.ResponseWriter, path, target string) {
	up := strings.Repeat("../", max(0, strings.Count(strings.TrimPrefix(path, "/"), "/")))
	if up == "" {
		up = "./"
	}
	w.Header().Set("Location", up+target)
	w.WriteHeader(http.StatusSeeOther)
}

type authResult int

const (
	authNo       authResult = iota // no valid token or session
	authOK                         // a valid token or session
	authAnswered                   // refused and answered (429: too many wrong tokens)
)

func (h *console) authorized(w http.ResponseWriter, r *http.Request) authResult {
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return authNo
		}
		client := clientOf(r)
		if wait := h.failures.wait(client); wait > 0 {
			tooMany(w, wait)
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many wrong tokens from your address: try again in %s", retrySeconds(wait)))
			return authAnswered
		}
		if !h.tokenOK(strings.TrimSpace(tok)) {
			h.failures.failed(client)
			return authNo
		}
		h.failures.succeeded(client)
		return authOK
	}
	if ck, err := r.Cookie(cookieName); err == nil && h.sessions.valid(ck.Value) {
		return authOK
	}
	return authNo
}

// tooMany sets Retry-After for a client that must wait.
func tooMany(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
}

func retrySeconds(wait time.Duration) string {
	return strconv.Itoa(int((wait+time.Second-1)/time.Second)) + " s"
}

// tokenOK compares in constant time (hashing first, so that the time does
// not depend on the lengths either).
func (h *console) tokenOK(tok string) bool {
	a := sha256.Sum256([]byte(tok))
	b := sha256.Sum256([]byte(h.o.token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func (h *console) index(w http.ResponseWriter, _ *http.Request) {
	// Written directly: the file server redirects .../index.html to ./
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(h.indexHTML)
}

type loginData struct {
	Error   string
	NoToken bool
}

func (h *console) loginPage(w http.ResponseWriter, _ *http.Request) {
	h.renderLogin(w, http.StatusOK, loginData{NoToken: h.o.token == ""})
}

func (h *console) renderLogin(w http.ResponseWriter, status int, d loginData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := h.login.Execute(w, d); err != nil {
		h.o.logger.Warn("wharfconsole: rendering the login page", "err", err)
	}
}

func (h *console) loginSubmit(w http.ResponseWriter, r *http.Request) {
	if h.o.token == "" {
		redirect(w, r.URL.Path, "")
		return
	}
	client := clientOf(r)
	if wait := h.failures.wait(client); wait > 0 {
		h.o.logger.Warn("wharfconsole: login refused: too many wrong tokens", "remote", r.RemoteAddr)
		tooMany(w, wait)
		h.renderLogin(w, http.StatusTooManyRequests, loginData{Error: "Too many wrong tokens from your address: try again in " + retrySeconds(wait) + "."})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil || !h.tokenOK(r.PostForm.Get("token")) {
		h.failures.failed(client)
		h.o.logger.Warn("wharfconsole: login refused", "remote", r.RemoteAddr)
		h.renderLogin(w, http.StatusUnauthorized, loginData{Error: "Wrong token: enter the token the console was started with (--console-token)."})
		return
	}
	h.failures.succeeded(client)
	id, end := h.sessions.create()
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    id,
		Expires:  end,
		MaxAge:   int(sessionTTL / time.Second),
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
		Secure:   overTLS(r),
	})
	redirect(w, r.URL.Path, "")
}

// logout ends the session on the server (a copy of the cookie stops
// working) and clears the cookie.
func (h *console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		h.sessions.remove(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overTLS(r)})
	redirect(w, r.URL.Path, "login")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// badRequest is a mistake in the request, reported as it is.
type badRequest string

func (b badRequest) Error() string { return string(b) }

// errorStatus maps library errors to statuses: bad input is the caller's.
func errorStatus(err error) int {
	var br badRequest
	switch {
	case errors.As(err, &br):
		return http.StatusBadRequest
	case errors.Is(err, wharf.ErrBadID), errors.Is(err, wharf.ErrNoSelection):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
