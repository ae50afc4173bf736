// Package walmsg is the format of outbox messages written to the WAL as a
// transactional logical decoding message (pg_logical_emit_message), for the
// outbox's WAL mode: what producers write and the relay decodes.
//
// One logical message carries the messages of one enqueue call, so the WAL
// record's own overhead (its header, the logical message header and the
// prefix, about 55 bytes) is paid once per call, not once per message. The
// prefix names the outbox (its schema). The content is big-endian, as
// PostgreSQL's int2send, int4send, int8send and timestamptz_send write
// integers, so that SQL can build it as well as Go:
//
//	content: version (1 byte, 1), message count (4 bytes), the messages
//	message: length of the rest (4), then:
//	  flags      1     1 = deliver_at follows the key, 2 = headers follow
//	  seq        8     the message's position in its outbox (its id sequence)
//	  nonce      8     the random part of the message id
//	  topic      2+n   length, UTF-8 bytes
//	  key        2+n   length, UTF-8 bytes (length 0: no key)
//	  deliver_at 8     (flag 1) microseconds since 2000-01-01 UTC
//	  headers    2+…   (flag 2) count, then per header a 2-byte name length,
//	                   the name, a 4-byte value length and the value, names
//	                   in byte order
//	  payload    rest  of the message's length
package walmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Version is the content format version this package writes and reads.
const Version = 1

const (
	flagDeliverAt = 1 << 0
	flagHeaders   = 1 << 1
	flagsKnown    = flagDeliverAt | flagHeaders

	fixedLen = 17 // flags, seq, nonce
	maxShort = 1<<16 - 1
)

// pgEpochMicros is PostgreSQL's timestamp epoch, 2000-01-01 UTC, in Unix
// microseconds.
const pgEpochMicros = 946_684_800_000_000

// Record is one outbox message as it travels through the WAL.
type Record struct {
	Seq       int64
	Nonce     int64
	Topic     string
	Key       string
	Headers   map[string]string
	DeliverAt time.Time // zero: no deliver_at
	Payload   []byte
}

// Append encodes records as one content after dst. It fails when a field
// does not fit its length field: a topic, key or header name over 65,535
// bytes, more than 65,535 headers, or a message over 4 GiB.
func Append(dst []byte, records []Record) ([]byte, error) {
	dst = append(dst, Version)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(records)))
	for i := range records {
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		var err error
		if dst, err = appendRecord(dst, &records[i]); err != nil {
			return dst[:at], err
		}
		n := len(dst) - at - 4
		if n > 1<<32-1 {
			return dst[:at], fmt.Errorf("walmsg: a message of %d bytes; at most %d fit", n, uint32(1<<32-1))
		}
		binary.BigEndian.PutUint32(dst[at:], uint32(n))
	}
	return dst, nil
}

func appendRecord(dst []byte, r *Record) ([]byte, error) {
	if len(r.Topic) > maxShort {
		return dst, fmt.Errorf("walmsg: topic is %d bytes; at most %d fit", len(r.Topic), maxShort)
	}
	if len(r.Key) > maxShort {
		return dst, fmt.Errorf("walmsg: key is %d bytes; at most %d fit", len(r.Key), maxShort)
	}
	if len(r.Headers) > maxShort {
		return dst, fmt.Errorf("walmsg: %d headers; at most %d fit", len(r.Headers), maxShort)
	}
	var flags byte
	if !r.DeliverAt.IsZero() {
		flags |= flagDeliverAt
	}
	if len(r.Headers) > 0 {
		flags |= flagHeaders
	}
	dst = append(dst, flags)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Seq))
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Nonce))
	dst = appendShort(dst, r.Topic)
	dst = appendShort(dst, r.Key)
	if flags&flagDeliverAt != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(r.DeliverAt.UnixMicro()-pgEpochMicros))
	}
	if flags&flagHeaders != 0 {
		names := make([]string, 0, len(r.Headers))
		for k := range r.Headers {
			if len(k) > maxShort {
				return dst, fmt.Errorf("walmsg: header name is %d bytes; at most %d fit", len(k), maxShort)
			}
			names = append(names, k)
		}
		slices.Sort(names)
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(names)))
		for _, k := range names {
			dst = appendShort(dst, k)
			v := r.Headers[k]
			dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
			dst = append(dst, v...)
		}
	}
	return append(dst, r.Payload...), nil
}

func appendShort(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// ContentSQL is a SQL expression that builds, for one message, the same
// content as Append from $1 seq bigint, $2 nonce bigint, $3 topic text, $4
// key text (NULL or the empty string for none), $5 deliver_at timestamptz (NULL for none),
// $6 headers jsonb (an object of strings, NULL or {} for none) and $7
// payload bytea: what the SQL enqueue function of an outbox in WAL mode
// passes to pg_logical_emit_message.
const ContentSQL = `(SELECT '\x0100000001'::bytea || int4send(octet_length(m.r)) || m.r FROM (SELECT
    set_byte('\x00'::bytea, 0, (CASE WHEN $5::timestamptz IS NULL THEN 0 ELSE 1 END)
        | (CASE WHEN coalesce($6::jsonb, '{}') = '{}' THEN 0 ELSE 2 END))
    || int8send($1::bigint) || int8send($2::bigint)
    || substring(int4send(octet_length($3::text)) FROM 3) || convert_to($3::text, 'UTF8')
    || substring(int4send(octet_length(coalesce($4::text, ''))) FROM 3) || convert_to(coalesce($4::text, ''), 'UTF8')
    || coalesce(timestamptz_send($5::timestamptz), '')
    || CASE WHEN coalesce($6::jsonb, '{}') = '{}' THEN ''::bytea ELSE
        (SELECT substring(int4send(count(*)::int) FROM 3)
            || string_agg(substring(int4send(octet_length(h.key)) FROM 3) || convert_to(h.key, 'UTF8')
                || int4send(octet_length(convert_to(h.value, 'UTF8'))) || convert_to(h.value, 'UTF8'), ''::bytea ORDER BY h.key COLLATE "C")
         FROM jsonb_each_text($6::jsonb) AS h) END
    || $7::bytea AS r) AS m)`

// FirstSeq is the seq of the first of the n messages of a content whose
// logical decoding message ends at WAL position end (what
// pg_logical_emit_message returns, and what the stream reports for the
// message); the others follow one by one. Every message takes more than one
// byte of the record, so the n seqs end-n .. end-1 lie inside the record:
// unique in the cluster's WAL and growing in WAL order. end+i would not do:
// a short record right after a long one ends fewer than n bytes later.
func FirstSeq(end uint64, n int) int64 { return int64(end) - int64(n) }

// ErrVersion is returned for content written by a newer format.
var ErrVersion = errors.New("walmsg: unknown content version")

// Decode parses content. The payloads share content's memory.
func Decode(content []byte) ([]Record, error) {
	if len(content) < 5 {
		return nil, fmt.Errorf("walmsg: content is %d bytes; its header alone is 5", len(content))
	}
	if content[0] != Version {
		return nil, fmt.Errorf("%w %d (this relay reads version %d): upgrade the relay", ErrVersion, content[0], Version)
	}
	count := binary.BigEndian.Uint32(content[1:])
	d := decoder{b: content[5:]}
	// Every message takes at least 4+fixedLen+4 bytes: a count the content
	// cannot hold is refused before anything is allocated for it.
	if uint64(count)*(4+fixedLen+4) > uint64(len(d.b)) {
		return nil, fmt.Errorf("walmsg: content claims %d messages in %d bytes", count, len(d.b))
	}
	out := make([]Record, 0, count)
	for i := range int(count) {
		n := d.uint32("message length")
		b := d.bytes(int(n), "message")
		if d.err != nil {
			return nil, fmt.Errorf("%w (message %d of %d)", d.err, i+1, count)
		}
		r, err := decodeRecord(b)
		if err != nil {
			return nil, fmt.Errorf("%w (message %d of %d)", err, i+1, count)
		}
		out = append(out, r)
	}
	if len(d.b) > 0 {
		return nil, fmt.Errorf("walmsg: %d bytes after the last of %d messages", len(d.b), count)
	}
	return out, nil
}

func decodeRecord(b []byte) (Record, error) {
	var r Record
	if len(b) < fixedLen {
		return r, fmt.Errorf("walmsg: message is %d bytes; its fixed part alone is %d", len(b), fixedLen)
	}
	flags := b[0]
	if flags&^flagsKnown != 0 {
		return r, fmt.Errorf("walmsg: unknown flags %#x", flags&^flagsKnown)
	}
	r.Seq = int64(binary.BigEndian.Uint64(b[1:]))
	r.Nonce = int64(binary.BigEndian.Uint64(b[9:]))
	d := decoder{b: b[fixedLen:]}
	r.Topic = d.short("topic")
	r.Key = d.short("key")
	if flags&flagDeliverAt != 0 {
		r.DeliverAt = time.UnixMicro(int64(d.uint64("deliver_at")) + pgEpochMicros).UTC()
	}
	if flags&flagHeaders != 0 {
		n := int(d.uint16("header count"))
		r.Headers = make(map[string]string, min(n, 64))
		for i := 0; i < n && d.err == nil; i++ {
			k := d.short("header name")
			vl := d.uint32("header value length")
			r.Headers[k] = string(d.bytes(int(vl), "header value"))
		}
	}
	if d.err != nil {
		return Record{}, d.err
	}
	r.Payload = d.b
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n int, what string) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || len(d.b) < n {
		d.err = fmt.Errorf("walmsg: content truncated in the %s: %d bytes needed, %d left", what, n, len(d.b))
		return false
	}
	return true
}

func (d *decoder) bytes(n int, what string) []byte {
	if !d.need(n, what) {
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) uint16(what string) uint16 {
	b := d.bytes(2, what)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

func (d *decoder) uint32(what string) uint32 {
	b := d.bytes(4, what)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func (d *decoder) uint64(what string) uint64 {
	b := d.bytes(8, what)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func (d *decoder) short(what string) string {
	if d.err != nil || len(d.b) < 2 {
		d.need(2, what+" length") // the error names the field; only built when there is one
		return ""
	}
	n := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return string(d.bytes(int(n), what))
}
