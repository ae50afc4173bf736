package walstream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Event is what Receive returns: a Begin, a Message, a Commit or a Keepalive.
type Event interface{ event() }

// Begin opens a committed transaction: its messages follow, then its Commit.
type Begin struct {
	// FinalLSN is the position of the transaction's commit record.
	FinalLSN   LSN
	CommitTime time.Time
	XID        uint32
}

// Message is a logical decoding message (pg_logical_emit_message).
// Transactional messages arrive between their transaction's Begin and
// Commit; others arrive on their own, as soon as they were written, whether
// or not the transaction that wrote them commits.
type Message struct {
	LSN           LSN
	Transactional bool
	Prefix        string
	// Content is the receiver's own copy.
	Content []byte
}

// Commit closes the transaction its Begin opened.
type Commit struct {
	// CommitLSN is the commit record's position, EndLSN the position just
	// past it: confirming EndLSN tells the server that this transaction and
	// everything before it is settled, so the slot will not send them again.
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
}

// Keepalive is the server's word that the WAL up to WALEnd holds nothing
// more for this slot than what was already sent. A receiver that has
// settled everything it received, and is not inside a transaction, may
// confirm WALEnd so that the server can recycle the WAL the slot no longer
// needs (which other databases' and tables' writes keep producing).
type Keepalive struct {
	WALEnd LSN
}

func (Begin) event()     {}
func (Message) event()   {}
func (Commit) event()    {}
func (Keepalive) event() {}

// pgEpoch is PostgreSQL's timestamp epoch.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(micros int64) time.Time { return pgEpoch.Add(time.Duration(micros) * time.Microsecond) }

func pgMicros(t time.Time) int64 { return t.Sub(pgEpoch).Microseconds() }

// errSkip marks a pgoutput message the stream does not hand on: the row
// changes and relation descriptions of a publication that has tables, and
// replication origins.
var errSkip = errors.New("skip")

// parsePgoutput decodes one pgoutput message (protocol version 1). A Message
// whose prefix is not prefix (when prefix is not empty) is skipped without
// copying its content.
func parsePgoutput(b []byte, prefix string) (Event, error) {
	if len(b) == 0 {
		return nil, errors.New("walstream: empty pgoutput message")
	}
	typ, body := b[0], b[1:]
	switch typ {
	case 'B':
		if len(body) != 20 {
			return nil, fmt.Errorf("walstream: pgoutput Begin of %d bytes, want 20", len(body))
		}
		return Begin{
			FinalLSN:   LSN(binary.BigEndian.Uint64(body)),
			CommitTime: pgTime(int64(binary.BigEndian.Uint64(body[8:]))),
			XID:        binary.BigEndian.Uint32(body[16:]),
		}, nil
	case 'C':
		if len(body) != 25 {
			return nil, fmt.Errorf("walstream: pgoutput Commit of %d bytes, want 25", len(body))
		}
		return Commit{
			CommitLSN:  LSN(binary.BigEndian.Uint64(body[1:])),
			EndLSN:     LSN(binary.BigEndian.Uint64(body[9:])),
			CommitTime: pgTime(int64(binary.BigEndian.Uint64(body[17:]))),
		}, nil
	case 'M':
		// flags (1 = transactional), LSN, prefix (NUL-terminated), content
		// length, content.
		if len(body) < 1+8+1+4 {
			return nil, fmt.Errorf("walstream: pgoutput Message of %d bytes is too short", len(body))
		}
		flags, lsn := body[0], LSN(binary.BigEndian.Uint64(body[1:]))
		rest := body[9:]
		end := bytes.IndexByte(rest, 0)
		if end < 0 {
			return nil, errors.New("walstream: pgoutput Message prefix is not terminated")
		}
		p, rest := rest[:end], rest[end+1:]
		if len(rest) < 4 {
			return nil, errors.New("walstream: pgoutput Message has no content length")
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) != uint64(len(rest)) {
			return nil, fmt.Errorf("walstream: pgoutput Message content of %d bytes, its length says %d", len(rest), n)
		}
		if prefix != "" && string(p) != prefix {
			return nil, errSkip
		}
		if prefix == "" {
			prefix = string(p)
		} // else it is p: no copy of it per message
		return Message{LSN: lsn, Transactional: flags&1 != 0, Prefix: prefix, Content: bytes.Clone(rest)}, nil
	case 'R', 'Y', 'I', 'U', 'D', 'T', 'O':
		return nil, errSkip
	default:
		// Streamed in-progress transactions and two-phase commits are not
		// asked for (protocol version 1, no streaming, no two_phase).
		return nil, fmt.Errorf("walstream: unexpected pgoutput message type %q", typ)
	}
}

// parseCopyData decodes one CopyData payload of the replication stream:
// XLogData ('w') holding a pgoutput message, or a primary keepalive ('k').
// walEnd is the server's WAL end the message reports; reply is a keepalive's
// request for an immediate status update.
func parseCopyData(b []byte, prefix string) (ev Event, walEnd LSN, reply bool, err error) {
	if len(b) == 0 {
		return nil, 0, false, errors.New("walstream: empty replication message")
	}
	switch b[0] {
	case 'w':
		if len(b) < 25 {
			return nil, 0, false, fmt.Errorf("walstream: XLogData of %d bytes is too short", len(b))
		}
		walEnd = LSN(binary.BigEndian.Uint64(b[9:]))
		ev, err = parsePgoutput(b[25:], prefix)
		return ev, walEnd, false, err
	case 'k':
		if len(b) != 18 {
			return nil, 0, false, fmt.Errorf("walstream: keepalive of %d bytes, want 18", len(b))
		}
		walEnd = LSN(binary.BigEndian.Uint64(b[1:]))
		return Keepalive{WALEnd: walEnd}, walEnd, b[17] != 0, nil
	default:
		return nil, 0, false, fmt.Errorf("walstream: unexpected replication message type %q", b[0])
	}
}

// appendStatus encodes a standby status update: written, flushed and applied
// positions, the client's clock, and whether the server should reply.
func appendStatus(dst []byte, written, flushed LSN, now time.Time) []byte {
	dst = append(dst, 'r')
	dst = binary.BigEndian.AppendUint64(dst, uint64(written))
	dst = binary.BigEndian.AppendUint64(dst, uint64(flushed))
	dst = binary.BigEndian.AppendUint64(dst, uint64(flushed))
	dst = binary.BigEndian.AppendUint64(dst, uint64(pgMicros(now)))
	return append(dst, 0)
}
