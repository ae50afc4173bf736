// Package tcpgate is a TCP proxy for tests of broker outages: shut, it
// refuses connections and closes the open ones, as a host that went down;
// opened again, it accepts on the same port, so clients reconnect to the
// address they had.
package tcpgate

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Gate is a TCP proxy that can be shut (connections are refused, as by a
// host that is down) and opened again on the same port.
type Gate struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// New starts an open gate to target (host:port); it is closed at t's
// cleanup.
func New(t testing.TB, target string) *Gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tcpgate: %v", err)
	}
	g := &Gate{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	g.serve(ln)
	t.Cleanup(func() { g.Shut(); g.wg.Wait() })
	return g
}

// Endpoint is the gate's base URL for HTTP clients.
func (g *Gate) Endpoint() string { return "http://" + g.addr }

// Addr is the gate's host:port.
func (g *Gate) Addr() string { return g.addr }

// Shut refuses new connections and closes the open ones.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		_ = g.ln.Close()
		g.ln = nil
	}
	for c := range g.conns {
		_ = c.Close()
	}
}

// Open accepts connections again, on the same port.
func (g *Gate) Open(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", g.addr)
	if err != nil {
		t.Fatalf("tcpgate: reopen the gate on %s: %v", g.addr, err)
	}
	g.serve(ln)
}

func (g *Gate) serve(ln net.Listener) {
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", g.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			g.mu.Lock()
			g.conns[c], g.conns[up] = struct{}{}, struct{}{}
			g.mu.Unlock()
			g.wg.Add(2)
			go g.pipe(c, up)
			go g.pipe(up, c)
		}
	}()
}

func (g *Gate) pipe(dst, src net.Conn) {
	defer g.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	g.mu.Lock()
	delete(g.conns, dst)
	delete(g.conns, src)
	g.mu.Unlock()
}
