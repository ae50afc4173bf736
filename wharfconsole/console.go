// Package wharfconsole serves a web console for operators of a wharf outbox:
// the backlog and throughput live, the relays and their lane leases, the
// keys held behind a scheduled or retrying message and why, and the pending
// messages and dead letters, which it can cancel, reschedule, retry or purge.
//
//	client, _ := wharf.NewClient(pool, cfg)
//	mux.Handle("/console/", http.StripPrefix("/console", wharfconsole.Handler(client,
//		wharfconsole.WithToken(os.Getenv("CONSOLE_TOKEN")))))
//
// The pages, script and style sheet are embedded in the binary (no CDN, no
// build step). Every value read from the database is put in the page as
// text, never as markup, and the Content-Security-Policy allows scripts and
// styles from the console itself only.
//
// # Security
//
// With [WithToken], every request needs the token: as an Authorization:
// Bearer header, or the session cookie the login form sets (HttpOnly,
// SameSite=Strict, holding a MAC of the token rather than the token). Tokens
// are compared in constant time. Without a token anyone who reaches the
// handler may use it: serve it on a loopback address only.
//
// Changes (cancel, reschedule, retry, purge) are POST requests with a JSON
// body, refused from other origins ([http.CrossOriginProtection]: the
// Sec-Fetch-Site and Origin headers). [WithReadOnly] refuses them all (403)
// and the pages hide their buttons.
package wharfconsole

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/wharfhq/wharf"
)

//go:embed assets
var assets embed.FS

// Option configures [Handler].
type Option func(*options)

type options struct {
	token    string
	readOnly bool
	logger   *slog.Logger
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
	c       *wharf.Client
	o       options
	session string // the cookie value: a MAC of the token
	static  http.Handler
	login   *template.Template
	// indexHTML is the pages' one document.
	indexHTML []byte
}

// Handler serves the console for c. Paths are relative, so it works mounted
// under any prefix with [http.StripPrefix]:
//
//   - / : the pages (one document; #/overview, #/relays, #/lanes, #/blocked,
//     #/pending, #/dead);
//   - /assets/ : its script and style sheet;
//   - /login, /logout : the token form, when a token is set;
//   - /api/ : the JSON API the pages use (GET reads, POST changes).
func Handler(c *wharf.Client, opts ...Option) http.Handler {
	o := options{logger: slog.Default()}
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
	if o.token != "" {
		mac := hmac.New(sha256.New, []byte(o.token))
		mac.Write([]byte("wharf console session v1"))
		h.session = hex.EncodeToString(mac.Sum(nil))
	}
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
	return cop.Handler(h.secure(mux))
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
		if h.session == "" || r.URL.Path == "/login" || r.URL.Path == "/assets/app.css" || h.authorized(r) {
			next.ServeHTTP(w, r)
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

func (h *console) authorized(r *http.Request) bool {
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, ok := strings.Cut(auth, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && h.tokenOK(strings.TrimSpace(tok))
	}
	ck, err := r.Cookie(cookieName)
	return err == nil && subtle.ConstantTimeCompare([]byte(ck.Value), []byte(h.session)) == 1
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
	h.renderLogin(w, http.StatusOK, loginData{NoToken: h.session == ""})
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
	if h.session == "" {
		redirect(w, r.URL.Path, "")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil || !h.tokenOK(r.PostForm.Get("token")) {
		h.o.logger.Warn("wharfconsole: login refused", "remote", r.RemoteAddr)
		h.renderLogin(w, http.StatusUnauthorized, loginData{Error: "Wrong token: enter the token the console was started with (--console-token)."})
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    h.session,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
		Secure:   r.TLS != nil,
	})
	redirect(w, r.URL.Path, "")
}

func (h *console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
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
