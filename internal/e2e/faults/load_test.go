//go:build faults

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
)

// loadShape describes the producers of a scenario.
type loadShape struct {
	producers int      // concurrent producer goroutines (default 3)
	topics    []string // default orders, users, audit
	keys      int      // keys per producer (default 8); each producer owns its keys
	hotKey    bool     // every message on one key, shared by all producers
	txMax     int      // messages per transaction: 1..txMax (default 5)
	rollback  int      // one transaction in `rollback` is rolled back (default 7; 0 = none)
	payload   int      // payload bytes (default ~100)
	poison    float64  // fraction of messages marked poison (the sink refuses them)
	pause     time.Duration
	limit     int // stop after this many committed messages (0 = until stopped)
	// track keeps the id of every message whose commit was attempted
	// (load.tried): after the database went back in time, the verifier
	// tells a message of the abandoned history from one nobody wrote.
	track bool
}

func (s *loadShape) defaults() {
	if s.producers == 0 {
		s.producers = 3
	}
	if len(s.topics) == 0 {
		s.topics = []string{"orders", "users", "audit"}
	}
	if s.keys == 0 {
		s.keys = 8
	}
	if s.txMax == 0 {
		s.txMax = 5
	}
	if s.rollback == 0 {
		s.rollback = 7
	}
	if s.payload == 0 {
		s.payload = 100
	}
	if s.pause == 0 {
		s.pause = 10 * time.Millisecond
	}
}

// load is a set of running producers. Each transaction takes an advisory
// lock on each of its keys (so seq order is commit order per key, as the
// README asks of applications), enqueues 1..txMax keyed messages and writes
// their seqs to the ledger; some transactions are rolled back on purpose.
// Errors (the database restarting, say) are counted and the producer
// carries on: whether an in-doubt commit happened is read from the ledger.
type load struct {
	o         *outbox
	shape     loadShape
	stopCh    chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	rolled    map[int64]int64 // seq → nonce of the rolled-back messages
	tried     map[msgID]bool  // with shape.track: every message whose commit was attempted
	committed atomic.Int64
	errors    atomic.Int64
	lastErr   atomic.Value
	stopOnce  sync.Once
}

// poisonMark is in the payload of every poison message.
const poisonMark = `"poison":true`

func startLoad(t *testing.T, o *outbox, pool *pgxpool.Pool, shape loadShape) *load {
	t.Helper()
	shape.defaults()
	l := &load{o: o, shape: shape, stopCh: make(chan struct{}), rolled: map[int64]int64{}, tried: map[msgID]bool{}}
	if pool == nil {
		pool = o.pool
	}
	for p := 0; p < shape.producers; p++ {
		l.wg.Add(1)
		go l.produce(pool, p)
	}
	t.Cleanup(l.stop)
	return l
}

// stop stops the producers and waits for them.
func (l *load) stop() {
	l.stopOnce.Do(func() { close(l.stopCh) })
	l.wg.Wait()
}

func (l *load) rolledBack() map[int64]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int64]int64, len(l.rolled))
	for k, v := range l.rolled {
		out[k] = v
	}
	return out
}

func (l *load) produce(pool *pgxpool.Pool, p int) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(p)+1, uint64(time.Now().UnixNano())))
	n := 0
	for tx := 0; ; tx++ {
		select {
		case <-l.stopCh:
			return
		default:
		}
		if l.shape.limit > 0 && l.committed.Load() >= int64(l.shape.limit) {
			return
		}
		size := 1 + rng.IntN(l.shape.txMax)
		msgs := make([]wharf.Message, size)
		poison := make([]bool, size)
		for i := range msgs {
			key := fmt.Sprintf("p%d-k%d", p, rng.IntN(l.shape.keys))
			if l.shape.hotKey {
				key = "hot"
			}
			poison[i] = l.shape.poison > 0 && rng.Float64() < l.shape.poison
			msgs[i] = wharf.Message{
				Topic:   l.shape.topics[rng.IntN(len(l.shape.topics))],
				Key:     key,
				Payload: l.payload(p, n, poison[i]),
			}
			n++
		}
		rollback := l.shape.rollback > 0 && tx%l.shape.rollback == l.shape.rollback-1
		if err := l.oneTx(pool, msgs, poison, rollback); err != nil {
			l.errors.Add(1)
			l.lastErr.Store(err.Error())
			select {
			case <-l.stopCh:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !rollback {
			l.committed.Add(int64(size))
		}
		if l.shape.pause > 0 {
			time.Sleep(l.shape.pause)
		}
	}
}

func (l *load) payload(p, n int, poison bool) []byte {
	mark := ""
	if poison {
		mark = poisonMark + ","
	}
	head := fmt.Sprintf(`{"p":%d,"n":%d,%s"pad":"`, p, n, mark)
	pad := l.shape.payload - len(head) - 2
	if pad < 0 {
		pad = 0
	}
	return []byte(head + strings.Repeat("x", pad) + `"}`)
}

func (l *load) oneTx(pool *pgxpool.Pool, msgs []wharf.Message, poison []bool, rollback bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	keys := map[string]bool{}
	for _, m := range msgs {
		keys[m.Key] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sortStrings(sorted)
	for _, k := range sorted { // one at a time, in one order: no deadlocks
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", k); err != nil {
			return err
		}
	}
	ids, err := l.o.client.EnqueueTx(ctx, tx, msgs...)
	if err != nil {
		return err
	}
	seqs := make([]int64, len(ids))
	nonces := make([]int64, len(ids))
	topics := make([]string, len(ids))
	ks := make([]string, len(ids))
	for i, id := range ids {
		if seqs[i], nonces[i], err = wharf.ParseID(id); err != nil {
			return err
		}
		topics[i], ks[i] = msgs[i].Topic, msgs[i].Key
	}
	if rollback {
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
		l.mu.Lock()
		for i, s := range seqs {
			l.rolled[s] = nonces[i]
		}
		l.mu.Unlock()
		return nil
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+l.o.schema+".fault_ledger (seq, topic, key, poison, nonce) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[], $5::bigint[])",
		seqs, topics, ks, poison, nonces); err != nil {
		return err
	}
	if l.shape.track {
		l.mu.Lock()
		for i, s := range seqs {
			l.tried[msgID{s, nonces[i]}] = true
		}
		l.mu.Unlock()
	}
	return tx.Commit(ctx)
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// triedIDs returns the ids of the messages whose commit was attempted
// (shape.track).
func (l *load) triedIDs() map[msgID]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[msgID]bool, len(l.tried))
	for k := range l.tried {
		out[k] = true
	}
	return out
}

// msgID is a message's id: its seq and the nonce that tells it from
// another message that got the same seq on another history.
type msgID struct{ seq, nonce int64 }

// ledgerRow is one committed message.
type ledgerRow struct {
	topic, key string
	poison     bool
	nonce      int64
}

// ledger reads which messages committed.
func (o *outbox) ledger(t *testing.T) map[int64]ledgerRow {
	t.Helper()
	var out map[int64]ledgerRow
	var lastErr error
	ok := within(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		m := map[int64]ledgerRow{}
		rows, err := o.pool.Query(ctx, "SELECT seq, topic, coalesce(key, ''), poison, nonce FROM "+o.schema+".fault_ledger")
		if err != nil {
			lastErr = err
			return false
		}
		defer rows.Close()
		for rows.Next() {
			var seq int64
			var r ledgerRow
			if err := rows.Scan(&seq, &r.topic, &r.key, &r.poison, &r.nonce); err != nil {
				lastErr = err
				return false
			}
			m[seq] = r
		}
		if err := rows.Err(); err != nil {
			lastErr = err
			return false
		}
		out = m
		return true
	})
	if !ok {
		t.Fatalf("reading the ledger: %v", lastErr)
	}
	return out
}
