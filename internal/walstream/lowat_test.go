package walstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair is a connected loopback TCP pair: the reader wrapped as the
// stream's connection is, and the writer.
func tcpPair(t *testing.T) (*lowatConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	rc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	wc := <-accepted
	require.NotNil(t, wc)
	t.Cleanup(func() { _ = rc.Close(); _ = wc.Close() })
	lc, ok := newLowatConn(rc).(*lowatConn)
	require.True(t, ok, "a TCP connection is wrapped")
	return lc, wc
}

// A busy reader gets every byte of many small writes, in order.
func TestLowatConnReadsAManySmallWritesStreamWhole(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	r.busy = true
	var want bytes.Buffer
	for i := range 20000 {
		want.WriteString("message ")
		want.WriteByte(byte('a' + i%26))
	}
	go func() {
		b := want.Bytes()
		for len(b) > 0 {
			n := min(9, len(b))
			if _, err := w.Write(b[:n]); err != nil {
				return
			}
			b = b[n:]
		}
		_ = w.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, want.Bytes(), got)
}

// In busy mode, a write below the low-water mark is still read (after the
// wait, or at once when it is there).
func TestLowatConnReadsALoneMessage(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	r.busy = true
	_, err := w.Write([]byte("BEGIN"))
	require.NoError(t, err)
	buf := make([]byte, 1024)
	n, err := io.ReadAtLeast(r, buf, 5)
	require.NoError(t, err)
	require.Equal(t, "BEGIN", string(buf[:n]))
	// The next read finds nothing: it waits, then takes the lone message.
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err = r.Read(buf)
	}()
	_, werr := w.Write([]byte("COMMIT"))
	require.NoError(t, werr)
	<-done
	require.NoError(t, err)
	require.Equal(t, "COMMIT", string(buf[:n]))
}

// The caller's deadline ends a busy read (walstream's status updates and
// a cancelled context rely on it), and reads work again after it.
func TestLowatConnKeepsTheCallersDeadline(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	r.busy = true
	errc := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 64))
		errc <- err
	}()
	// From another goroutine, as a context's AfterFunc does; whether it
	// lands before or during the read, the read must end with it.
	require.NoError(t, r.SetReadDeadline(time.Unix(1, 0)))
	err := <-errc
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "read ended with %v", err)

	require.NoError(t, r.SetReadDeadline(time.Time{}))
	_, err = w.Write([]byte("after"))
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(r, buf, 5)
	require.NoError(t, err)
	require.Equal(t, "after", string(buf[:n]))
}

// Reads that come fast turn busy mode on, slow ones do not; a Unix socket
// is not wrapped.
func TestLowatConnTurnsBusyOnFastReads(t *testing.T) {
	t.Parallel()
	r, _ := tcpPair(t)
	start := time.Now()
	for i := range 4 * burstReads {
		r.note(start.Add(time.Duration(i) * burstWindow / burstReads))
		require.False(t, r.busy, "reads %v apart", burstWindow/burstReads)
	}
	start = start.Add(time.Hour)
	for i := range burstReads {
		r.note(start.Add(time.Duration(i) * burstWindow / (2 * burstReads)))
		require.False(t, r.busy, "busy after %d fast reads", i+1)
	}
	r.note(start.Add(burstWindow / 2))
	require.True(t, r.busy, "reads %v apart turn busy mode on", burstWindow/(2*burstReads))

	dir := t.TempDir()
	ul, err := net.Listen("unix", dir+"/s")
	require.NoError(t, err)
	defer ul.Close()
	uc, err := net.Dial("unix", dir+"/s")
	require.NoError(t, err)
	defer uc.Close()
	require.Equal(t, uc, newLowatConn(uc))
}
