//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/walmsg"
)

// The database goes back in time under a running WAL relay: its data
// directory, saved while producers committed, is put back (a point-in-time
// restore, or a failover to a standby that lagged), and the producers go on
// committing on the restored history, whose WAL positions (and so seqs)
// repeat ones the relay has already passed.
//
// What must arrive: every message the restored database holds in its
// ledger, that is every message committed before the save and every one
// committed after the restore. The ledger is written in the producers' own
// transactions, so the restored database's ledger is exactly what committed
// on the history that survived. Messages committed after the save and
// before the restore are gone with the abandoned history; the relay may
// have delivered them before the restore, which is no error: the verifier
// tells them (by their id: seq and nonce, kept by the producers for every
// commit they attempted) from a message nobody wrote, which is one.
func TestWALRestoreUnderLoad(t *testing.T) {
	c := startCluster(t, map[string]string{"wal_level": "logical"})
	o := newWALOutbox(t, c.URL())
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	// A lease longer than the restore takes: the relays keep their lanes,
	// and what they hold in memory, across it.
	rs := []*relay{
		startRelay(t, o, "", "a", "", "--sink", sinkFile(path), "--lease-ttl", "30s"),
		startRelay(t, o, "", "b", "", "--sink", sinkFile(path), "--lease-ttl", "30s"),
	}
	l := startLoad(t, o, nil, loadShape{track: true})
	waitDelivered(t, col, 300, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must(t, c.SaveData(ctx), "save the data directory")
	saved := l.committed.Load()
	// The abandoned history: commits after the save, delivered (and
	// settled) before the restore throws them away. It is five times
	// longer than what the new history commits below, so the new history's
	// messages take WAL positions the relay has passed.
	newCommits := pick(int64(300), int64(3000))
	if !within(90*time.Second, func() bool { return l.committed.Load() >= saved+5*newCommits }) {
		t.Fatalf("only %d commits after the save within 90s", l.committed.Load()-saved)
	}
	waitDelivered(t, col, countDelivered(col)+300, 60*time.Second)
	oldEnd := walLSN(t, o.pool)
	must(t, c.RestoreData(ctx), "put the saved data directory back")
	cleared := time.Now()
	restored := l.committed.Load()
	if !within(90*time.Second, func() bool { return l.committed.Load() >= restored+newCommits }) {
		t.Fatalf("only %d commits after the restore within 90s", l.committed.Load()-restored)
	}
	revive(t, rs)
	tl := checkWAL(t, "data directory restored under load (history rewound), WAL mode", o, l, col, cleared, 90*time.Second,
		walCheck{abandoned: l.triedIDs()})
	led := o.ledger(t)
	var newEnd int64
	for seq := range led {
		newEnd = max(newEnd, seq)
	}
	if newEnd >= oldEnd {
		t.Errorf("the new history's last message (%d) is past the abandoned history's end (%d): the scenario did not reuse positions", newEnd, oldEnd)
	}
	gone := len(l.triedIDs()) - len(led)
	finishRow(t, tl, l, fmt.Sprintf("abandoned history: about %d messages gone with it (commit attempted, not in the restored ledger), %d of them delivered before the restore (no error); the new history stayed below the old one's WAL end",
		gone, tl.abandonedDelivered))
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

// A DBA drops the outbox's replication slot under load (after ending the
// relay's walsender, which holds it). While it is missing, producers'
// enqueues fail with an error naming the fix, so nothing is committed where
// no relay reads; `wharf migrate up --mode wal` creates it again, and
// everything committed from then on is delivered.
//
// What must arrive: every message at or below the position the slot had
// confirmed when it was dropped (the relay settled it), and every message
// written to the WAL after the drop. Messages written before the drop and
// after that position went with the slot unless the relay had read them
// (a transaction that enqueued before the drop may even commit after it):
// the relay says so, and the row counts them. A message written after the
// drop must be delivered, so a producer that could still enqueue while the
// slot was missing shows as lost.
func TestWALSlotDroppedUnderLoad(t *testing.T) {
	url, err := testdb.LogicalURL()
	must(t, err, "start a cluster with wal_level=logical")
	o := newWALOutbox(t, url)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	r := startRelay(t, o, "", "a", "", "--sink", sinkFile(path))
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)

	// The DBA: end the walsender, then drop the slot. The relay connects
	// again at once and may hold the slot again before the drop: repeat
	// until the drop wins.
	var confirmed int64
	var dropErr error
	if !within(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = o.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", o.schema)
		if dropErr = o.pool.QueryRow(ctx, "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", o.schema).Scan(&confirmed); dropErr != nil {
			return false
		}
		_, dropErr = o.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", o.schema)
		return dropErr == nil
	}) {
		t.Fatalf("drop the slot: %v", dropErr)
	}
	dropped := walLSN(t, o.pool)
	errsAtDrop := l.errors.Load()

	// Producers are refused, with an error that names the fix.
	wantErr := "replication slot " + o.schema + " is missing or lost"
	refused := within(60*time.Second, func() bool {
		s, _ := l.lastErr.Load().(string)
		return l.errors.Load() > errsAtDrop && strings.Contains(s, wantErr)
	})
	lastErr, _ := l.lastErr.Load().(string)
	if !refused {
		t.Errorf("while the slot was missing no enqueue failed with %q (producer errors %d since the drop; last: %s)", wantErr, l.errors.Load()-errsAtDrop, lastErr)
	} else if !strings.Contains(lastErr, "wharf migrate up --mode wal --schema "+o.schema) {
		t.Errorf("the enqueue error does not say how to create the slot again: %s", lastErr)
	}
	// The relay says what it cannot read, and what to run.
	if !within(60*time.Second, func() bool { return strings.Contains(r.tail(1<<16), "wharf migrate up --mode wal --schema "+o.schema) }) {
		t.Errorf("the relay does not say that the slot is missing and what to run; its stderr ends:\n%s", r.tail(2000))
	}
	ackedAtRefusal := l.committed.Load()

	out, err := wharfCmd("migrate", "up", "--mode", "wal", "--schema", o.schema, "--database-url", o.url)
	if err != nil {
		t.Fatalf("wharf migrate up --mode wal with the slot missing: %v\n%s", err, out)
	}
	if !strings.Contains(out, "created it again") {
		t.Errorf("wharf migrate up --mode wal does not say that it created the slot again:\n%s", out)
	}
	cleared := time.Now()
	var created int64
	must(t, o.pool.QueryRow(context.Background(), "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", o.schema).Scan(&created), "the new slot")
	// Producers commit again; the relay streams the new slot.
	after := l.committed.Load()
	if !within(60*time.Second, func() bool { return l.committed.Load() >= after+300 }) {
		t.Fatalf("only %d commits within 60s after the slot was created again (last producer error: %v)", l.committed.Load()-after, l.lastErr.Load())
	}
	revive(t, []*relay{r})
	tl := checkWAL(t, "replication slot dropped under load, recreated by migrate up, WAL mode", o, l, col, cleared, 90*time.Second,
		walCheck{required: func(seq int64) bool { return seq <= confirmed || seq > dropped }})
	inGap := 0
	for seq := range o.ledger(t) {
		if seq > dropped && seq <= created {
			inGap++
		}
	}
	if inGap > 0 {
		t.Errorf("%d messages committed between the drop and the new slot's start", inGap)
	}
	finishRow(t, tl, l, fmt.Sprintf("%d producer errors while the slot was missing; %d messages written to the WAL after the slot's confirmed position and before the drop went with the slot undelivered; %d messages committed while it was missing (%d commits acknowledged between the first refusal and migrate up)",
		l.errors.Load()-errsAtDrop, tl.optionalMissing, inGap, after-ackedAtRefusal))
	r.stop(t, 30*time.Second)
}

// Forged records under load. A role with no grant tries to emit a logical
// decoding message with the outbox's prefix, which must be refused. The
// producer role, which may call enqueue_wal, sends contents naming the seqs
// of messages the relay holds (scheduled a few seconds ahead): each such
// content must be dead-lettered whole, and never replace the message whose
// seq it names. Every real message is delivered once, with its own id, and
// no forged payload reaches the destination.
func TestWALForgedRecords(t *testing.T) {
	url, err := testdb.LogicalURL()
	must(t, err, "start a cluster with wal_level=logical")
	o := newWALOutbox(t, url)
	ctx := context.Background()
	nogrant, producer, relayRole := o.schema+"_nogrant", o.schema+"_producer", o.schema+"_relay"
	flowRunner, flowReader := o.schema+"_flow_runner", o.schema+"_flow_reader"
	t.Cleanup(func() {
		for _, role := range []string{nogrant, producer, relayRole, flowRunner, flowReader} {
			_, _ = o.pool.Exec(context.Background(), "DROP OWNED BY "+role)
			_, _ = o.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		}
	})
	_, err = o.pool.Exec(ctx, "CREATE ROLE "+nogrant+" NOLOGIN")
	must(t, err, "create a role with no grant")
	if out, err := wharfCmd("migrate", "roles", "--create", "--schema", o.schema, "--database-url", o.url, "--producer", producer, "--relay", relayRole,
		"--flow-runner", flowRunner, "--flow-reader", flowReader); err != nil {
		t.Fatalf("wharf migrate roles --create: %v\n%s", err, out)
	}
	as := func(role, sql string, args ...any) error {
		tx, err := o.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	r := startRelay(t, o, "", "a", "", "--sink", sinkFile(path))
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)

	// The victims: messages the relay holds until their deliver_at.
	victims := pick(20, 200)
	var dbNow time.Time
	must(t, o.pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow), "database time")
	msgs := make([]wharf.Message, victims)
	for i := range msgs {
		msgs[i] = wharf.Message{Topic: "orders", Key: fmt.Sprintf("victim-%d", i), Payload: []byte(fmt.Sprintf(`{"victim":%d}`, i)), DeliverAt: dbNow.Add(pick(3*time.Second, 10*time.Second))}
	}
	tx, err := o.pool.Begin(ctx)
	must(t, err, "begin")
	ids, err := o.client.EnqueueTx(ctx, tx, msgs...)
	must(t, err, "enqueue the victims")
	victimIDs := make([]msgID, len(ids))
	for i, id := range ids {
		seq, nonce, err := wharf.ParseID(id)
		must(t, err, "parse id %s", id)
		victimIDs[i] = msgID{seq, nonce}
		_, err = tx.Exec(ctx, "INSERT INTO "+o.schema+".fault_ledger (seq, topic, key, poison, nonce) VALUES ($1, $2, $3, false, $4)", seq, msgs[i].Topic, msgs[i].Key, nonce)
		must(t, err, "ledger")
	}
	must(t, tx.Commit(ctx), "commit the victims")

	// A role with no grant may not emit with the outbox's prefix, nor call
	// enqueue_wal.
	intruder, err := walmsg.Append(nil, []walmsg.Record{{Nonce: 1, Topic: "orders", Key: "victim-0", Payload: []byte(`{"forged":"no grant"}`)}})
	must(t, err, "encode")
	emitted := 0
	for _, q := range []string{"SELECT pg_logical_emit_message(true, $1::text, $2::bytea)", "SELECT pg_logical_emit_message(false, $1::text, $2::bytea)"} {
		err := as(nogrant, q, o.schema, intruder)
		if err == nil {
			emitted++
			t.Errorf("a role with no grant emitted a message with the outbox's prefix (%s)", q)
		} else if !isSQLState(err, "42501") {
			t.Errorf("a role with no grant emitting with the outbox's prefix: want SQLSTATE 42501 (insufficient privilege), got %v", err)
		}
	}
	if err := as(nogrant, "SELECT "+o.schema+".enqueue_wal($1::bytea)", intruder); err == nil {
		emitted++
		t.Errorf("a role with no grant called %s.enqueue_wal", o.schema)
	} else if !isSQLState(err, "42501") {
		t.Errorf("a role with no grant calling enqueue_wal: want SQLSTATE 42501, got %v", err)
	}

	// The producer role names the victims' seqs.
	var forged [][]byte
	for i, v := range victimIDs {
		c, err := walmsg.Append(nil, []walmsg.Record{{Seq: v.seq, Nonce: v.nonce ^ 1, Topic: "orders", Key: fmt.Sprintf("victim-%d", i), Payload: []byte(fmt.Sprintf(`{"forged":%d}`, i))}})
		must(t, err, "encode")
		if err := as(producer, "SELECT "+o.schema+".enqueue_wal($1::bytea)", c); err != nil {
			t.Errorf("the producer role's enqueue_wal refused a content (it may call it; the relay judges the content): %v", err)
			continue
		}
		forged = append(forged, c)
	}
	cleared := time.Now()
	// Load goes on until the victims are due and delivered: checkWAL waits.
	if !within(60*time.Second, func() bool {
		var now time.Time
		return o.pool.QueryRow(ctx, "SELECT now()").Scan(&now) == nil && now.After(msgs[0].DeliverAt.Add(time.Second))
	}) {
		t.Fatal("the database clock did not pass the victims' deliver_at within 60s")
	}
	tl := checkWAL(t, "forged records (role with no grant; producer naming held seqs), WAL mode", o, l, col, cleared, 90*time.Second, walCheck{})
	once := 0
	for i, v := range victimIDs {
		if n := tl.counts[v]; n == 1 {
			once++
		} else if i-once < 5 {
			t.Errorf("victim message %d delivered %d times, want once", v.seq, n)
		}
	}
	data, err := os.ReadFile(path)
	must(t, err, "read %s", path)
	if strings.Contains(string(data), `"forged"`) {
		t.Errorf("a forged payload reached the destination")
	}
	var dead int
	if !within(60*time.Second, func() bool {
		return o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".dead_letters WHERE payload = ANY($1::bytea[])", forged).Scan(&dead) == nil && dead == len(forged)
	}) {
		t.Errorf("%d of %d forged contents dead-lettered", dead, len(forged))
	}
	finishRow(t, tl, l, fmt.Sprintf("%d of 3 attempts by a role with no grant refused; %d forged contents naming held seqs, %d dead-lettered; %d of %d victims delivered exactly once with their own id",
		3-emitted, len(forged), dead, once, victims))
	r.stop(t, 30*time.Second)
}

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// One producer transaction far larger than the relay's memory budget
// (50,000 messages of 4 KiB, 200 MB; twice that in the long form) next to
// ordinary load, with a relay whose --max-buffered and --max-buffered-bytes
// are small: its peak RSS stays below what holding the transaction whole
// would take, and every message is delivered once, in order.
func TestWALLargeTransaction(t *testing.T) {
	url, err := testdb.LogicalURL()
	must(t, err, "start a cluster with wal_level=logical")
	o := newWALOutbox(t, url)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	col := &fileCollector{paths: []string{path}}
	r := startRelay(t, o, "", "a", "", "--sink", sinkFile(path), "--fetch-batch", "500", "--max-buffered", "1000", "--max-buffered-bytes", "16MiB")
	l := startLoad(t, o, nil, loadShape{producers: 1, pause: 20 * time.Millisecond})
	waitDelivered(t, col, 100, 30*time.Second)

	n := pick(50_000, 100_000)
	const size, batch, keys = 4096, 500, 16
	const bound = 150 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tx, err := o.pool.Begin(ctx)
	must(t, err, "begin")
	defer func() { _ = tx.Rollback(context.Background()) }()
	pad := strings.Repeat("x", size-40)
	var big []msgID
	for at := 0; at < n; at += batch {
		msgs := make([]wharf.Message, min(batch, n-at))
		for i := range msgs {
			msgs[i] = wharf.Message{Topic: "bulk", Key: fmt.Sprintf("bulk-%d", (at+i)%keys), Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, at+i, pad))}
		}
		ids, err := o.client.EnqueueTx(ctx, tx, msgs...)
		must(t, err, "enqueue messages %d..", at)
		seqs, nonces, topics, ks := make([]int64, len(ids)), make([]int64, len(ids)), make([]string, len(ids)), make([]string, len(ids))
		for i, id := range ids {
			seqs[i], nonces[i], err = wharf.ParseID(id)
			must(t, err, "parse id")
			topics[i], ks[i] = msgs[i].Topic, msgs[i].Key
			big = append(big, msgID{seqs[i], nonces[i]})
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+o.schema+".fault_ledger (seq, topic, key, poison, nonce) SELECT s, t, k, false, n FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) AS u(s, t, k, n)", seqs, topics, ks, nonces)
		must(t, err, "ledger")
	}
	must(t, tx.Commit(ctx), "commit the large transaction")
	committed := time.Now()
	tl := checkWAL(t, fmt.Sprintf("one %d MB transaction (%d x 4 KiB), --max-buffered 1000 / 16MiB, WAL mode", n*size/1_000_000, n), o, l, col, committed, pick(3*time.Minute, 6*time.Minute), walCheck{})
	requireAlive(t, r)
	peak, err := peakRSS(r.cmd.Process.Pid)
	must(t, err, "the relay's peak RSS")
	once := 0
	for _, id := range big {
		if tl.counts[id] == 1 {
			once++
		}
	}
	if once != len(big) {
		t.Errorf("%d of the large transaction's %d messages delivered exactly once", once, len(big))
	}
	if peak >= bound {
		t.Errorf("the relay's peak RSS was %d MiB, want below %d MiB (the transaction is %d MiB)", peak>>20, bound>>20, n*size>>20)
	}
	finishRow(t, tl, l, fmt.Sprintf("relay peak RSS %d MiB (bound %d MiB); %d of the transaction's messages delivered exactly once", peak>>20, bound>>20, once))
	r.stop(t, 30*time.Second)
}

// A relay holds 10,000 messages behind a failing webhook long enough that
// they move to the outbox table, and is SIGKILLed; a second relay takes
// over and the webhook recovers while producers go on committing, so the new
// owner reads the table and the stream at once: every message is delivered,
// first copies in per-key order, and the outbox table ends empty.
func TestWALTakeoverSpilled(t *testing.T) {
	url, err := testdb.LogicalURL()
	must(t, err, "start a cluster with wal_level=logical")
	o := newWALOutbox(t, url)
	w := newWebhook(t)
	w.failing.Store(true)
	flags := []string{"--sink", w.sinkURL(), "--retry-backoff", "200ms", "--max-retry-backoff", "1s", "--max-attempts", "100000"}
	a := startRelay(t, o, "", "a", "", flags...)
	n := pick(10_000, 40_000)
	l := startLoad(t, o, nil, loadShape{txMax: 20, pause: 5 * time.Millisecond})
	// Held past the spill delay, they move to the table.
	var spilled int
	if !within(180*time.Second, func() bool {
		spilled = o.count(t, "outbox")
		return spilled >= n
	}) {
		t.Fatalf("%d held messages in the outbox table after 180s (%d committed), want %d", spilled, l.committed.Load(), n)
	}
	requireAlive(t, a)
	a.kill9(t)
	killed := l.committed.Load()
	b := startRelay(t, o, "", "b", "", flags...)
	w.failing.Store(false)
	cleared := time.Now()
	// Producers go on while the new owner takes the lanes over.
	if !within(60*time.Second, func() bool { return l.committed.Load() >= killed+int64(n/5) }) {
		t.Fatalf("only %d commits within 60s after the kill (last producer error: %v)", l.committed.Load()-killed, l.lastErr.Load())
	}
	tl := checkWAL(t, fmt.Sprintf("takeover after kill -9 with %d spilled rows, webhook failing then OK, WAL mode", spilled), o, l, w, cleared, 120*time.Second, walCheck{})
	finishRow(t, tl, l, fmt.Sprintf("%d rows in the table when relay A was killed; %d webhook requests refused", spilled, w.refused.Load()))
	b.stop(t, 30*time.Second)
}
