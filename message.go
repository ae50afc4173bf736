package wharf

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Message is one outbox message.
type Message struct {
	// ID is the message's id, unique beyond its database: the same on every
	// redelivery and different for every other message of every outbox, so
	// it is what sinks send as the destination's deduplication id (Kafka
	// header, Nats-Msg-Id, AMQP message-id, webhook-id). Assigned at enqueue;
	// ignored on enqueue. Its format is described at [FormatID].
	ID string
	// Seq is the message's position in its outbox: increasing in enqueue
	// order, unique in one outbox only. Per-key order is Seq order. Assigned
	// at enqueue; ignored on enqueue.
	Seq int64
	// Topic routes the message to a sink and names the destination. Required.
	Topic string
	// Key is, with Topic, the ordering scope: messages with the same topic and
	// key are delivered in Seq order. The empty string means no key and no
	// ordering promise.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are passed to the sink with the message.
	Headers map[string]string
	// DeliverAt, when non-zero, is the earliest time the message is delivered.
	DeliverAt time.Time
	// DedupKey, when non-empty, makes a second enqueue with the same key a no-op
	// while the first message is still in the outbox.
	DedupKey string
	// CreatedAt is the enqueue time (set by the database; ignored on enqueue).
	CreatedAt time.Time
	// Attempt is 1 on the first delivery and grows with each retry (set by the
	// relay; ignored on enqueue).
	Attempt int

	// orderKey is the ordering scope the relay assigned (see OrderingKey).
	orderKey string
}

// OrderingKey returns the scope within which the relay keeps this message's
// order: "" for an unkeyed message, otherwise a value shared by exactly the
// messages that must stay in order with it — the same topic and key by
// default, the same key with [Config.OrderAcrossTopics]. Sinks group and hold
// messages by it (see [Results]); it is not meant to be sent anywhere.
func (m *Message) OrderingKey() string {
	if m.Key == "" {
		return ""
	}
	if m.orderKey != "" {
		return m.orderKey
	}
	return orderingKey(m.Topic, m.Key, false)
}

func orderingKey(topic, key string, acrossTopics bool) string {
	if key == "" {
		return ""
	}
	if acrossTopics {
		return "\x00" + key
	}
	return topic + "\x00" + key
}

// nonceBits is how many bits of a message id are random.
const nonceBits = 62

// FormatID returns the message id of the message at position seq of its
// outbox with the given nonce (a random value the database draws for every
// message at enqueue). The id is a UUID in the RFC 9562 version 8 layout:
//
//	bits   0-47  seq >> 12
//	bits  48-51  version (8)
//	bits  52-63  seq & 0xfff
//	bits  64-65  variant (0b10)
//	bits 66-127  the low 62 bits of nonce
//
// so ids of one outbox sort (as text, too) in Seq order, and two messages share
// an id only if they share both the position and 62 random bits: never in
// practice, across databases, schemas, re-migrations, restores and failovers.
// The database function <schema>.message_id(seq, nonce) computes the same.
func FormatID(seq, nonce int64) string {
	var u [16]byte
	hi := uint64(seq>>12)<<16 | 0x8000 | uint64(seq)&0xfff
	lo := uint64(nonce)&(1<<nonceBits-1) | 1<<63
	for i := 0; i < 8; i++ {
		u[i] = byte(hi >> (56 - 8*i))
		u[8+i] = byte(lo >> (56 - 8*i))
	}
	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], u[10:16])
	return string(out[:])
}

// ErrBadID is returned by [ParseID] for text that is not a Wharf message id.
var ErrBadID = errors.New("wharf: not a message id (want a UUID such as 00000000-0001-8002-a3f1-9c2e4d5b6a70)")

// ParseID returns the position in its outbox and the nonce of a message id
// made by [FormatID].
func ParseID(id string) (seq, nonce int64, err error) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	var u [16]byte
	src := []byte(id[0:8] + id[9:13] + id[14:18] + id[19:23] + id[24:36])
	if _, err := hex.Decode(u[:], src); err != nil {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	var hi, lo uint64
	for i := 0; i < 8; i++ {
		hi = hi<<8 | uint64(u[i])
		lo = lo<<8 | uint64(u[8+i])
	}
	if hi>>12&0xf != 8 || lo>>62 != 2 {
		return 0, 0, fmt.Errorf("%w: %q is not version 8 with the RFC 9562 variant", ErrBadID, id)
	}
	seq = int64(hi>>16)<<12 | int64(hi&0xfff)
	nonce = int64(lo & (1<<nonceBits - 1))
	return seq, nonce, nil
}
