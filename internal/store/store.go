// Package store is the seam between the relay's engine and a storage layout:
// the Store interface and the values that cross it. The table outbox
// (internal/tablestore) and the WAL outbox (internal/walstore) implement it;
// the engine (the root package's relay) reaches the database only through it.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// Store is the storage layout behind the relay. The engine and its lease loop
// reach the database only through it, so another layout replaces it without
// touching them. The read position is opaque to the engine: the Store hands
// it out with each fetch and gets it back with the next one.
type Store interface {
	// Register claims the relay id for this incarnation, or fails with
	// ErrRelayIDInUse while another live incarnation holds it.
	Register(ctx context.Context, ttl time.Duration) error
	// LeaseRound heartbeats, which renews this relay's lease (one for all
	// its lanes), reads the lanes it owns and counts live relays and lanes
	// nobody live owns, in one round trip.
	LeaseRound(ctx context.Context, ttl time.Duration) (LeaseRound, error)
	Claim(ctx context.Context, n int) ([]LaneLease, error)
	// ClaimAlone takes every lane no live relay holds, unless a live relay
	// other than this one holds a lane: then it takes none. Concurrent
	// calls by two relays leave all the lanes with one of them.
	ClaimAlone(ctx context.Context) ([]LaneLease, error)
	Release(ctx context.Context, rel LaneRelease) error
	ReleaseAll(ctx context.Context, lanes []int16) error
	Unregister(ctx context.Context) error
	// LoadRetries returns the attempts of failing messages of the lanes, by
	// seq, each with the nonce of the message it belongs to.
	LoadRetries(ctx context.Context, lanes []int16) (map[int16]map[int64]RetryInfo, error)

	Fetch(ctx context.Context, req FetchRequest) FetchResult
	WriteResults(ctx context.Context, ops []Op) OpsResult
	// Listen calls wake whenever new messages may be there, until ctx ends.
	Listen(ctx context.Context, wake func())
}

// ErrRelayIDInUse is returned by Start and Drain when another relay that is
// still alive runs with the same Config.RelayID: two relays sharing an id
// would share lanes and deliver one key twice at once.
var ErrRelayIDInUse = errors.New("wharf: relay id in use by a live relay")

// LeaseRound is what one lease round trip learned.
type LeaseRound struct {
	Live      int             // live relays, this one included
	Renewed   map[int16]int64 // lanes this relay owns, with their fence, their lease renewed
	Uncovered int             // lanes no live relay owns
	LostID    bool            // another incarnation took over this relay id
}

// LaneLease is a lane this relay claimed: its fence, and the attempts of
// its failing messages.
type LaneLease struct {
	Lane    int16
	Fence   int64
	Retries map[int64]RetryInfo
}

// LaneRelease hands a lane back, fenced.
type LaneRelease struct {
	Lane  int16
	Fence int64
}

// RetryInfo is a failing message's attempts so far and when it is due again.
// It belongs to one message, the one with its seq and nonce: a database put
// back in time hands out the same seqs again, and a failure of the old
// history's message, written late, must not count for the new message that
// took its seq.
type RetryInfo struct {
	Attempts int
	Next     time.Time // database clock
	Nonce    int64
	// AnyNonce marks a record written before schema version 9 recorded
	// nonces: it belongs to whichever message has its seq, as it did then.
	AnyNonce bool
}

// Of reports whether the record is the message's with this nonce (at its seq).
func (ri RetryInfo) Of(nonce int64) bool { return ri.AnyNonce || ri.Nonce == nonce }

// Pos is the store's read position: what the next fetch needs to read
// exactly what the previous ones did not (for the table store, the previous snapshot).
type Pos any

// FetchRequest is one read: per lane the cursor (the highest position read),
// the rows and payload bytes wanted and the fence; the loads and refills of
// held keys; the position the previous read returned.
type FetchRequest struct {
	Lanes   []int16
	Cursors []int64
	Limits  []int32
	Bytes   []int64 // per lane: most payload bytes past the first row
	Fences  []int64
	Pos     Pos
	Loads   []LoadReq
	Refills []RefillReq
	// RefillLimit bounds each refill's rows.
	RefillLimit int
}

// LoadReq reads messages again by position (messages the engine keeps only as
// positions while they are held).
type LoadReq struct {
	Lane  int16
	Fence int64
	Key   string // the ordering key, "" for unkeyed
	Seqs  []int64
}

// RefillReq reads again the rows of a truncated key: seq in [from, to].
type RefillReq struct {
	Lane   int16
	Fence  int64
	Key    string // the ordering key
	MsgKey string // the message key, as stored
	Topic  string // the topic, when the ordering scope includes it
	From   int64
	To     int64
}

// Row is a message as a store hands it to the engine.
type Row struct {
	Seq       int64
	Nonce     int64 // the id's random part (the engine formats the id)
	Topic     string
	Key       string
	Payload   []byte
	Headers   map[string]string
	DeliverAt time.Time
	CreatedAt time.Time
	Lane      int16
	// At is where the row was read in the table (its ctid), so that its
	// removal needs no index probe; not valid for rows of the WAL stream.
	At pgtype.TID
}

// FetchResult answers a FetchRequest: new rows, the loads' and refills'
// rows, the position for the next read and the database clock.
type FetchResult struct {
	Req        FetchRequest
	Started    time.Time
	Finished   time.Time
	Rows       []Row
	LoadRows   []Row
	RefillRows []Row
	Pos        Pos
	DBNow      time.Time
	// Rewound is set when the database's position went backwards since the
	// previous fetch (a failover to a standby that lost commits, a
	// point-in-time restore): the engine must read every lane again.
	Rewound bool
	// More is set when the store may hand out rows to the next fetch
	// without anything new being committed (a WAL stream still catching
	// up with the WAL end it started at): an empty fetch then does not
	// mean the outbox is empty.
	More bool
	Err  error
}

// FenceOf is the fence the request carried for lane, or -1.
func (f *FetchResult) FenceOf(lane int16) int64 {
	for i, l := range f.Req.Lanes {
		if l == lane {
			return f.Req.Fences[i]
		}
	}
	return -1
}

// OpKind is what a result write does to a message.
type OpKind uint8

const (
	OpAck OpKind = iota
	OpRetry
	OpDead
)

// Op is one message's result: acknowledged (removed), to retry at NextAt,
// or dead (moved to the dead letters); written fenced by the lane.
type Op struct {
	Kind OpKind
	// Ref is the engine's own handle on the message, handed back unchanged
	// in OpsResult.Ops; stores do not look at it.
	Ref any
	// At is where an acknowledged row was read (Row.At).
	At    pgtype.TID
	Lane  int16
	Fence int64
	Seq   int64
	// Nonce is the id's random part. An acknowledgement or a dead-letter
	// move touches a row only if its seq and nonce both match: a database
	// put back in time hands out the same seqs again, and a result of the
	// old history (written late, after a retry) must never settle a new
	// message that took its seq.
	Nonce    int64
	Attempts int
	NextAt   time.Time // database clock
	Err      string
}

// OpsResult answers a write of Ops: the lanes whose fence still held (their
// results are written), or the error that wrote nothing.
type OpsResult struct {
	Ops   []Op
	Valid map[int16]bool
	Err   error
	// Isolated is set when the batch failed for a reason other than the
	// connection and was written again in parts (tablestore.WriteIsolated).
	Isolated bool
}

// Wrap names what failed; an undefined table or column says the schema is
// not migrated (wharfmigrate.ErrNotMigrated).
func Wrap(what string, err error) error {
	if IsUndefined(err) {
		return fmt.Errorf("wharf: %s: %w: %w", what, wharfmigrate.ErrNotMigrated, err)
	}
	return fmt.Errorf("wharf: %s: %w", what, err)
}

// ExpectedRows is how many forward rows the fetch can return at most (late
// commits come on top).
func (req FetchRequest) ExpectedRows() int {
	n := 0
	for _, l := range req.Limits {
		n += int(l)
	}
	return n
}

// IsUndefined reports whether err is PostgreSQL's answer to a statement that
// names a table or column the schema does not have (not migrated, or an
// older schema version): undefined_table, invalid_schema_name or
// undefined_column.
func IsUndefined(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000" || pgErr.Code == "42703")
}
