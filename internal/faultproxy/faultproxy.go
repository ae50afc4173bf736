// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a server: it can stall (swallow bytes without closing,
// as a partition or a dead host does), reset every connection, or add
// latency.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	delay   time.Duration
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// New starts a proxy on a free loopback port forwarding to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall stops forwarding bytes in both directions; connections stay open and
// new ones are accepted but carry nothing, as when packets are dropped.
func (p *Proxy) Stall() { p.mu.Lock(); p.stalled = true; p.mu.Unlock() }

// Resume forwards again.
func (p *Proxy) Resume() { p.mu.Lock(); p.stalled = false; p.cond.Broadcast(); p.mu.Unlock() }

// Delay adds d before each chunk forwarded (a slow link).
func (p *Proxy) Delay(d time.Duration) { p.mu.Lock(); p.delay = d; p.mu.Unlock() }

// Reset closes every open connection (the peers see a reset or EOF).
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			d, closed := p.delay, p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}
