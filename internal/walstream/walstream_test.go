package walstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/walmsg"
)

// The tests run on a throwaway cluster of their own with wal_level=logical
// (the shared test server may run with replica), which they also restart.
var cluster *pgembed.Cluster

const (
	prefix      = "wharf_t"
	publication = "wharf_t_pub"
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := pgembed.Start(ctx, pgembed.Options{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "walstream tests need a local PostgreSQL with wal_level=logical:", err)
		os.Exit(1)
	}
	cluster = c
	code := func() int {
		conn, err := pgx.Connect(context.Background(), c.URL())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "CREATE PUBLICATION "+publication+"; CREATE TABLE business (id int PRIMARY KEY)"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	_ = c.Stop()
	os.Exit(code)
}

func sqlConn(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	return conn
}

func replConn(t *testing.T, opts Options) *Conn {
	t.Helper()
	ctx := context.Background()
	c, err := Connect(ctx, cluster.URL(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(ctx) })
	return c
}

// newSlot creates a slot that the test drops when it ends.
func newSlot(t *testing.T, name string) LSN {
	t.Helper()
	ctx := context.Background()
	c := replConn(t, Options{})
	lsn, err := c.CreateSlot(ctx, name, false)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = sqlConnNoCleanup().Exec(ctx, "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1", name)
	})
	return lsn
}

func sqlConnNoCleanup() *pgx.Conn {
	conn, err := pgx.Connect(context.Background(), cluster.URL())
	if err != nil {
		panic(err)
	}
	return conn
}

func emit(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, transactional bool, pfx, content string) {
	t.Helper()
	_, err := q.Exec(context.Background(), "SELECT pg_logical_emit_message($1, $2, $3::bytea)", transactional, pfx, []byte(content))
	require.NoError(t, err)
}

// tx is one transaction as the stream delivered it.
type tx struct {
	begin    Begin
	messages []string
	commit   Commit
}

// collect receives until n transactions have committed, returning them and
// the non-transactional messages seen meanwhile.
func collect(t *testing.T, c *Conn, n int) ([]tx, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var txs []tx
	var loose []string
	var cur *tx
	for len(txs) < n {
		ev, err := c.Receive(ctx)
		require.NoError(t, err)
		switch ev := ev.(type) {
		case Begin:
			require.Nil(t, cur, "a Begin inside a transaction")
			cur = &tx{begin: ev}
		case Message:
			require.Equal(t, prefix, ev.Prefix)
			if !ev.Transactional {
				loose = append(loose, string(ev.Content))
				continue
			}
			require.NotNil(t, cur, "a transactional message outside a transaction")
			require.Greater(t, ev.LSN, LSN(0))
			cur.messages = append(cur.messages, string(ev.Content))
		case Commit:
			require.NotNil(t, cur, "a Commit outside a transaction")
			require.Equal(t, cur.begin.FinalLSN, ev.CommitLSN)
			require.Greater(t, ev.EndLSN, ev.CommitLSN)
			cur.commit = ev
			txs = append(txs, *cur)
			cur = nil
		}
	}
	return txs, loose
}

func TestStreamsCommittedMessagesInCommitOrder(t *testing.T) {
	ctx := context.Background()
	newSlot(t, "order_slot")
	a, b, q := sqlConn(t), sqlConn(t), sqlConn(t)

	emit(t, q, false, prefix, "loose")
	// A begins first and commits last: the stream has B first.
	txA, err := a.Begin(ctx)
	require.NoError(t, err)
	emit(t, txA, true, prefix, "a1")
	txB, err := b.Begin(ctx)
	require.NoError(t, err)
	emit(t, txB, true, prefix, "b1")
	emit(t, txB, true, prefix, "b2")
	require.NoError(t, txB.Commit(ctx))
	emit(t, txA, true, prefix, "a2")
	require.NoError(t, txA.Commit(ctx))
	// Rolled back: never streamed.
	txC, err := q.Begin(ctx)
	require.NoError(t, err)
	emit(t, txC, true, prefix, "rolled back")
	require.NoError(t, txC.Rollback(ctx))
	// Another prefix and a business row in the same transaction: the row is
	// not published and the message is filtered out.
	txD, err := q.Begin(ctx)
	require.NoError(t, err)
	emit(t, txD, true, "other_app", "not ours")
	_, err = txD.Exec(ctx, "INSERT INTO business VALUES (1)")
	require.NoError(t, err)
	emit(t, txD, true, prefix, "d1")
	require.NoError(t, txD.Commit(ctx))

	c := replConn(t, Options{Prefix: prefix})
	require.NoError(t, c.Start(ctx, "order_slot", publication, 0))
	txs, loose := collect(t, c, 3)
	require.Equal(t, []string{"loose"}, loose)
	require.Equal(t, []string{"b1", "b2"}, txs[0].messages)
	require.Equal(t, []string{"a1", "a2"}, txs[1].messages)
	require.Equal(t, []string{"d1"}, txs[2].messages)
	require.Less(t, txs[0].commit.EndLSN, txs[1].commit.EndLSN)
	require.Less(t, txs[1].commit.EndLSN, txs[2].commit.EndLSN)
	require.WithinDuration(t, time.Now(), txs[2].commit.CommitTime, time.Minute)
	require.NotZero(t, txs[0].begin.XID)
}

func slotConfirmed(t *testing.T, slot string) LSN {
	t.Helper()
	var s string
	require.NoError(t, sqlConn(t).QueryRow(context.Background(),
		"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s))
	lsn, err := ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

func TestOnlyUnconfirmedTransactionsComeAgain(t *testing.T) {
	ctx := context.Background()
	newSlot(t, "confirm_slot")
	q := sqlConn(t)
	for i := 1; i <= 3; i++ {
		emit(t, q, true, prefix, fmt.Sprint("m", i))
	}
	c, err := Connect(ctx, cluster.URL(), Options{Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx, "confirm_slot", publication, 0))
	txs, _ := collect(t, c, 3)
	c.Confirm(txs[1].commit.EndLSN)
	c.Confirm(txs[0].commit.EndLSN) // never backwards
	require.Equal(t, txs[1].commit.EndLSN, c.Confirmed())
	require.NoError(t, c.Close(ctx))
	// Close sent the position before ending the stream; the walsender
	// records it before it exits, which can be after Close returned.
	waitSlotInactive(t, "confirm_slot")
	require.Equal(t, txs[1].commit.EndLSN, slotConfirmed(t, "confirm_slot"))

	// The third was received but not confirmed: it comes again, alone.
	c2 := replConn(t, Options{Prefix: prefix})
	startFree(t, c2, "confirm_slot")
	again, _ := collect(t, c2, 1)
	require.Equal(t, []string{"m3"}, again[0].messages)
	require.Equal(t, txs[2].commit.EndLSN, again[0].commit.EndLSN)
}

func TestIdleStreamStaysUpAndReportsProgress(t *testing.T) {
	ctx := context.Background()
	q := sqlConn(t)
	setting(t, q, "wal_sender_timeout", "1s")
	newSlot(t, "idle_slot")
	c := replConn(t, Options{Prefix: prefix, StatusInterval: 200 * time.Millisecond})
	require.NoError(t, c.Start(ctx, "idle_slot", publication, 0))

	// Writes the slot has no message in: the server's keepalives move the
	// WAL end, and confirming it lets the server recycle that WAL.
	for i := 0; i < 3; i++ {
		_, err := q.Exec(ctx, "INSERT INTO business VALUES ($1)", 100+i)
		require.NoError(t, err)
	}
	var end LSN
	deadline, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		// Three wal_sender_timeouts without a message of ours: the stream
		// must still be up, answering the server.
		ev, err := c.Receive(deadline)
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		require.NoError(t, err)
		if k, ok := ev.(Keepalive); ok {
			end = k.WALEnd
			c.Confirm(end)
		}
	}
	require.NotZero(t, end, "keepalives carry the server's WAL end")
	require.Eventually(t, func() bool { return slotConfirmed(t, "idle_slot") >= end }, time.Minute, 50*time.Millisecond)
	var active bool
	require.NoError(t, q.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'idle_slot'").Scan(&active))
	require.True(t, active, "the server did not drop the idle stream")
}

// A receiver that stops reading (its buffer is full) keeps the stream with
// Hold past three wal_sender_timeouts while the server has megabytes to
// send, and then receives every message in order; without Hold the server
// ends the same stream.
func TestHeldStreamStaysUp(t *testing.T) {
	ctx := context.Background()
	q := sqlConn(t)
	setting(t, q, "wal_sender_timeout", "1s")
	// Both slots exist before the messages: a slot streams what is written
	// after its creation.
	newSlot(t, "held_slot_true")
	newSlot(t, "held_slot_false")
	const n = 400
	payload := strings.Repeat("x", 64<<10) // 26 MB in all: more than the socket buffers hold
	tx, err := q.Begin(ctx)
	require.NoError(t, err)
	for i := range n {
		emit(t, tx, true, prefix, fmt.Sprintf("%04d%s", i, payload))
	}
	require.NoError(t, tx.Commit(ctx))

	for _, hold := range []bool{true, false} {
		slot := fmt.Sprintf("held_slot_%t", hold)
		c := replConn(t, Options{Prefix: prefix, StatusInterval: 200 * time.Millisecond})
		require.NoError(t, c.Start(ctx, slot, publication, 0))
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var got []string
		for len(got) < 1 {
			ev, err := c.Receive(rctx)
			require.NoError(t, err)
			if m, ok := ev.(Message); ok && m.Transactional {
				got = append(got, string(m.Content[:4]))
			}
		}
		if hold {
			require.NoError(t, c.Hold(rctx, 3500*time.Millisecond))
		} else {
			time.Sleep(3500 * time.Millisecond)
		}
		var err error
		for len(got) < n && err == nil {
			var ev Event
			if ev, err = c.Receive(rctx); err == nil {
				if m, ok := ev.(Message); ok && m.Transactional {
					got = append(got, string(m.Content[:4]))
				}
			}
		}
		cancel()
		if !hold {
			require.Error(t, err, "without Hold the server keeps a stream that sent nothing for 3.5 s with wal_sender_timeout 1s: the test shows nothing")
			continue
		}
		require.NoError(t, err)
		for i, s := range got {
			require.Equal(t, fmt.Sprintf("%04d", i), s)
		}
	}
}

// startFree starts streaming slot on c once the slot is free: a connection
// that streamed it before has closed, but its walsender ends a moment later
// (until then Start fails with ErrSlotActive, as a relay taking over sees).
// waitSlotInactive waits until no walsender streams from slot.
func waitSlotInactive(t *testing.T, slot string) {
	t.Helper()
	q := sqlConn(t)
	require.Eventually(t, func() bool {
		var active bool
		require.NoError(t, q.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active))
		return !active
	}, time.Minute, 20*time.Millisecond, "the walsender of slot %s did not exit", slot)
}

func startFree(t *testing.T, c *Conn, slot string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a hang guard: the old walsender exits
	for {
		err := c.Start(context.Background(), slot, publication, 0)
		if !errors.Is(err, ErrSlotActive) || time.Now().After(deadline) {
			require.NoError(t, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setting changes a server setting for the rest of the test.
func setting(t *testing.T, q *pgx.Conn, name, value string) {
	t.Helper()
	ctx := context.Background()
	_, err := q.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", name, value))
	require.NoError(t, err)
	_, err = q.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = q.Exec(ctx, "ALTER SYSTEM RESET "+name)
		_, _ = q.Exec(ctx, "SELECT pg_reload_conf()")
	})
}

func TestSlotSurvivesRestartAndCrash(t *testing.T) {
	ctx := context.Background()
	newSlot(t, "restart_slot")
	var seen []string
	for _, mode := range []string{"fast", "immediate"} {
		q := sqlConnNoCleanup()
		emit(t, q, true, prefix, mode+" 1")
		emit(t, q, true, prefix, mode+" 2")
		_ = q.Close(ctx)
		c, err := Connect(ctx, cluster.URL(), Options{Prefix: prefix})
		require.NoError(t, err)
		startFree(t, c, "restart_slot")
		txs, _ := collect(t, c, 2)
		for txs[0].messages[0] != mode+" 1" { // resent from the round before
			require.Contains(t, seen, txs[0].messages[0])
			txs = txs[1:]
			more, _ := collect(t, c, 1)
			txs = append(txs, more...)
		}
		require.Equal(t, []string{mode + " 2"}, txs[1].messages)
		seen = append(seen, mode+" 1", mode+" 2")
		c.Confirm(txs[0].commit.EndLSN)
		require.NoError(t, c.Close(ctx))

		require.NoError(t, cluster.StopServer(mode))
		require.NoError(t, cluster.StartServer(ctx))

		c2, err := Connect(ctx, cluster.URL(), Options{Prefix: prefix})
		require.NoError(t, err)
		startFree(t, c2, "restart_slot")
		// PostgreSQL before 17 saves a slot's confirmed position only when
		// the slot's restart point moves too, so after a restart, clean or
		// not, confirmed transactions may come again (at least once), but
		// nothing is skipped: the unconfirmed one comes.
		var got []tx
		for {
			got, _ = collect(t, c2, 1)
			if got[0].messages[0] == mode+" 2" {
				break
			}
			require.Contains(t, seen, got[0].messages[0], "only a confirmed transaction may come again")
		}
		c2.Confirm(got[0].commit.EndLSN)
		require.NoError(t, c2.Close(ctx))
	}
}

func requireOneLine(t *testing.T, err error, target error, contains string) {
	t.Helper()
	require.Error(t, err)
	if target != nil {
		require.ErrorIs(t, err, target)
	}
	require.Contains(t, err.Error(), contains)
	require.NotContains(t, err.Error(), "\n")
}

func TestErrorsSayWhatToDo(t *testing.T) {
	ctx := context.Background()

	c := replConn(t, Options{})
	err := c.Start(ctx, "no_such_slot", publication, 0)
	requireOneLine(t, err, ErrSlotMissing, "no_such_slot")
	_, err = c.CreateSlot(ctx, "Bad-Name", false)
	requireOneLine(t, err, nil, "lower-case letters")
	err = c.Start(ctx, "ok", "bad name", 0)
	requireOneLine(t, err, nil, "publication name")
	_, err = ParseLSN("16-B3")
	requireOneLine(t, err, nil, "16/B374D848")

	// One stream per slot.
	newSlot(t, "busy_slot")
	first := replConn(t, Options{})
	require.NoError(t, first.Start(ctx, "busy_slot", publication, 0))
	second := replConn(t, Options{})
	requireOneLine(t, second.Start(ctx, "busy_slot", publication, 0), ErrSlotActive, "another relay")
	// The refused connection can still run commands.
	_, err = second.WALEnd(ctx)
	require.NoError(t, err)

	// A role without REPLICATION.
	q := sqlConn(t)
	_, err = q.Exec(ctx, "DROP ROLE IF EXISTS wharf_norepl; CREATE ROLE wharf_norepl LOGIN")
	require.NoError(t, err)
	_, err = Connect(ctx, strings.Replace(cluster.URL(), "postgres@", "wharf_norepl@", 1), Options{})
	requireOneLine(t, err, ErrPrivilege, "ALTER ROLE")
}

func TestInvalidatedSlotIsNamed(t *testing.T) {
	ctx := context.Background()
	q := sqlConn(t)
	newSlot(t, "lost_slot")
	setting(t, q, "max_slot_wal_keep_size", "1MB")
	// Move the WAL on by a few segments past the slot and checkpoint: the
	// server gives up the WAL the slot still needed. A checkpoint may leave
	// the slot "unreserved" (past the limit, its WAL not yet removed: seen
	// in CI when another checkpoint was under way), so move on and
	// checkpoint again until the server has given the slot up; a bounded
	// number of rounds, not a time.
	var status string
	for round := 0; round < 10 && status != "lost"; round++ {
		for i := 0; i < 4; i++ {
			_, err := q.Exec(ctx, "INSERT INTO business SELECT coalesce(max(id), 0) + 1 FROM business")
			require.NoError(t, err)
			_, err = q.Exec(ctx, "SELECT pg_switch_wal()")
			require.NoError(t, err)
		}
		_, err := q.Exec(ctx, "CHECKPOINT")
		require.NoError(t, err)
		require.NoError(t, q.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost_slot'").Scan(&status))
	}
	require.Equal(t, "lost", status)

	c := replConn(t, Options{})
	requireOneLine(t, c.Start(ctx, "lost_slot", publication, 0), ErrSlotInvalidated, "drop the slot")
}

func TestWALLevelReplicaIsNamed(t *testing.T) {
	ctx := context.Background()
	replica, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	defer func() { _ = replica.Stop() }()
	c, err := Connect(ctx, replica.URL(), Options{})
	require.NoError(t, err)
	defer func() { _ = c.Close(ctx) }()
	_, err = c.CreateSlot(ctx, "any_slot", false)
	requireOneLine(t, err, ErrWALLevel, "wal_level = logical")
}

// WAL mode's ids come from the position pg_logical_emit_message returns
// (the producer's only round trip): the stream must report the same
// position for the message, so that the relay derives the same ids.
func TestMessagePositionIsWhatTheEmitReturned(t *testing.T) {
	ctx := context.Background()
	newSlot(t, "lsn_slot")
	q := sqlConn(t)
	var want []LSN
	for i := range 3 {
		tx, err := q.Begin(ctx)
		require.NoError(t, err)
		var s string
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)::text", prefix, []byte(fmt.Sprint("m", i))).Scan(&s))
		require.NoError(t, tx.Commit(ctx))
		lsn, err := ParseLSN(s)
		require.NoError(t, err)
		want = append(want, lsn)
	}
	c := replConn(t, Options{Prefix: prefix})
	require.NoError(t, c.Start(ctx, "lsn_slot", publication, 0))
	var got []LSN
	deadline, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for len(got) < 3 {
		ev, err := c.Receive(deadline)
		require.NoError(t, err)
		if m, ok := ev.(Message); ok {
			got = append(got, m.LSN)
		}
	}
	require.Equal(t, want, got)
}

// The seqs WAL mode derives from the emit's position (walmsg.FirstSeq) are
// unique and growing across records, and the relay computes the same ones
// from the stream, also where a short record follows a long one.
func TestSeqsFromPositionsAreUniqueAndAgree(t *testing.T) {
	ctx := context.Background()
	newSlot(t, "seq_slot")
	q := sqlConn(t)
	sizes := []int{1000, 1, 50, 1, 1}
	var produced []int64
	for _, n := range sizes {
		records := make([]walmsg.Record, n)
		for i := range records {
			records[i] = walmsg.Record{Topic: "t", Payload: []byte{byte(i)}}
		}
		content, err := walmsg.Append(nil, records)
		require.NoError(t, err)
		var s string
		require.NoError(t, q.QueryRow(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)::text", prefix, content).Scan(&s))
		end, err := ParseLSN(s)
		require.NoError(t, err)
		for i := range n {
			produced = append(produced, walmsg.FirstSeq(uint64(end), n)+int64(i))
		}
	}
	for i := 1; i < len(produced); i++ {
		require.Greater(t, produced[i], produced[i-1], "seq %d", i)
	}

	c := replConn(t, Options{Prefix: prefix})
	require.NoError(t, c.Start(ctx, "seq_slot", publication, 0))
	var streamed []int64
	var ends []LSN
	deadline, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for len(ends) < len(sizes) {
		ev, err := c.Receive(deadline)
		require.NoError(t, err)
		if m, ok := ev.(Message); ok {
			recs, err := walmsg.Decode(m.Content)
			require.NoError(t, err)
			for i := range recs {
				streamed = append(streamed, walmsg.FirstSeq(uint64(m.LSN), len(recs))+int64(i))
			}
			ends = append(ends, m.LSN)
		}
	}
	require.Equal(t, produced, streamed)
	// Why not end + i: the one-message record after the 1000-message one
	// ends fewer than 1000 bytes after it.
	require.Less(t, uint64(ends[1]-ends[0]), uint64(sizes[0]), "end+i would have collided here")
}

// Identify names the server's WAL history as SQL sees it: the cluster's
// system identifier, the timeline it writes and a WAL end at or past every
// position written before.
func TestIdentifyNamesTheHistory(t *testing.T) {
	ctx := context.Background()
	q := sqlConn(t)
	var sysid int64
	var timeline int32
	var before string
	require.NoError(t, q.QueryRow(ctx, `SELECT (pg_control_system()).system_identifier,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int, pg_current_wal_flush_lsn()::text`).Scan(&sysid, &timeline, &before))
	sys, err := replConn(t, Options{}).Identify(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(sysid), sys.ID)
	require.Equal(t, timeline, sys.Timeline)
	require.NotZero(t, sys.Timeline)
	at, err := ParseLSN(before)
	require.NoError(t, err)
	require.GreaterOrEqual(t, sys.WALEnd, at)
}

// Receive blocked on an idle stream returns as soon as its context ends,
// long before the next status update is due; the connection then receives
// with another context as before.
func TestReceiveEndsWithItsContext(t *testing.T) {
	ctx := context.Background()
	q := sqlConn(t)
	newSlot(t, "cancel_slot")
	c := replConn(t, Options{Prefix: prefix, StatusInterval: 10 * time.Minute})
	require.NoError(t, c.Start(ctx, "cancel_slot", publication, 0))

	rctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		for {
			if _, err := c.Receive(rctx); err != nil {
				got <- err
				return
			}
		}
	}()
	cancel()
	select {
	case err := <-got:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute): // a hang guard: the status deadline is 10 minutes away
		t.Fatal("Receive did not return when its context ended")
	}

	emit(t, q, true, prefix, "after")
	txs, _ := collect(t, c, 1)
	require.Equal(t, []string{"after"}, txs[0].messages)
}
