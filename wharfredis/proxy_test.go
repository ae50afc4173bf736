package wharfredis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// cmdProxy is a TCP proxy to a Redis server that forwards one command at a
// time: it reads a command from the client, calls hook with it, sends it,
// waits for the server's reply and passes it on. So whatever hook does to
// the server (through another connection) happens exactly between two
// commands of the client's pipeline.
type cmdProxy struct {
	target string
	addr   string
	ln     net.Listener

	mu    sync.Mutex
	hook  func(cmd []string)
	conns []net.Conn
	wg    sync.WaitGroup
}

func startCmdProxy(t *testing.T, target string) *cmdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cmdProxy{target: target, addr: ln.Addr().String(), ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { p.serve(c, s) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// setHook makes hook see every later command (nil: none).
func (p *cmdProxy) setHook(hook func(cmd []string)) {
	p.mu.Lock()
	p.hook = hook
	p.mu.Unlock()
}

func (p *cmdProxy) serve(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	cr, sr := bufio.NewReader(c), bufio.NewReader(s)
	for {
		raw, cmd, err := readCommand(cr)
		if err != nil {
			return
		}
		p.mu.Lock()
		hook := p.hook
		p.mu.Unlock()
		if hook != nil {
			hook(cmd)
		}
		if _, err := s.Write(raw); err != nil {
			return
		}
		reply, err := readValue(sr, nil)
		if err != nil {
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// readCommand reads one client command, an array of bulk strings.
func readCommand(r *bufio.Reader) (raw []byte, cmd []string, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, nil, err
	}
	if line[0] != '*' {
		return nil, nil, fmt.Errorf("not an array: %q", line)
	}
	raw = append(raw, line...)
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return nil, nil, err
	}
	for range n {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, nil, err
		}
		size, err := strconv.Atoi(string(hdr[1 : len(hdr)-2]))
		if err != nil || hdr[0] != '$' {
			return nil, nil, fmt.Errorf("not a bulk string: %q", hdr)
		}
		body := make([]byte, size+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, nil, err
		}
		raw = append(append(raw, hdr...), body...)
		cmd = append(cmd, string(body[:size]))
	}
	return raw, cmd, nil
}

// readValue appends one whole RESP2 or RESP3 reply to raw.
func readValue(r *bufio.Reader, raw []byte) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return raw, err
	}
	if len(line) < 3 {
		return raw, errors.New("short line")
	}
	raw = append(raw, line...)
	n := 0
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return raw, nil
	}
	if n, err = strconv.Atoi(string(line[1 : len(line)-2])); err != nil {
		return raw, err
	}
	switch line[0] {
	case '$', '=', '!':
		if n < 0 {
			return raw, nil
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return raw, err
		}
		return append(raw, body...), nil
	case '*', '~', '>':
	case '%':
		n *= 2
	case '|':
		n = 2*n + 1 // the attributes, then the reply they qualify
	default:
		return raw, fmt.Errorf("unknown reply type %q", line[0])
	}
	for range n {
		if raw, err = readValue(r, raw); err != nil {
			return raw, err
		}
	}
	return raw, nil
}
