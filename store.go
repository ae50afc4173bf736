package wharf

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// store is the storage layout behind the relay. The engine (relay*.go) and the
// lease loop (lease.go) reach the database only through it, so another layout
// (an append-only log, the WAL) replaces it without touching them. The read
// position is opaque to the engine: the store hands it out with each fetch
// and gets it back with the next one. pgStore (the table outbox) is the one
// implementation today.
type store interface {
	// register claims the relay id for this incarnation, or fails with
	// ErrRelayIDInUse while another live incarnation holds it.
	register(ctx context.Context, ttl time.Duration) error
	// leaseRound heartbeats, which renews this relay's lease (one for all
	// its lanes), reads the lanes it owns and counts live relays and lanes
	// nobody live owns, in one round trip.
	leaseRound(ctx context.Context, ttl time.Duration) (leaseRound, error)
	claim(ctx context.Context, n int) ([]laneLease, error)
	// claimAlone takes every lane no live relay holds, unless a live relay
	// other than this one holds a lane: then it takes none. Concurrent
	// calls by two relays leave all the lanes with one of them.
	claimAlone(ctx context.Context) ([]laneLease, error)
	release(ctx context.Context, rel laneRelease) error
	releaseAll(ctx context.Context, lanes []int16) error
	unregister(ctx context.Context) error
	// loadRetries returns the attempts of failing messages of the lanes.
	loadRetries(ctx context.Context, lanes []int16) (map[int16]map[int64]retryInfo, error)

	fetch(ctx context.Context, req fetchRequest) fetchResult
	writeResults(ctx context.Context, ops []op) opsResult
	// listen calls wake whenever new messages may be there, until ctx ends.
	listen(ctx context.Context, wake func())
}

// ErrRelayIDInUse is returned by Start and Drain when another relay that is
// still alive runs with the same Config.RelayID: two relays sharing an id
// would share lanes and deliver one key twice at once.
var ErrRelayIDInUse = errors.New("wharf: relay id in use by a live relay")

type leaseRound struct {
	live      int             // live relays, this one included
	renewed   map[int16]int64 // lanes this relay owns, with their fence, their lease renewed
	uncovered int             // lanes no live relay owns
	lostID    bool            // another incarnation took over this relay id
}

type laneLease struct {
	lane    int16
	fence   int64
	retries map[int64]retryInfo
}

type laneRelease struct {
	lane  int16
	fence int64
}

type retryInfo struct {
	attempts int
	next     time.Time // database clock
}

// readPos is the store's read position: what the next fetch needs to read
// exactly what the previous ones did not (for pgStore, the previous snapshot).
type readPos any

type fetchRequest struct {
	lanes   []int16
	cursors []int64
	limits  []int32
	bytes   []int64 // per lane: most payload bytes past the first row
	fences  []int64
	pos     readPos
	loads   []loadReq
	refills []refillReq
	// refillLimit bounds each refill's rows.
	refillLimit int
}

// loadReq reads messages again by position (messages the engine keeps only as
// positions while they are held).
type loadReq struct {
	lane  int16
	fence int64
	key   string // the ordering key, "" for unkeyed
	seqs  []int64
}

// refillReq reads again the rows of a truncated key: seq in [from, to].
type refillReq struct {
	lane  int16
	fence int64
	key   string // the ordering key
	okey  string // the message key, as stored
	topic string // the topic, when the ordering scope includes it
	from  int64
	to    int64
}

type fetchedRow struct {
	Message
	lane int16
	// at is where the row was read in the table (its ctid), so that its
	// removal needs no index probe; not valid for rows of the WAL stream.
	at pgtype.TID
}

type fetchResult struct {
	req        fetchRequest
	started    time.Time
	finished   time.Time
	rows       []fetchedRow
	loadRows   []fetchedRow
	refillRows []fetchedRow
	pos        readPos
	dbNow      time.Time
	// rewound is set when the database's position went backwards since the
	// previous fetch (a failover to a standby that lost commits, a
	// point-in-time restore): the engine must read every lane again.
	rewound bool
	// more is set when the store may hand out rows to the next fetch
	// without anything new being committed (a WAL stream still catching
	// up with the WAL end it started at): an empty fetch then does not
	// mean the outbox is empty.
	more bool
	err  error
}

func (f *fetchResult) fenceOf(lane int16) int64 {
	for i, l := range f.req.lanes {
		if l == lane {
			return f.req.fences[i]
		}
	}
	return -1
}

type opKind uint8

const (
	opAck opKind = iota
	opRetry
	opDead
)

type op struct {
	kind     opKind
	m        *msg
	lane     int16
	fence    int64
	seq      int64
	attempts int
	nextAt   time.Time // database clock
	err      string
}

type opsResult struct {
	ops   []op
	valid map[int16]bool
	err   error
	// isolated is set when the batch failed for a reason other than the
	// connection and was written again in parts (see pgStore.writeResults).
	isolated bool
}

func storeErr(what string, err error) error {
	if isUndefined(err) {
		return fmt.Errorf("wharf: %s: %w: %w", what, ErrNotMigrated, err)
	}
	return fmt.Errorf("wharf: %s: %w", what, err)
}

// expectedRows is how many forward rows the fetch can return at most (late
// commits come on top).
func (req fetchRequest) expectedRows() int {
	n := 0
	for _, l := range req.limits {
		n += int(l)
	}
	return n
}
