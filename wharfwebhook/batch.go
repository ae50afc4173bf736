package wharfwebhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/envelope"
)

// chunk is one batch POST: messages of one topic.
type chunk struct {
	topic string
	idx   []int // message indices, ascending once packed
	deps  []int // earlier chunks holding earlier messages of an ordering key of this one
	done  chan struct{}
}

// pack groups the messages not skipped into chunks of at most size messages
// of one topic, so that every ordering key's messages go in chunks of
// increasing index and as few chunks as possible: a key whose run of
// messages of one topic fits in a chunk is not split. (An ordering key spans
// topics with Config.OrderAcrossTopics.)
func pack(msgs []*wharf.Message, skip []bool, size int) []*chunk {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.OrderingKey()
	}
	type segment struct {
		topic string
		idx   []int
	}
	type unit struct{ segs []segment }
	var units []*unit
	unitOf := map[string]*unit{}
	for i, m := range msgs {
		if skip[i] {
			continue
		}
		if keys[i] == "" {
			units = append(units, &unit{segs: []segment{{m.Topic, []int{i}}}})
			continue
		}
		u := unitOf[keys[i]]
		if u == nil {
			u = &unit{}
			unitOf[keys[i]] = u
			units = append(units, u)
		}
		if n := len(u.segs); n > 0 && u.segs[n-1].topic == m.Topic {
			u.segs[n-1].idx = append(u.segs[n-1].idx, i)
		} else {
			u.segs = append(u.segs, segment{m.Topic, []int{i}})
		}
	}
	var chunks []*chunk
	open := map[string][]int{} // topic -> chunks with room, ascending
	newChunk := func(topic string) int {
		chunks = append(chunks, &chunk{topic: topic, done: make(chan struct{})})
		c := len(chunks) - 1
		open[topic] = append(open[topic], c)
		return c
	}
	add := func(c int, idx []int) {
		ch := chunks[c]
		ch.idx = append(ch.idx, idx...)
		if len(ch.idx) >= size {
			open[ch.topic] = slices.DeleteFunc(open[ch.topic], func(x int) bool { return x == c })
		}
	}
	for _, u := range units {
		after := -1 // the chunk of the unit's latest message so far
		for _, sg := range u.segs {
			if len(sg.idx) <= size {
				c := -1
				for _, o := range open[sg.topic] {
					if o > after && len(chunks[o].idx)+len(sg.idx) <= size {
						c = o
						break
					}
				}
				if c < 0 {
					c = newChunk(sg.topic)
				}
				add(c, sg.idx)
				after = c
				continue
			}
			for rest := sg.idx; len(rest) > 0; {
				n := min(size, len(rest))
				c := newChunk(sg.topic)
				add(c, rest[:n])
				rest = rest[n:]
				after = c
			}
		}
	}
	last := map[string]int{}
	for c, ch := range chunks {
		slices.Sort(ch.idx)
		for _, i := range ch.idx {
			k := keys[i]
			if k == "" {
				continue
			}
			if p, ok := last[k]; ok && p != c && !slices.Contains(ch.deps, p) {
				ch.deps = append(ch.deps, p)
			}
			last[k] = c
		}
	}
	return chunks
}

// publishBatch sends the messages in chunks, a chunk once every earlier
// chunk sharing an ordering key with it is done.
func (s *Sink) publishBatch(ctx context.Context, res *results, msgs []*wharf.Message) {
	skip := make([]bool, len(msgs))
	for i, m := range msgs {
		if res.r.Blocked(i) {
			skip[i] = true
			continue
		}
		if err := s.checkTopic(m); err != nil {
			res.r.Fail(i, err)
			skip[i] = true
		}
	}
	chunks := pack(msgs, skip, s.opts.BatchSize)
	run(len(chunks), s.opts.Concurrency, func(c int) {
		ch := chunks[c]
		defer close(ch.done)
		// Every earlier chunk holding a key of this one is done: their
		// failures are in res, and take skips the keys they failed.
		for _, d := range ch.deps {
			<-chunks[d].done
		}
		send := make([]int, 0, len(ch.idx))
		for _, i := range ch.idx {
			if res.take(ctx, i) {
				send = append(send, i)
			}
		}
		if len(send) == 0 {
			return
		}
		err := s.sendBatch(ctx, ch.topic, msgs, send)
		for _, i := range send {
			res.set(i, err)
		}
	})
}

// batchBody encodes the messages idx of msgs as a JSON array of envelopes
// (the format of the stdout and file sinks' lines) with "created_at" and
// "attempt".
func batchBody(msgs []*wharf.Message, idx []int) ([]byte, error) {
	var e envelope.Encoder
	b := make([]byte, 0, 256*len(idx))
	b = append(b, '[')
	for j, i := range idx {
		if j > 0 {
			b = append(b, ',')
		}
		b = e.AppendMessage(b, msgs[i], envelope.Extra{CreatedAt: true, Attempt: true})
	}
	return append(b, ']'), nil
}

// batchID is the webhook-id of a batch POST: stable for the same messages.
func batchID(msgs []*wharf.Message, idx []int) string {
	h := sha256.New()
	var b []byte
	for _, i := range idx {
		b = append(append(b[:0], msgs[i].ID...), ',')
		h.Write(b)
	}
	return "batch_" + hex.EncodeToString(h.Sum(nil)[:16])
}

func (s *Sink) sendBatch(ctx context.Context, topic string, msgs []*wharf.Message, idx []int) error {
	what := fmt.Sprintf("batch of %d messages (ids %s to %s)", len(idx), msgs[idx[0]].ID, msgs[idx[len(idx)-1]].ID)
	ct := "application/json"
	var body []byte
	var err error
	if s.ce.On() {
		ct = cloudevents.BatchContentType
		batch := make([]*wharf.Message, len(idx))
		for j, i := range idx {
			batch[j] = msgs[i]
		}
		body, err = s.ce.AppendBatch(make([]byte, 0, 256*len(idx)), batch)
	} else {
		body, err = batchBody(msgs, idx)
	}
	if err != nil {
		return wharf.Permanent(fmt.Errorf("wharfwebhook: %s: cannot encode: %w", what, err))
	}
	h := make(http.Header, len(s.static)+6)
	for k, vs := range s.static {
		h[k] = vs
	}
	h.Set("Content-Type", ct)
	h.Set("User-Agent", userAgent)
	h.Set(HeaderTopic, topic)
	raw, shown := s.destination(topic)
	return s.post(ctx, what, raw, shown, h, batchID(msgs, idx), body)
}
