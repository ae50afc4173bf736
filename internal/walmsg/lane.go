package walmsg

import "math/bits"

// Lanes is how many lanes an outbox has (wharfmigrate.Lanes, which a test of
// that package checks; this package imports nothing of Wharf's, so that
// wharfmigrate can build WAL contents with it).
const Lanes = 64

// Lane returns the lane of a keyed message: PostgreSQL's hashtext(key) & 63,
// as the table outbox's generated lane column computes it, so that a key has
// one lane in both modes (the lanes table, retries, dead letters and status
// keep their meaning). hashtext hashes the key's bytes with hash_bytes for
// the deterministic collations an outbox's key column uses.
func Lane(key string) int16 {
	return int16(hashBytes([]byte(key)) & (Lanes - 1))
}

// hashBytes is PostgreSQL's hash_bytes (src/common/hashfn.c, Bob Jenkins'
// lookup3 with PostgreSQL's initial value). The server reads the key's words
// in its own byte order; this is the little-endian result (amd64, arm64), so
// on a big-endian server hashtext, and the lanes, would differ.
func hashBytes(k []byte) uint32 {
	n := uint32(len(k))
	a := 0x9e3779b9 + n + 3923095
	b, c := a, a
	for len(k) >= 12 {
		a += le32(k[0:4])
		b += le32(k[4:8])
		c += le32(k[8:12])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 11 bytes at most; the lowest byte of c is left out, as in
	// lookup3 (the length went into the initial value).
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	return final(a, b, c)
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}
