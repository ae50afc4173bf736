package wharf

import (
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wharfhq/wharf/internal/store"
)

// msg is a loaded message: in memory with its payload.
type msg struct {
	Message
	lane     *laneState
	kq       *keyQ      // nil for unkeyed messages
	due      time.Time  // local clock
	attempts int        // failed attempts so far
	size     int64      // payload bytes, as counted in the memory budget
	atSink   bool       // in a batch handed to a sink
	dead     bool       // its dead-letter move is being written
	at       pgtype.TID // where the table store read it (store.Row.At)
	nonce    int64      // the id's random part (store.Op.Nonce)
}

// keyQ is one ordering key of a lane. Its messages, in seq order, are the
// loaded ones (msgs) merged with positions only (stubs): a key whose head must
// wait longer than keepLoadedFor (a retry backoff, a deliver_at in the
// future) keeps only the positions of its messages, so a held key costs 8
// bytes per message however many queue behind it and never fills the memory
// budget other keys need. Rows at or
// past truncFrom are not even recorded (a key with more held messages than
// maxStubs allows); they are read again with a range refill.
type keyQ struct {
	key       string // the ordering key
	lane      *laneState
	msgs      []*msg  // loaded, sorted by seq
	stubs     []int64 // positions only, sorted
	truncFrom int64   // 0, or: rows with seq >= truncFrom are not in memory
	rawKey    string  // Message.Key, for refills
	topic     string  // Message.Topic, for refills when the scope has it
	// running: a run of this key is at a sink. deadPending: dead-letter
	// moves of this key are being written. Either holds the key.
	running     bool
	deadPending int
	scheduled   bool // an entry for gen is in the ready queue or the timer heap
	gen         uint64
	loading     bool      // a load or refill of this key is in flight
	touched     bool      // listed by onSink for the batch it is settling
	holdUntil   time.Time // held until then (local clock); positions only if msgs is empty
	holdRetry   bool      // the held head is waiting for a retry
	heldCreated time.Time // when the held head became due (dueSince)
}

// heldMsg is an unkeyed message kept as a position until it is due.
type heldMsg struct {
	seq     int64
	due     time.Time
	retry   bool
	created time.Time // when it became due (dueSince)
}

func (kq *keyQ) minStub() int64 {
	if len(kq.stubs) == 0 {
		return 1<<63 - 1
	}
	return kq.stubs[0]
}

func (kq *keyQ) hasMore() bool { return len(kq.stubs) > 0 || kq.truncFrom > 0 }

func (kq *keyQ) empty() bool { return len(kq.msgs) == 0 && !kq.hasMore() }

// load counts m in the memory budget.
func (r *relay) load(m *msg) {
	m.size = int64(len(m.Payload))
	l := m.lane
	l.mem.msgs++
	l.mem.bytes += m.size
	r.mem.msgs++
	r.mem.bytes += m.size
}

func (r *relay) publishMem() {
	r.stats.Buffered.Store(int64(r.mem.msgs))
	r.stats.BufferedBytes.Store(r.mem.bytes)
}

// unload takes m out of the memory budget.
func (r *relay) unload(m *msg) {
	l := m.lane
	if l.dropped {
		return
	}
	l.mem.msgs--
	l.mem.bytes -= m.size
	r.mem.msgs--
	r.mem.bytes -= m.size
}

// newMsg turns a row into a message of ordering key okey ("" for unkeyed),
// with its attempts and due time.
func (r *relay) newMsg(l *laneState, row *store.Row, okey string) *msg {
	m := &msg{Message: Message{
		ID: FormatID(row.Seq, row.Nonce), Seq: row.Seq, Topic: row.Topic, Key: row.Key, Payload: row.Payload,
		Headers: row.Headers, DeliverAt: row.DeliverAt, CreatedAt: row.CreatedAt,
	}, lane: l, at: row.At, nonce: row.Nonce}
	m.orderKey = okey
	if ri, ok := l.retries[m.Seq]; ok {
		delete(l.retries, m.Seq) // hold keeps it again if the message waits
		// A record is one message's: one of another message that had this
		// seq (a database put back in time hands seqs out again, and a
		// relay of the old history may have written a failure late) is
		// not this one's attempts or backoff. Its first failure replaces it.
		if ri.Of(row.Nonce) {
			m.attempts = ri.Attempts
			m.due = r.toLocal(ri.Next)
		}
	}
	if !m.DeliverAt.IsZero() {
		if at := r.toLocal(m.DeliverAt); at.After(m.due) {
			m.due = at
		}
	}
	return m
}

// insert adds a row the fetch (or a load) returned.
func (r *relay) insert(l *laneState, row *store.Row, now time.Time, loaded bool) {
	if row.Key == "" {
		if !loaded && (l.held[row.Seq] != nil || l.unkeyed[row.Seq] != nil) {
			r.reread(l, row, now)
		}
		r.insertUnkeyed(l, r.newMsg(l, row, ""), now)
		return
	}
	ok := orderingKey(row.Topic, row.Key, r.cfg.OrderAcrossTopics)
	kq := l.keys[ok]
	if kq == nil {
		kq = &keyQ{key: ok, lane: l, rawKey: row.Key}
		if !r.cfg.OrderAcrossTopics {
			kq.topic = row.Topic
		}
		l.keys[ok] = kq
	}
	seq := row.Seq
	if i, found := kq.find(seq); found {
		// Read again: a copy the relay already holds (a late commit read
		// twice), or the row was rescheduled (deleted and inserted again
		// with the same seq). The new copy wins unless the old one is at
		// a sink or being dead-lettered.
		old := kq.msgs[i]
		if old.atSink || old.dead {
			return
		}
		if old.attempts > 0 {
			l.retries[seq] = store.RetryInfo{Attempts: old.attempts, Nonce: old.nonce}
			r.reread(l, row, now)
		}
		m := r.newMsg(l, row, ok)
		m.kq = kq
		r.unload(old)
		r.load(m)
		kq.msgs[i] = m
		if i == 0 {
			r.rekick(kq, now)
		}
		return
	}
	if j := sort.Search(len(kq.stubs), func(j int) bool { return kq.stubs[j] >= seq }); j < len(kq.stubs) && kq.stubs[j] == seq {
		if !loaded {
			// A position already recorded: its load reads the row. But the
			// row was written again (rescheduled): its new time counts.
			due := r.reread(l, row, now)
			if j == 0 && (len(kq.msgs) == 0 || kq.msgs[0].Seq > seq) && !kq.running && kq.deadPending == 0 {
				kq.gen++
				kq.scheduled = false
				kq.holdUntil = due
				r.kick(kq, now)
			}
			return
		}
	}
	if kq.truncFrom > 0 && seq >= kq.truncFrom {
		return // its refill reads it
	}
	n := len(kq.msgs)
	if !loaded && (seq > kq.minStub() || (n >= r.perKeyCap && seq > kq.msgs[n-1].Seq) || (n == 0 && kq.holdUntil.After(now))) {
		r.addStub(kq, seq)
		r.kick(kq, now)
		return
	}
	m := r.newMsg(l, row, ok)
	m.kq = kq
	r.load(m)
	if n == 0 || kq.msgs[n-1].Seq < seq {
		kq.msgs = append(kq.msgs, m)
		if n == 0 {
			r.rekick(kq, now)
			return
		}
	} else {
		// A late commit below seqs already buffered: keep seq order.
		i := sort.Search(n, func(i int) bool { return kq.msgs[i].Seq > seq })
		kq.msgs = append(kq.msgs, nil)
		copy(kq.msgs[i+1:], kq.msgs[i:])
		kq.msgs[i] = m
		if i == 0 {
			r.rekick(kq, now)
			return
		}
	}
	r.kick(kq, now)
}

func (kq *keyQ) find(seq int64) (int, bool) {
	i := sort.Search(len(kq.msgs), func(i int) bool { return kq.msgs[i].Seq >= seq })
	return i, i < len(kq.msgs) && kq.msgs[i].Seq == seq
}

// reread handles a row read again with a seq the relay already holds: the
// row was deleted and inserted again (rescheduled, see
// Client.RescheduleMessages), so its deliver_at replaces the time the
// relay's own retry backoff had set; the attempts are kept. It returns when
// the message is due.
func (r *relay) reread(l *laneState, row *store.Row, now time.Time) time.Time {
	due := now
	if at := r.toLocal(row.DeliverAt); !row.DeliverAt.IsZero() && at.After(due) {
		due = at
	}
	if ri, ok := l.retries[row.Seq]; ok && ri.Of(row.Nonce) {
		ri.Next = r.toDB(due)
		l.retries[row.Seq] = ri
	}
	return due
}

// rekick re-evaluates a key whose head changed: an entry scheduled for the
// old head (in the timer heap, for a later time) no longer applies.
func (r *relay) rekick(kq *keyQ, now time.Time) {
	if !kq.running && kq.deadPending == 0 {
		kq.gen++
		kq.scheduled = false
		kq.holdUntil = time.Time{}
	}
	r.kick(kq, now)
}

func (r *relay) addStub(kq *keyQ, seq int64) {
	n := len(kq.stubs)
	if n == 0 || kq.stubs[n-1] < seq {
		if r.stubs >= r.maxStubs && n > 0 {
			// Too many positions held in all: stop recording this key's;
			// a range refill reads them when the key gets there.
			kq.truncFrom = seq
			return
		}
		kq.stubs = append(kq.stubs, seq)
	} else {
		j := sort.Search(n, func(j int) bool { return kq.stubs[j] >= seq })
		if kq.stubs[j] == seq {
			return
		}
		kq.stubs = append(kq.stubs, 0)
		copy(kq.stubs[j+1:], kq.stubs[j:])
		kq.stubs[j] = seq
	}
	r.stubs++
}

// kick puts a key whose head may be deliverable into the ready queue; holds
// it (positions only) until its head is due; or asks for its next messages
// to be loaded.
func (r *relay) kick(kq *keyQ, now time.Time) {
	l := kq.lane
	if kq.running || kq.deadPending > 0 || kq.scheduled || l.releasing || l.dropped || r.stopping {
		return
	}
	if len(kq.msgs) == 0 || kq.minStub() < kq.msgs[0].Seq {
		if !kq.hasMore() {
			return
		}
		if kq.holdUntil.After(now) {
			kq.scheduled = true
			r.schedule(readyItem{kq: kq, gen: kq.gen}, kq.holdUntil, now)
			return
		}
		r.requestLoad(kq)
		return
	}
	head := kq.msgs[0]
	if head.due.After(now) {
		if r.keepLoaded(head.due.Sub(now)) {
			kq.holdUntil = head.due
			kq.holdRetry = head.attempts > 0
			kq.heldCreated = dueSince(&head.Message)
		} else {
			r.hold(kq, head.due)
		}
		kq.scheduled = true
		r.schedule(readyItem{kq: kq, gen: kq.gen}, kq.holdUntil, now)
		return
	}
	kq.scheduled = true
	r.ready = append(r.ready, readyItem{kq: kq, gen: kq.gen})
	if len(kq.msgs) < r.perKeyCap/2 && kq.hasMore() {
		r.requestLoad(kq) // the next messages arrive while this run is out
	}
}

// keepLoadedFor is the longest wait for which a held key keeps its loaded
// messages: dropping them to positions costs a read of every one of them
// when the wait ends, which a short retry backoff would pay again and again.
const keepLoadedFor = time.Second

// keepLoaded reports whether a key whose head waits d keeps its loaded
// messages: a short wait, while at least half of the memory budget is free,
// so keys waiting briefly never keep the fetch from reading other keys.
func (r *relay) keepLoaded(d time.Duration) bool {
	return d <= keepLoadedFor && r.mem.msgs <= r.cfg.MaxBuffered/2 && r.mem.bytes <= r.cfg.MaxBufferedBytes/2
}

// hold turns the key's loaded messages into positions until its head is due.
func (r *relay) hold(kq *keyQ, until time.Time) {
	l := kq.lane
	kq.holdUntil = until
	kq.holdRetry = kq.msgs[0].attempts > 0
	kq.heldCreated = dueSince(&kq.msgs[0].Message)
	stubs := make([]int64, 0, len(kq.msgs)+len(kq.stubs))
	for _, m := range kq.msgs {
		if m.attempts > 0 {
			l.retries[m.Seq] = store.RetryInfo{Attempts: m.attempts, Next: r.toDB(m.due), Nonce: m.nonce}
		}
		stubs = append(stubs, m.Seq)
		r.unload(m)
	}
	r.stubs += len(kq.msgs)
	clear(kq.msgs)
	kq.msgs = kq.msgs[:0]
	kq.stubs = mergeSorted(stubs, kq.stubs)
	r.publishMem()
}

func mergeSorted(a, b []int64) []int64 {
	if len(b) == 0 {
		return a
	}
	out := make([]int64, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i] < b[j] {
			out = append(out, a[i])
			i++
		} else {
			out = append(out, b[j])
			j++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// requestLoad asks the next fetch to read the key's first positions again
// (or, past them, the rows of a truncated key).
func (r *relay) requestLoad(kq *keyQ) {
	l := kq.lane
	if kq.loading || l.releasing || l.dropped || r.stopping {
		return
	}
	kq.loading = true
	r.fetch.want = true
	if len(kq.stubs) > 0 {
		n := min(len(kq.stubs), r.perKeyCap)
		r.loads = append(r.loads, store.LoadReq{Lane: l.id, Fence: l.fence, Key: kq.key, Seqs: append([]int64(nil), kq.stubs[:n]...)})
		return
	}
	r.refills = append(r.refills, store.RefillReq{Lane: l.id, Fence: l.fence, Key: kq.key, MsgKey: kq.rawKey, Topic: kq.topic, From: kq.truncFrom})
}

// insertUnkeyed adds an unkeyed message: loaded when it is due, a position in
// the timer heap otherwise.
func (r *relay) insertUnkeyed(l *laneState, m *msg, now time.Time) {
	if old := l.unkeyed[m.Seq]; old != nil {
		if old.atSink || old.dead {
			return
		}
		r.unload(old)
		delete(l.unkeyed, m.Seq) // its ready entry no longer matches
	}
	delete(l.held, m.Seq)
	if m.due.After(now) {
		if m.attempts > 0 {
			l.retries[m.Seq] = store.RetryInfo{Attempts: m.attempts, Next: r.toDB(m.due), Nonce: m.nonce}
		}
		h := &heldMsg{seq: m.Seq, due: m.due, retry: m.attempts > 0, created: dueSince(&m.Message)}
		l.held[m.Seq] = h
		r.schedule(readyItem{lane: l, held: h}, m.due, now)
		return
	}
	l.unkeyed[m.Seq] = m
	r.load(m)
	r.ready = append(r.ready, readyItem{m: m})
}

// applyLoads puts back the messages the fetch read again by position. It runs
// before the round's forward rows.
func (r *relay) applyLoads(res store.FetchResult, now time.Time) {
	type pos struct {
		lane int16
		seq  int64
	}
	rows := make(map[pos]*store.Row, len(res.LoadRows))
	for i := range res.LoadRows {
		row := &res.LoadRows[i]
		rows[pos{row.Lane, row.Seq}] = row
	}
	for _, req := range res.Req.Loads {
		r.loading--
		l := r.lanes[req.Lane]
		if l == nil || l.fence != req.Fence || l.releasing {
			continue
		}
		if req.Key == "" {
			seq := req.Seqs[0]
			h := l.held[seq]
			delete(l.held, seq)
			if row := rows[pos{req.Lane, seq}]; row != nil {
				r.insertUnkeyed(l, r.newMsg(l, row, ""), now)
			} else if h != nil {
				delete(l.retries, seq) // gone from the outbox: cancelled
			}
			continue
		}
		kq := l.keys[req.Key]
		if kq == nil {
			continue
		}
		kq.loading = false
		want := make(map[int64]bool, len(req.Seqs))
		for _, s := range req.Seqs {
			want[s] = true
		}
		kept := kq.stubs[:0]
		for _, s := range kq.stubs {
			if !want[s] {
				kept = append(kept, s)
			}
		}
		r.stubs -= len(kq.stubs) - len(kept)
		kq.stubs = kept
		// A key held again since the load was asked for keeps them as
		// positions.
		loaded := !kq.holdUntil.After(now)
		for _, s := range req.Seqs {
			if row := rows[pos{req.Lane, s}]; row != nil {
				r.insert(l, row, now, loaded)
			} else {
				delete(l.retries, s) // gone from the outbox: cancelled
			}
		}
		r.settle(kq, now)
	}
}

// applyRefills inserts the rows read again for truncated keys. It runs
// before the round's forward rows, so a key whose refill came back short is no
// longer truncated when its newer rows are inserted.
func (r *relay) applyRefills(res store.FetchResult, now time.Time) {
	type rk struct {
		lane int16
		key  string
	}
	byKey := map[rk][]*store.Row{}
	for i := range res.RefillRows {
		row := &res.RefillRows[i]
		k := rk{row.Lane, orderingKey(row.Topic, row.Key, r.cfg.OrderAcrossTopics)}
		byKey[k] = append(byKey[k], row)
	}
	for _, rf := range res.Req.Refills {
		r.loading--
		l := r.lanes[rf.Lane]
		if l == nil || l.fence != rf.Fence || l.releasing {
			continue
		}
		kq := l.keys[rf.Key]
		if kq == nil {
			continue
		}
		kq.loading = false
		rows := byKey[rk{rf.Lane, rf.Key}]
		r.log.Debug("wharf: refill returned", "lane", rf.Lane, "rows", len(rows))
		if len(rows) >= res.Req.RefillLimit {
			kq.truncFrom = rows[len(rows)-1].Seq + 1
		} else {
			kq.truncFrom = 0
		}
		loaded := !kq.holdUntil.After(now)
		for _, row := range rows {
			r.insert(l, row, now, loaded)
		}
		r.settle(kq, now)
	}
}

// settle forgets an emptied key queue or makes its next message deliverable.
func (r *relay) settle(kq *keyQ, now time.Time) {
	l := kq.lane
	if kq.empty() && !kq.running && kq.deadPending == 0 && !kq.loading {
		if l.keys[kq.key] == kq {
			delete(l.keys, kq.key)
		}
		return
	}
	r.kick(kq, now)
}

func (kq *keyQ) remove(m *msg) {
	for i, x := range kq.msgs {
		if x == m {
			copy(kq.msgs[i:], kq.msgs[i+1:])
			kq.msgs[len(kq.msgs)-1] = nil
			kq.msgs = kq.msgs[:len(kq.msgs)-1]
			return
		}
	}
}

// dueSince is when a message became due: its DeliverAt when it had one that
// is later than its enqueue, otherwise its enqueue. The oldest due message's
// age counts from it, so a message scheduled for tomorrow is not a day late
// the moment it is due.
func dueSince(m *Message) time.Time {
	if m.DeliverAt.After(m.CreatedAt) {
		return m.DeliverAt
	}
	return m.CreatedAt
}
