package wharfconsole

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

const (
	// sessionTTL is how long a login lasts, from the login (not extended
	// by use).
	sessionTTL = 12 * time.Hour
	// maxSessions bounds the sessions kept; past it the one closest to its
	// end is dropped.
	maxSessions = 1000

	// After freeFailures wrong tokens in a row from one client, the client
	// waits firstBackoff before its next attempt is checked, twice as long
	// after each further failure, up to maxBackoff. A correct token, or forgetFailures without a failure,
	// clears the count.
	freeFailures   = 10
	firstBackoff   = time.Second
	maxBackoff     = time.Minute
	forgetFailures = time.Hour
	// maxClients bounds the clients whose failures are counted one by
	// one; failures of further clients share one count.
	maxClients = 4096
)

// sessions are the console's logins: the cookie holds a random id, the
// server keeps its hash and its end, so a logout ends it for every copy of
// the cookie.
type sessions struct {
	mu  sync.Mutex
	now func() time.Time
	end map[[32]byte]time.Time // by SHA-256 of the id
}

func newSessions(now func() time.Time) *sessions {
	return &sessions{now: now, end: map[[32]byte]time.Time{}}
}

// create starts a session and returns its id and end.
func (s *sessions) create() (string, time.Time) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	id := base64.RawURLEncoding.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if len(s.end) >= maxSessions {
		for k, end := range s.end {
			if !end.After(now) {
				delete(s.end, k)
			}
		}
	}
	if len(s.end) >= maxSessions {
		var first [32]byte
		var firstEnd time.Time
		for k, end := range s.end {
			if firstEnd.IsZero() || end.Before(firstEnd) {
				first, firstEnd = k, end
			}
		}
		delete(s.end, first)
	}
	end := now.Add(sessionTTL)
	s.end[sha256.Sum256([]byte(id))] = end
	return id, end
}

// valid reports whether id is a session that has not ended. The map is
// keyed by the id's hash, so the lookup's time says nothing about the id.
func (s *sessions) valid(id string) bool {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	end, ok := s.end[k]
	if ok && !end.After(s.now()) {
		delete(s.end, k)
		return false
	}
	return ok
}

// remove ends session id.
func (s *sessions) remove(id string) {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.end, k)
}

// failures slows down guessing the token: it counts wrong tokens per
// client (its address; an IPv6 client by its /64) and makes a client that
// keeps failing wait before its next attempt is checked.
type failures struct {
	mu      sync.Mutex
	now     func() time.Time
	clients map[string]*strikes
}

type strikes struct {
	n     int
	last  time.Time // the last failure
	until time.Time // no attempt is checked before
}

// overflow is the shared count of clients beyond maxClients.
const overflow = "*"

func newFailures(now func() time.Time) *failures {
	return &failures{now: now, clients: map[string]*strikes{}}
}

// lookup returns client's record, or the shared one when client has none
// and the table is full (create: make one if there is room). Called with
// mu held.
func (f *failures) lookup(client string, create bool) *strikes {
	if s, ok := f.clients[client]; ok {
		return s
	}
	now := f.now()
	if len(f.clients) >= maxClients {
		for k, s := range f.clients {
			if now.Sub(s.last) >= forgetFailures && !s.until.After(now) {
				delete(f.clients, k)
			}
		}
	}
	if len(f.clients) >= maxClients {
		client = overflow
		if s, ok := f.clients[client]; ok {
			return s
		}
	}
	if !create {
		return nil
	}
	s := &strikes{}
	f.clients[client] = s
	return s
}

// wait is how long client must wait before a token it sends is checked (0:
// check it now).
func (f *failures) wait(client string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.lookup(client, false)
	if s == nil {
		return 0
	}
	return max(0, s.until.Sub(f.now()))
}

// failed records a wrong token from client.
func (f *failures) failed(client string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.lookup(client, true)
	now := f.now()
	if now.Sub(s.last) >= forgetFailures {
		s.n = 0
	}
	s.n++
	s.last = now
	if s.n >= freeFailures {
		d := firstBackoff << min(s.n-freeFailures, 16)
		s.until = now.Add(min(d, maxBackoff))
	}
}

// succeeded forgets client's failures.
func (f *failures) succeeded(client string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.clients, client)
}

// clientOf names the peer of r for counting failures: its IP address, or
// for IPv6 its /64 (one host commonly holds a whole /64). Forwarding
// headers are not trusted: behind a proxy every client is the proxy.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// loopbackHost reports whether a Host header names this machine's loopback
// interface: localhost, or an IP literal in 127.0.0.0/8 or ::1, with or
// without a port. A console without a token answers only these: any other
// name could be an attacker's domain rebound to 127.0.0.1, whose pages the
// browser would then treat as the console's own origin.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

// overTLS reports whether the browser reached the console over TLS: Go
// terminated TLS itself, or a proxy on this machine (a loopback peer) says
// so with X-Forwarded-Proto: https. The header of a peer elsewhere is not
// trusted (anyone could send it).
func overTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https") {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
