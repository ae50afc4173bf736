// Package textsink implements the sinks that write messages as JSON lines: to
// standard output (stdout:) and appended to a file (file:///path.jsonl).
//
// Each message becomes one line:
//
//	{"id":123,"topic":"orders","key":"k1","headers":{"a":"b"},"payload":{...}}
//
// The payload is embedded as JSON when it is valid UTF-8 JSON, so that tools
// like jq can read it directly; anything else is base64 and marked with
// "payload_encoding":"base64", so that no byte is lost or altered.
package textsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/envelope"
)

// maxKeptBuffer bounds the encode buffer a sink keeps between batches, so one
// huge batch does not pin its memory for the life of the relay.
const maxKeptBuffer = 4 << 20

type sink struct {
	mu     sync.Mutex
	w      io.Writer
	sync   func() error
	close  func() error
	name   string // names the destination in errors
	closed bool
	// torn is set when a failed write may have left a partial line behind;
	// the next batch then starts with a newline so its first line parses.
	torn bool
	enc  envelope.Encoder
	buf  []byte
}

// NewWriter returns a sink writing JSON lines to w. It acknowledges a batch
// only after one Write of the whole batch returned without error and, when
// sync != nil, after sync() returned nil: a sink must not acknowledge what the
// destination has not durably accepted, and only the caller knows what makes w
// durable. Close does not close w, because the caller owns it.
func NewWriter(w io.Writer, sync func() error) wharf.Sink {
	return &sink{w: w, sync: sync, name: "writer"}
}

// OpenFile opens path with O_WRONLY|O_CREATE|O_APPEND (mode 0644), never
// truncating, because the file is a log that earlier runs and other relay
// processes also append to. Each Publish writes the whole batch with one write
// call, so appends of several processes do not interleave within a line on a
// local file system, and fsyncs before acknowledging. Close closes the file.
func OpenFile(path string) (wharf.Sink, error) {
	if path == "" {
		return nil, errors.New("textsink: file sink path is empty")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		cause := err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			cause = pe.Err // the path is in our message already
		}
		dir := filepath.Dir(path)
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
				return nil, &hintError{fmt.Sprintf("textsink: cannot open %q: directory %q does not exist: create it or choose another path", path, dir), cause}
			}
		}
		return nil, fmt.Errorf("textsink: cannot open %q for appending: %w", path, cause)
	}
	// fsync of the file alone does not make a newly created directory entry
	// durable; without this a crash could lose a file whose lines were acked.
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, fmt.Errorf("textsink: cannot fsync directory of %q: %w", path, err)
	}
	return &sink{w: f, sync: f.Sync, close: f.Close, name: path}, nil
}

// hintError says what to do instead of repeating what the system said, and
// still matches the system's error with errors.Is.
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// Stdout returns a sink writing to os.Stdout. It acknowledges once the write
// returned: a pipe or terminal offers nothing more durable to wait for. Its
// Close does nothing, because the process owns standard output.
func Stdout() wharf.Sink {
	return &sink{w: os.Stdout, name: "stdout"}
}

func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil // directories cannot be opened for FlushFileBuffers there
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	err = d.Sync()
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, syscall.EINVAL) {
		return nil // the file system has no directory fsync; nothing to wait for
	}
	return err
}

func (s *sink) Publish(ctx context.Context, msgs []*wharf.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Waiting for the lock may have outlasted the context.
	if err := ctx.Err(); err != nil {
		return wharf.FailAll(len(msgs), err)
	}
	if s.closed {
		return wharf.FailAll(len(msgs), &fs.PathError{Op: "write", Path: s.name, Err: fs.ErrClosed})
	}

	buf := s.buf[:0]
	if s.torn {
		buf = append(buf, '\n')
	}
	for _, m := range msgs {
		buf = s.enc.AppendMessage(buf, m, envelope.Extra{})
		buf = append(buf, '\n')
	}
	// Encoding took time, and the process may have been paused during it:
	// the relay's context says at this call whether the lease still holds.
	if err := ctx.Err(); err != nil {
		s.buf = buf[:0]
		return wharf.FailAll(len(msgs), err)
	}
	n, err := s.w.Write(buf)
	if err == nil && n != len(buf) {
		err = io.ErrShortWrite // a broken io.Writer; never ack a partial batch
	}
	n = max(0, min(n, len(buf)))
	if err != nil {
		if n > 0 {
			s.torn = buf[n-1] != '\n'
		}
	} else {
		s.torn = false
	}
	if cap(buf) <= maxKeptBuffer {
		s.buf = buf[:0]
	} else {
		s.buf = nil
	}
	if err != nil {
		return wharf.FailAll(len(msgs), s.wrap("write", err))
	}
	if s.sync != nil {
		if err := s.sync(); err != nil {
			return wharf.FailAll(len(msgs), s.wrap("fsync", err))
		}
	}
	return nil
}

// wrap names the sink's destination in err, replacing the *fs.PathError an
// *os.File returns so the path is not printed twice.
func (s *sink) wrap(op string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &fs.PathError{Op: op, Path: s.name, Err: err}
}

func (s *sink) Close() error {
	if s.close == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.close(); err != nil {
		return s.wrap("close", err)
	}
	return nil
}
