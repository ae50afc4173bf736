package wharfredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wharfhq/wharf"
)

// clientKinds are the two ways the sink wraps a key's XADDs: a *redis.Client
// gets one MULTI/EXEC per key with several messages in the batch; any other
// client (here a Ring of one shard) gets the whole batch in a go-redis
// TxPipeline, one MULTI/EXEC per shard.
var clientKinds = []struct {
	name string
	new  func(addr string) redis.UniversalClient
	// wholeBatch: the transaction holds every message of the batch.
	wholeBatch bool
}{
	{"client", func(addr string) redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}, false},
	{"ring", func(addr string) redis.UniversalClient {
		return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"s1": addr}, ContextTimeoutEnabled: true})
	}, true},
}

// oomSwitch turns Redis's OOM refusals on and off by moving maxmemory below
// and back above what the server uses.
type oomSwitch struct {
	t     *testing.T
	admin *redis.Client
}

func (o oomSwitch) set(on bool) {
	limit := "0" // no limit
	if on {
		limit = "1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := o.admin.ConfigSet(ctx, "maxmemory", limit).Err(); err != nil {
		o.t.Errorf("CONFIG SET maxmemory %s: %v", limit, err)
	}
}

func hasArg(cmd []string, arg string) bool { return slices.Contains(cmd, arg) }

// txWorld is a private redis-server behind a command proxy, and a sink on it
// through a client of the given kind.
func txWorld(t *testing.T, newClient func(addr string) redis.UniversalClient) (*cmdProxy, oomSwitch, *Sink, func(topic string) []string) {
	t.Helper()
	srv := startPrivateServer(t)
	admin := requireRedis(t, srv.url())
	p := startCmdProxy(t, srv.addr())
	client := newClient(p.addr)
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{StreamTemplate: "wharftest.{{topic}}", Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	stored := func(topic string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		entries, err := admin.XRange(ctx, "wharftest."+topic, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.Values[FieldID].(string))
		}
		return ids
	}
	return p, oomSwitch{t: t, admin: admin}, s, stored
}

func newMsgs(topic string, keys ...string) []*wharf.Message {
	var msgs []*wharf.Message
	for i, k := range keys {
		seq := int64(i + 1)
		msgs = append(msgs, &wharf.Message{ID: wharf.FormatID(seq, 7), Seq: seq, Topic: topic, Key: k, Payload: []byte(fmt.Sprint(i))})
	}
	return msgs
}

// Redis refuses the first XADD of key a (OOM) and takes the next ones once
// memory is back, all within one batch: a key's XADDs are one transaction,
// so none of them is applied and no later message of the key is stored
// without the earlier one. The other key and the unkeyed message are not
// held back by it (with a *redis.Client). The relay's retry then stores the
// key in order.
func TestKeyIsAllOrNothingWhenOOMClears(t *testing.T) {
	t.Parallel()
	for _, kind := range clientKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			p, oom, s, stored := txWorld(t, kind.new)
			msgs := newMsgs("t", "a", "a", "a", "b", "")
			a1, a2 := msgs[0], msgs[1]
			var mu sync.Mutex
			p.setHook(func(cmd []string) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case strings.EqualFold(cmd[0], "XADD") && hasArg(cmd, a1.ID):
					oom.set(true)
				case strings.EqualFold(cmd[0], "XADD") && hasArg(cmd, a2.ID):
					oom.set(false)
				}
			})
			errs := publish(t, s, msgs)
			p.setHook(nil)
			checkAllOrNothing(t, kind.wholeBatch, msgs, errs, stored("t"), "OOM")
			requireAcked(t, publish(t, s, msgs[:3]))
			if got := stored("t"); !slices.Equal(got[len(got)-3:], []string{msgs[0].ID, msgs[1].ID, msgs[2].ID}) {
				t.Fatalf("after the retry the stream holds %v, want a1, a2, a3 last", got)
			}
		})
	}
}

// Redis refuses EXEC itself (memory ran out after the XADDs were queued):
// the transaction is discarded whole.
func TestKeyIsAllOrNothingWhenExecRefused(t *testing.T) {
	t.Parallel()
	for _, kind := range clientKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			p, oom, s, stored := txWorld(t, kind.new)
			msgs := newMsgs("t", "a", "a", "a", "b", "")
			var mu sync.Mutex
			afterExec := false
			p.setHook(func(cmd []string) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case strings.EqualFold(cmd[0], "EXEC"):
					oom.set(true)
					afterExec = true
				case afterExec:
					oom.set(false)
					afterExec = false
				}
			})
			errs := publish(t, s, msgs)
			p.setHook(nil)
			oom.set(false)
			checkAllOrNothing(t, kind.wholeBatch, msgs, errs, stored("t"), "OOM")
		})
	}
}

// checkAllOrNothing checks that key a (the first three messages) failed
// whole, retryably, saying why, and left nothing in the stream; the others
// were stored, unless the transaction held the whole batch.
func checkAllOrNothing(t *testing.T, wholeBatch bool, msgs []*wharf.Message, errs []error, got []string, why string) {
	t.Helper()
	t.Logf("results: %v; stream: %v", errs, got)
	failed := 3
	if wholeBatch {
		failed = len(msgs)
	}
	if len(errs) != len(msgs) {
		t.Fatalf("results %v: want one per message", errs)
	}
	for i, err := range errs {
		if i >= failed {
			if err != nil {
				t.Fatalf("message %d, outside key a's transaction: %v", i, err)
			}
			continue
		}
		if err == nil || wharf.IsPermanent(err) || errors.Is(err, wharf.ErrNotAttempted) {
			t.Fatalf("message %d: %v: want a retryable error", i, err)
		}
		if !strings.Contains(err.Error(), why) {
			t.Fatalf("message %d: %v: want it to say %s", i, err, why)
		}
	}
	for _, m := range msgs[:failed] {
		if slices.Contains(got, m.ID) {
			t.Fatalf("the stream holds %s of a failed transaction: %v", m.ID, got)
		}
	}
	if len(got) != len(msgs)-failed {
		t.Fatalf("the stream holds %v, want the %d messages outside the transaction", got, len(msgs)-failed)
	}
}

// What MULTI/EXEC does not cover: an error Redis raises while executing one
// command of a transaction (WRONGTYPE) does not undo the others. A key's
// messages of one topic all go to one stream, so they fail together (see
// TestWrongTypeIsRetryable); this pins down the server's behaviour the
// documentation describes for a key whose messages span streams.
func TestExecDoesNotUndoRuntimeErrors(t *testing.T) {
	t.Parallel()
	admin := requireRedis(t, sharedURL())
	prefix := "wharftest:" + randomID() + "."
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	t.Cleanup(func() { _ = admin.Del(context.Background(), prefix+"s", prefix+"str").Err() })
	if err := admin.Set(ctx, prefix+"str", "x", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	pipe := admin.TxPipeline()
	first := pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "s", Values: []any{"n", 1}})
	wrong := pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "str", Values: []any{"n", 2}})
	third := pipe.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "s", Values: []any{"n", 3}})
	_, _ = pipe.Exec(ctx)
	if first.Err() != nil || third.Err() != nil || !redis.HasErrorPrefix(wrong.Err(), "WRONGTYPE") {
		t.Fatalf("results %v, %v, %v: want the XADD to the string alone to fail", first.Err(), wrong.Err(), third.Err())
	}
	if n, err := admin.XLen(ctx, prefix+"s").Result(); err != nil || n != 2 {
		t.Fatalf("the stream holds %d entries (%v), want 2", n, err)
	}
}

// A batch with many keys, several messages each, some unkeyed, through both
// client kinds: every message is stored once, each key in order.
func TestTransactionsKeepOrder(t *testing.T) {
	t.Parallel()
	for _, kind := range clientKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			o, err := redis.ParseURL(sharedURL())
			if err != nil {
				t.Fatal(err)
			}
			requireRedis(t, sharedURL())
			client := kind.new(o.Addr)
			t.Cleanup(func() { _ = client.Close() })
			w := &world{admin: requireRedis(t, sharedURL()), prefix: "wharftest:" + randomID()}
			t.Cleanup(func() { w.deleteStreams(t) })
			s, err := New(client, Options{StreamTemplate: w.prefix + ".{{topic}}"})
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for i := range 500 {
				k := fmt.Sprintf("k%d", i%17)
				if i%9 == 0 {
					k = ""
				}
				keys = append(keys, k)
			}
			msgs := newMsgs("t", keys...)
			requireAcked(t, publish(t, s, msgs))
			ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
			defer cancel()
			got, err := w.read(ctx, "t")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(msgs) {
				t.Fatalf("the stream holds %d entries, want %d", len(got), len(msgs))
			}
			last := map[string]int64{}
			for _, r := range got {
				seq, _, _ := wharf.ParseID(r.ID)
				if r.Key != "" && seq <= last[r.Key] {
					t.Fatalf("key %s: seq %d after %d", r.Key, seq, last[r.Key])
				}
				last[r.Key] = seq
			}
		})
	}
}

// Publish honours its context: cancelled before, it sends nothing; ended
// while Redis holds the pipeline, it returns at once. Either way every
// message fails with a retryable error naming the context's end and its
// cause.
func TestPublishHonoursContext(t *testing.T) {
	t.Parallel()
	o, err := redis.ParseURL(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{admin: requireRedis(t, sharedURL()), prefix: "wharftest:" + randomID()}
	t.Cleanup(func() { w.deleteStreams(t) })
	p := startCmdProxy(t, o.Addr)
	client := redis.NewClient(&redis.Options{Addr: p.addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{StreamTemplate: w.prefix + ".{{topic}}", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	requireAcked(t, publish(t, s, newMsgs("warm-up", "k"))) // a connection in the pool
	cause := errors.New("the lease of lane 7 was lost")
	check := func(what string, errs []error, want error) {
		t.Helper()
		if len(errs) != 3 {
			t.Fatalf("%s: results %v: want one error per message", what, errs)
		}
		for i, err := range errs {
			if err == nil || wharf.IsPermanent(err) || !errors.Is(err, want) || !strings.Contains(err.Error(), cause.Error()) {
				t.Fatalf("%s: message %d: %v: want a retryable error wrapping %v and naming the cause", what, i, err, want)
			}
		}
	}
	var mu sync.Mutex
	xadds := 0
	release := make(chan struct{})
	p.setHook(func(cmd []string) {
		if strings.EqualFold(cmd[0], "XADD") {
			mu.Lock()
			xadds++
			mu.Unlock()
			<-release // a server that takes its time
		}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	check("cancelled before", s.Publish(ctx, newMsgs("t", "a", "a", "")), context.Canceled)
	mu.Lock()
	if xadds != 0 {
		t.Fatalf("with a cancelled context %d XADDs reached Redis", xadds)
	}
	mu.Unlock()

	ctx, cancel = context.WithCancelCause(context.Background())
	time.AfterFunc(200*time.Millisecond, func() { cancel(cause) })
	start := time.Now()
	errs := s.Publish(ctx, newMsgs("t", "a", "a", ""))
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Publish took %s after its context was cancelled at 200ms", took)
	}
	check("cancelled while Redis holds the pipeline", errs, context.Canceled)
	t.Logf("cancelled: %v", errs[0])
	close(release)
}
