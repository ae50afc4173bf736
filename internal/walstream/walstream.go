// Package walstream reads outbox messages from a logical replication slot
// with PostgreSQL's built-in pgoutput plugin: the part of the streaming
// replication protocol the outbox's WAL mode needs (create and drop a slot,
// stream committed transactions' logical decoding messages from it, confirm
// what is settled), over pgconn.
//
// The slot streams in commit order from its confirmed position: everything a
// receiver has not confirmed comes again after a reconnect, so confirm only
// transactions whose messages are all settled.
package walstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// LSN is a position in the WAL.
type LSN uint64

// String formats l as PostgreSQL does, e.g. 16/B374D848.
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// ParseLSN parses PostgreSQL's text form of a WAL position.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if ok {
		h, err1 := strconv.ParseUint(hi, 16, 32)
		l, err2 := strconv.ParseUint(lo, 16, 32)
		if err1 == nil && err2 == nil {
			return LSN(h<<32 | l), nil
		}
	}
	return 0, fmt.Errorf("walstream: %q is not a WAL position (want the form 16/B374D848)", s)
}

// The errors a caller acts on; each error returned wraps at most one of them.
var (
	// ErrWALLevel: the server does not write what logical decoding needs.
	ErrWALLevel = errors.New("wal_level is not logical")
	// ErrPrivilege: the role may not open a replication connection.
	ErrPrivilege = errors.New("the role lacks the REPLICATION attribute")
	// ErrSlotMissing: the slot does not exist.
	ErrSlotMissing = errors.New("replication slot does not exist")
	// ErrSlotActive: another connection streams the slot.
	ErrSlotActive = errors.New("replication slot is in use")
	// ErrSlotInvalidated: the server removed WAL the slot still needed
	// (max_slot_wal_keep_size); what was in it cannot be streamed again.
	ErrSlotInvalidated = errors.New("replication slot was invalidated")
)

// Options tune a Conn.
type Options struct {
	// Prefix keeps only the logical decoding messages with this prefix;
	// others are dropped without being copied. Empty keeps all.
	Prefix string
	// StatusInterval is how often Receive reports the confirmed position to
	// the server even when it asked for nothing; it must stay well below the
	// server's wal_sender_timeout (60 s by default). Zero means 10 s.
	StatusInterval time.Duration
}

// Conn is a replication connection. Its methods other than Confirm and
// Confirmed must not be called concurrently.
type Conn struct {
	pg   *pgconn.PgConn
	opts Options

	streaming  bool
	nextStatus time.Time
	received   LSN // the highest server WAL end seen
	confirmed  atomic.Uint64
	sent       LSN // the confirmed position last reported
	buf        []byte

	// Receive reads without a context of pgconn's: setting one up per
	// message (a deadline context and pgconn's watch of it) cost more than
	// decoding the message when every transaction holds one. The socket's
	// read deadline is set only when the next status update moves, and
	// the caller's context ends a read through one callback per context.
	deadline time.Time       // the read deadline set on the socket
	watched  context.Context // the context unwatch belongs to
	unwatch  func() bool
	// Receive reads the clock only when the status timer says the next
	// status update is due (a busy stream's reads come from pgconn's
	// buffer and never reach the socket's deadline), or after a read
	// that reached the deadline.
	due      atomic.Bool
	timer    *time.Timer
	timedOut bool
}

// Connect opens a replication connection (replication=database) to the
// database url names.
func Connect(ctx context.Context, url string, opts Options) (*Conn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("walstream: database URL: %w", err)
	}
	return ConnectConfig(ctx, cfg, opts)
}

// Close reports the confirmed position once more, if it moved and the
// connection still works, and closes the connection.
func (c *Conn) Close(ctx context.Context) error {
	// A connection that failed is being closed by pgconn in the background:
	// writing to it then would race with that close.
	if c.unwatch != nil {
		c.unwatch()
		c.unwatch, c.watched = nil, nil
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.streaming && !c.pg.IsClosed() && LSN(c.confirmed.Load()) != c.sent {
		_ = c.sendStatus()
	}
	return c.pg.Close(ctx)
}

// PgConn is the underlying connection, for tests and diagnostics.
func (c *Conn) PgConn() *pgconn.PgConn { return c.pg }

// nameRE is what PostgreSQL accepts as a replication slot name; publication
// names are held to it too, so neither needs quoting.
var nameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func checkName(what, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("walstream: %s name %q: use 1 to 63 lower-case letters, digits and underscores", what, name)
	}
	return nil
}

// exec runs a replication command and returns its result rows as text.
func (c *Conn) exec(ctx context.Context, sql, slot string) ([][]string, error) {
	if c.streaming {
		return nil, errors.New("walstream: the connection is streaming; commands need a connection of their own")
	}
	results, err := c.pg.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, explain(err, slot)
	}
	var rows [][]string
	for _, r := range results {
		for _, row := range r.Rows {
			cols := make([]string, len(row))
			for i, v := range row {
				cols[i] = string(v)
			}
			rows = append(rows, cols)
		}
	}
	return rows, nil
}

// WALEnd is the server's current WAL write position (IDENTIFY_SYSTEM).
func (c *Conn) WALEnd(ctx context.Context) (LSN, error) {
	sys, err := c.Identify(ctx)
	return sys.WALEnd, err
}

// System identifies the WAL history a server writes: its cluster (the
// system identifier, fixed when the cluster was initialised, kept by its
// physical standbys) and its timeline (a new one at each promotion or
// point-in-time recovery), and how far the WAL goes.
type System struct {
	ID       uint64
	Timeline int32
	// WALEnd is the position up to which the server flushed its WAL (on a
	// primary); every position a walsender sends is at or below it.
	WALEnd LSN
}

// Identify runs IDENTIFY_SYSTEM.
func (c *Conn) Identify(ctx context.Context) (System, error) {
	rows, err := c.exec(ctx, "IDENTIFY_SYSTEM", "")
	if err != nil {
		return System{}, err
	}
	if len(rows) != 1 || len(rows[0]) < 3 {
		return System{}, errors.New("walstream: IDENTIFY_SYSTEM returned no position")
	}
	id, err1 := strconv.ParseUint(rows[0][0], 10, 64)
	tl, err2 := strconv.ParseInt(rows[0][1], 10, 32)
	end, err3 := ParseLSN(rows[0][2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return System{}, fmt.Errorf("walstream: IDENTIFY_SYSTEM: %w", err)
	}
	return System{ID: id, Timeline: int32(tl), WALEnd: end}, nil
}

// CreateSlot creates a logical replication slot for pgoutput and returns the
// position it starts at: the slot streams transactions that commit after it.
// A temporary slot is dropped when the connection closes.
func (c *Conn) CreateSlot(ctx context.Context, slot string, temporary bool) (LSN, error) {
	if err := checkName("replication slot", slot); err != nil {
		return 0, err
	}
	temp := ""
	if temporary {
		temp = " TEMPORARY"
	}
	rows, err := c.exec(ctx, "CREATE_REPLICATION_SLOT "+slot+temp+" LOGICAL pgoutput NOEXPORT_SNAPSHOT", slot)
	if err != nil {
		return 0, err
	}
	if len(rows) != 1 || len(rows[0]) < 2 {
		return 0, errors.New("walstream: CREATE_REPLICATION_SLOT returned no position")
	}
	return ParseLSN(rows[0][1])
}

// DropSlot drops slot, waiting for a connection streaming it to let go.
func (c *Conn) DropSlot(ctx context.Context, slot string) error {
	if err := checkName("replication slot", slot); err != nil {
		return err
	}
	_, err := c.exec(ctx, "DROP_REPLICATION_SLOT "+slot+" WAIT", slot)
	return err
}

// Start streams slot from its confirmed position (or from `from`, if that
// is later) with pgoutput, keeping the logical decoding messages and what
// publication publishes. The publication must exist: pgoutput looks it up
// for every table change it decodes, and an empty one (CREATE PUBLICATION
// name, with no tables) publishes none of them. After Start, only Receive,
// Confirm, Confirmed and Close may be called.
func (c *Conn) Start(ctx context.Context, slot, publication string, from LSN) error {
	if err := checkName("replication slot", slot); err != nil {
		return err
	}
	if err := checkName("publication", publication); err != nil {
		return err
	}
	if c.streaming {
		return errors.New("walstream: already streaming")
	}
	sql := fmt.Sprintf("START_REPLICATION SLOT %s LOGICAL %s (proto_version '1', publication_names '%s', messages 'true')", slot, from, publication)
	c.pg.Frontend().Send(&pgproto3.Query{String: sql})
	if err := c.pg.Frontend().Flush(); err != nil {
		return fmt.Errorf("walstream: start replication: %w", err)
	}
	var failure error
	for {
		msg, err := c.pg.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("walstream: start replication: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyBothResponse:
			c.streaming = true
			c.confirmed.Store(uint64(from))
			c.sent = from
			c.nextStatus = time.Now().Add(c.opts.StatusInterval)
			c.timer = time.AfterFunc(c.opts.StatusInterval, func() { c.due.Store(true) })
			return nil
		case *pgproto3.ErrorResponse:
			failure = explain(pgconn.ErrorResponseToPgError(msg), slot)
		case *pgproto3.ReadyForQuery:
			if failure == nil {
				failure = errors.New("walstream: the server did not start streaming")
			}
			return failure
		}
	}
}

// Confirm records that everything up to lsn is settled. It never moves the
// confirmed position back; Receive reports it to the server at the next
// status update. Safe to call from any goroutine.
func (c *Conn) Confirm(lsn LSN) {
	for {
		cur := c.confirmed.Load()
		if uint64(lsn) <= cur || c.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Confirmed is the confirmed position.
func (c *Conn) Confirmed() LSN { return LSN(c.confirmed.Load()) }

// ServerWALEnd is the highest WAL end the server reported on this stream.
func (c *Conn) ServerWALEnd() LSN { return c.received }

// Receive returns the next event of the stream. It answers the server's
// keepalives and reports the confirmed position every StatusInterval while
// it waits. An error ends the stream: reconnect and Start again, and the
// slot resends what was not confirmed.
func (c *Conn) Receive(ctx context.Context) (Event, error) {
	if !c.streaming {
		return nil, errors.New("walstream: Receive before Start")
	}
	if ctx != c.watched {
		if c.unwatch != nil {
			c.unwatch()
		}
		// When ctx ends, a read in progress ends at once: its deadline
		// passes. ctx is marked done before this runs, so a read that
		// starts later sees ctx.Err below even if its deadline was set
		// after this one.
		nc := c.pg.Conn()
		c.watched = ctx
		c.unwatch = context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
		c.deadline = time.Time{}
	}
	for {
		if c.timedOut || c.due.Load() {
			c.timedOut = false
			if !time.Now().Before(c.nextStatus) {
				if err := c.sendStatus(); err != nil {
					return nil, err
				}
			}
		}
		if !c.deadline.Equal(c.nextStatus) {
			if err := c.pg.Conn().SetReadDeadline(c.nextStatus); err != nil {
				return nil, fmt.Errorf("walstream: receive: %w", err)
			}
			c.deadline = c.nextStatus
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		msg, err := c.pg.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if pgconn.Timeout(err) {
				// The deadline passed: the next status update is due.
				c.deadline = time.Time{}
				c.timedOut = true
				continue
			}
			return nil, fmt.Errorf("walstream: receive: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			ev, walEnd, reply, err := parseCopyData(msg.Data, c.opts.Prefix)
			if walEnd > c.received {
				c.received = walEnd
			}
			if reply {
				if err := c.sendStatus(); err != nil {
					return nil, err
				}
			}
			if errors.Is(err, errSkip) {
				continue
			}
			if err != nil {
				return nil, err
			}
			return ev, nil
		case *pgproto3.ErrorResponse:
			return nil, explain(pgconn.ErrorResponseToPgError(msg), "")
		case *pgproto3.CopyDone:
			return nil, errors.New("walstream: the server ended the stream")
		}
	}
}

// Hold keeps the stream up without reading it for d, or until ctx ends: for
// a receiver with no room for more messages. What the server sends meanwhile
// waits in the socket buffers and then in the walsender, which reads the
// status updates Hold sends every StatusInterval, so wal_sender_timeout does
// not end the connection. Receive goes on where the stream stopped.
func (c *Conn) Hold(ctx context.Context, d time.Duration) error {
	if !c.streaming {
		return errors.New("walstream: Hold before Start")
	}
	until := time.Now().Add(d)
	for {
		now := time.Now()
		if !now.Before(c.nextStatus) {
			if err := c.sendStatus(); err != nil {
				return err
			}
		}
		if !now.Before(until) {
			return nil
		}
		wake := c.nextStatus
		if until.Before(wake) {
			wake = until
		}
		t := time.NewTimer(wake.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sendStatus reports the confirmed position as written, flushed and applied.
func (c *Conn) sendStatus() error {
	confirmed := LSN(c.confirmed.Load())
	written := max(c.received, confirmed)
	c.buf = appendStatus(c.buf[:0], written, confirmed, time.Now())
	c.pg.Frontend().Send(&pgproto3.CopyData{Data: c.buf})
	if err := c.pg.Frontend().Flush(); err != nil {
		return fmt.Errorf("walstream: send status: %w", err)
	}
	c.sent = confirmed
	c.nextStatus = time.Now().Add(c.opts.StatusInterval)
	c.due.Store(false)
	c.timer.Reset(c.opts.StatusInterval)
	return nil
}

// explain turns the server's refusals a user can fix into one-line errors
// that say how, wrapping the matching Err value.
func explain(err error, slot string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return fmt.Errorf("walstream: %w", err)
	}
	msg := pe.Message
	switch {
	case strings.Contains(msg, "wal_level"):
		return fmt.Errorf("walstream: %w: %s (set it with ALTER SYSTEM SET wal_level = logical and restart PostgreSQL)", ErrWALLevel, msg)
	case (pe.Code == "28000" || pe.Code == "42501") && strings.Contains(msg, "replication"):
		return fmt.Errorf("walstream: %w: %s (grant it with ALTER ROLE <role> REPLICATION)", ErrPrivilege, msg)
	case pe.Code == "42704" && strings.Contains(msg, "replication slot"):
		return fmt.Errorf("walstream: %w: %s", ErrSlotMissing, msg)
	case pe.Code == "55006":
		return fmt.Errorf("walstream: %w: %s (another relay streams it; one at a time)", ErrSlotActive, msg)
	case strings.Contains(msg+pe.Detail, "invalidated") || strings.Contains(msg, "can no longer get changes"):
		if pe.Detail != "" {
			msg += ": " + pe.Detail
		}
		return fmt.Errorf("walstream: %w: %s (the WAL it needed is gone: drop the slot and create it again; messages in the lost WAL cannot be delivered)", ErrSlotInvalidated, msg)
	}
	if slot != "" {
		return fmt.Errorf("walstream: slot %s: %w", slot, err)
	}
	return fmt.Errorf("walstream: %w", err)
}

// ConnectConfig opens a replication connection (replication=database) with
// a copy of cfg, for a caller that holds a parsed configuration (a pool's)
// rather than a URL.
func ConnectConfig(ctx context.Context, cfg *pgconn.Config, opts Options) (*Conn, error) {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	// A busy stream is read a buffer at a time (lowatConn).
	dial := cfg.DialFunc
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newLowatConn(nc), nil
	}
	pg, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, explain(err, "")
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = 10 * time.Second
	}
	return &Conn{pg: pg, opts: opts}, nil
}
