package walstream

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func join(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// xlogData wraps a pgoutput message as the walsender does.
func xlogData(msg []byte) []byte {
	return join([]byte{'w'}, u64(0x10), u64(0x20), u64(0), msg)
}

var when = time.Date(2026, 11, 25, 7, 0, 0, 123456000, time.UTC)

func TestParseCopyData(t *testing.T) {
	micros := uint64(pgMicros(when))
	begin := join([]byte{'B'}, u64(0x1_0000_0100), u64(micros), u32(777))
	ev, walEnd, reply, err := parseCopyData(xlogData(begin), "")
	require.NoError(t, err)
	require.Equal(t, Begin{FinalLSN: 0x1_0000_0100, CommitTime: when, XID: 777}, ev)
	require.Equal(t, LSN(0x20), walEnd)
	require.False(t, reply)

	msg := join([]byte{'M', 1}, u64(0xAB), []byte("wharf\x00"), u32(3), []byte{0, 1, 2})
	ev, _, _, err = parseCopyData(xlogData(msg), "wharf")
	require.NoError(t, err)
	require.Equal(t, Message{LSN: 0xAB, Transactional: true, Prefix: "wharf", Content: []byte{0, 1, 2}}, ev)
	_, _, _, err = parseCopyData(xlogData(msg), "other")
	require.ErrorIs(t, err, errSkip, "another prefix is dropped")

	commit := join([]byte{'C', 0}, u64(0x100), u64(0x128), u64(micros))
	ev, _, _, err = parseCopyData(xlogData(commit), "")
	require.NoError(t, err)
	require.Equal(t, Commit{CommitLSN: 0x100, EndLSN: 0x128, CommitTime: when}, ev)

	ka := join([]byte{'k'}, u64(0x999), u64(micros), []byte{1})
	ev, walEnd, reply, err = parseCopyData(ka, "")
	require.NoError(t, err)
	require.Equal(t, Keepalive{WALEnd: 0x999}, ev)
	require.Equal(t, LSN(0x999), walEnd)
	require.True(t, reply)

	for _, typ := range "RYIUDTO" {
		_, _, _, err = parseCopyData(xlogData([]byte{byte(typ), 0, 0}), "")
		require.ErrorIs(t, err, errSkip, string(typ))
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":               nil,
		"unknown":             {'x'},
		"short xlogdata":      {'w', 0, 0},
		"short keepalive":     {'k', 0},
		"empty pgoutput":      xlogData(nil),
		"streamed":            xlogData([]byte{'S', 0, 0, 0, 0, 1}),
		"short begin":         xlogData([]byte{'B', 0}),
		"short commit":        xlogData([]byte{'C', 0}),
		"short message":       xlogData([]byte{'M', 1}),
		"unterminated prefix": xlogData(join([]byte{'M', 1}, u64(1), []byte("wharfwharf"))),
		"no length":           xlogData(join([]byte{'M', 1}, u64(1), []byte("wharf\x00x"))),
		"length past end":     xlogData(join([]byte{'M', 1}, u64(1), []byte("w\x00"), u32(9), []byte{1})),
		"bytes past length":   xlogData(join([]byte{'M', 1}, u64(1), []byte("w\x00"), u32(0), []byte{1})),
	} {
		_, _, _, err := parseCopyData(b, "")
		require.Error(t, err, name)
		require.NotErrorIs(t, err, errSkip, name)
		require.Contains(t, err.Error(), "walstream: ", name)
	}
}

func TestStatusUpdate(t *testing.T) {
	b := appendStatus(nil, 0x30, 0x20, when)
	require.Len(t, b, 34)
	require.Equal(t, byte('r'), b[0])
	require.Equal(t, uint64(0x30), binary.BigEndian.Uint64(b[1:]))
	require.Equal(t, uint64(0x20), binary.BigEndian.Uint64(b[9:]))
	require.Equal(t, uint64(0x20), binary.BigEndian.Uint64(b[17:]))
	require.Equal(t, when, pgTime(int64(binary.BigEndian.Uint64(b[25:]))))
	require.Zero(t, b[33])
}

func TestLSN(t *testing.T) {
	l, err := ParseLSN("16/B374D848")
	require.NoError(t, err)
	require.Equal(t, LSN(0x16_B374D848), l)
	require.Equal(t, "16/B374D848", l.String())
	require.Equal(t, "0/0", LSN(0).String())
	for _, bad := range []string{"", "16", "/1", "1/", "x/1", "1/123456789"} {
		_, err := ParseLSN(bad)
		require.Error(t, err, bad)
	}
}

func FuzzParseCopyData(f *testing.F) {
	f.Add(xlogData(join([]byte{'B'}, u64(1), u64(2), u32(3))))
	f.Add(xlogData(join([]byte{'M', 1}, u64(0xAB), []byte("wharf\x00"), u32(3), []byte{0, 1, 2})))
	f.Add(xlogData(join([]byte{'C', 0}, u64(1), u64(2), u64(3))))
	f.Add(join([]byte{'k'}, u64(1), u64(2), []byte{1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, _, _, err := parseCopyData(b, "wharf")
		if err == nil && ev == nil {
			t.Fatal("no event and no error")
		}
		if m, ok := ev.(Message); ok && len(m.Content) > 0 && len(b) > 0 {
			// The content is a copy: the receive buffer is reused.
			m.Content[0] ^= 0xFF
			ev2, _, _, _ := parseCopyData(b, "wharf")
			if ev2.(Message).Content[0] == m.Content[0] {
				t.Fatal("content shares the input's memory")
			}
		}
	})
}
