package wharfsqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
)

// Message attributes the sinks add to every message.
const (
	// AttrID carries [wharf.Message.ID] (also the deduplication id on FIFO
	// queues and topics).
	AttrID = "wharf-id"
	// AttrTopic carries the wharf topic.
	AttrTopic = "wharf-topic"
	// AttrKey carries [wharf.Message.Key] (absent for a message without one).
	AttrKey = "wharf-key"
)

const (
	// maxEntries is the most entries SendMessageBatch and PublishBatch take.
	maxEntries = 10
	// maxAttributes is the most message attributes SQS and SNS take.
	maxAttributes = 10
	// defaultMaxBytes is the classic SQS and SNS message size limit (and the
	// limit of one batch request's messages together).
	defaultMaxBytes = 256 << 10
	// maxGroupID is the longest message group id SQS and SNS take.
	maxGroupID = 128
	// parallelRequests bounds the requests of one Publish in flight.
	parallelRequests = 8
	// lanesPerDestination is how many requests to one queue or topic a
	// Publish has in flight at most (each for other keys).
	lanesPerDestination = 4
)

// Body says how a payload becomes the message body.
type Body int

const (
	// BodyRaw sends the payload as it is: it must be UTF-8 text of the
	// characters SQS allows (JSON is).
	BodyRaw Body = iota
	// BodyBase64 sends the payload in standard base64, for binary payloads.
	BodyBase64
)

func (b Body) String() string {
	if b == BodyBase64 {
		return "base64"
	}
	return "raw"
}

// entry is one message ready to go into a batch request.
type entry struct {
	idx   int // in the Publish call's msgs
	body  string
	attrs map[string]string // String attributes
	group string            // message group id (FIFO only)
	dedup string            // deduplication id (FIFO only)
	size  int               // as SQS and SNS count it
}

// The CloudEvents bindings of SQS and SNS, which have no official one:
// message attributes ce-<name>, datacontenttype as ce-datacontenttype since
// a message has no content type of its own.
var (
	bindingSQS = cloudevents.Binding{Name: "SQS", Prefix: "ce-", ContentTypeAttr: true}
	bindingSNS = cloudevents.Binding{Name: "SNS", Prefix: "ce-", ContentTypeAttr: true}
)

// AttrContentType is the message attribute that marks a structured-mode
// CloudEvent: its value is application/cloudevents+json; charset=UTF-8.
const AttrContentType = "content-type"

// encoder turns a wharf message into an entry for SQS or SNS.
type encoder struct {
	body     Body
	maxBytes int
	what     string // "SQS" or "SNS", for errors
	ce       cloudevents.Config
	binding  cloudevents.Binding
}

// isTraceHeader reports whether a header is one the CloudEvents
// distributed-tracing extension carries in binary mode.
func isTraceHeader(k string) bool {
	return strings.EqualFold(k, "traceparent") || strings.EqualFold(k, "tracestate")
}

// encode builds m's entry; a message the destination cannot take fails
// permanently here, before anything is sent.
func (e encoder) encode(m *wharf.Message, idx int, fifo bool) (*entry, error) {
	en := &entry{idx: idx, attrs: make(map[string]string, len(m.Headers)+3)}
	payload := m.Payload
	var ce cloudevents.Encoded
	if e.ce.On() {
		var err error
		if ce, err = e.ce.Encode(m, e.binding); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfsqs: %w", err))
		}
		payload = ce.Body
	}
	switch e.body {
	case BodyBase64:
		en.body = base64.StdEncoding.EncodeToString(payload)
	default:
		if err := checkText(string(payload)); err != nil {
			if e.ce.Mode == cloudevents.Structured {
				return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: its JSON event cannot be an %s message body: %w", m.ID, e.what, err))
			}
			return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: the payload cannot be an %s message body: %w; open the sink with body=base64 for binary payloads", m.ID, e.what, err))
		}
		en.body = string(payload)
	}
	if en.body == "" {
		return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: empty payload: %s takes no empty message body", m.ID, e.what))
	}
	binaryCE := e.ce.Mode == cloudevents.Binary
	for k, v := range m.Headers {
		// The event carries the content type (and, in binary mode, the
		// trace context) itself; attribute headers are the encoding's.
		if e.ce.On() && (ce.Replaces(k) || (binaryCE && isTraceHeader(k))) {
			continue
		}
		if isReserved(k) {
			return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: header %q is refused: the sink sets the attributes %s, %s and %s itself; rename it", m.ID, k, AttrID, AttrTopic, AttrKey))
		}
		if err := checkAttribute(k, v); err != nil {
			return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: %w", m.ID, err))
		}
		en.attrs[k] = v
	}
	if binaryCE {
		// ce-id, ce-type and ce-subject carry the message id, topic and
		// key: the wharf- attributes would only repeat them.
		for _, a := range ce.Headers {
			if err := checkText(a.Value); err != nil {
				return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: its CloudEvents %s attribute cannot be a message attribute: %w", m.ID, a.Name, err))
			}
			en.attrs[a.Name] = a.Value
		}
	} else {
		en.attrs[AttrID] = m.ID
		en.attrs[AttrTopic] = m.Topic
		if m.Key != "" {
			if err := checkText(m.Key); err != nil {
				return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: the key cannot be a message attribute: %w", m.ID, err))
			}
			en.attrs[AttrKey] = m.Key
		}
		if err := checkText(m.Topic); err != nil || m.Topic == "" {
			return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: the topic %q cannot be a message attribute", m.ID, m.Topic))
		}
		if e.ce.Mode == cloudevents.Structured {
			en.attrs[AttrContentType] = ce.ContentType
		}
	}
	if len(en.attrs) > maxAttributes {
		return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: %d headers plus the sink's %d attributes exceed %s's %d message attributes", m.ID, len(m.Headers), len(en.attrs)-len(m.Headers), e.what, maxAttributes))
	}
	en.size = len(en.body)
	for k, v := range en.attrs {
		en.size += len(k) + len("String") + len(v)
	}
	if en.size > e.maxBytes {
		return nil, wharf.Permanent(fmt.Errorf("wharfsqs: message %s: %d bytes (body %d, as %s, plus attributes) exceed the limit of %d bytes (max_message_bytes)", m.ID, en.size, len(en.body), e.body, e.maxBytes))
	}
	if fifo {
		en.group = groupID(m)
		en.dedup = m.ID
	}
	return en, nil
}

// groupID is the message group id of m on a FIFO queue or topic: the key,
// which with the destination (one per topic unless a template without
// {{topic}} merges them) is the ordering scope; a key SQS cannot take as
// a group id is hashed. An unkeyed message has no order to keep: its own
// id spreads such messages over groups.
func groupID(m *wharf.Message) string {
	if m.Key == "" {
		return m.ID
	}
	if len(m.Key) <= maxGroupID && isGroupText(m.Key) {
		return m.Key
	}
	sum := sha256.Sum256([]byte(m.Key))
	return "wharf-sha256-" + hex.EncodeToString(sum[:])
}

// isGroupText reports whether s has only the characters a group id may
// have: ASCII letters, digits and punctuation.
func isGroupText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

func isReserved(name string) bool {
	return strings.EqualFold(name, AttrID) || strings.EqualFold(name, AttrTopic) || strings.EqualFold(name, AttrKey)
}

// checkText accepts what SQS accepts in a body or an attribute value: UTF-8
// of #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD and #x10000-#x10FFFF.
func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for i, r := range s {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF:
		case r >= 0xE000 && r <= 0xFFFD:
		case r >= 0x10000 && r <= 0x10FFFF:
		default:
			return fmt.Errorf("character %U at byte %d is not allowed", r, i)
		}
	}
	return nil
}

// checkAttribute accepts a header as an SQS or SNS message attribute: a
// name of letters, digits, '-', '_' and '.' (not at either end, never two
// in a row, not starting with "AWS." or "Amazon."), of at most 256
// characters, and a non-empty value.
func checkAttribute(k, v string) error {
	if k == "" || len(k) > 256 {
		return fmt.Errorf("header name %q: an attribute name has 1 to 256 characters", k)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("header name %q: an attribute name has only letters, digits, '-', '_' and '.'", k)
		}
	}
	lower := strings.ToLower(k)
	if k[0] == '.' || k[len(k)-1] == '.' || strings.Contains(k, "..") || strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon.") {
		return fmt.Errorf("header name %q: an attribute name neither starts nor ends with '.', has no \"..\" and does not start with \"AWS.\" or \"Amazon.\"", k)
	}
	if v == "" {
		return fmt.Errorf("header %q has an empty value, which a message attribute cannot have", k)
	}
	if err := checkText(v); err != nil {
		return fmt.Errorf("header %q: its value cannot be a message attribute: %w", k, err)
	}
	return nil
}

// sendBatch sends entries to one destination in one request. It returns
// either an error for the whole request or one result per entry (nil when
// the destination took it).
type sendBatch func(ctx context.Context, dest string, entries []*entry) ([]error, error)

// batcher publishes the messages of one Publish call: it groups them by
// destination, sends each destination's messages in order in requests of at
// most maxEntries entries and maxBytes bytes, and maps each entry's result
// back to its message.
type batcher struct {
	enc    encoder
	strict bool // at most one message of an ordering key per request
	send   sendBatch
	what   string // "queue" or "topic", for errors
}

// target is a message's destination, resolved by the sink.
type target struct {
	dest string // queue URL or topic ARN
	name string // as the user knows it, for errors
	fifo bool
}

// publish delivers msgs; resolve names each message's destination (an error
// fails the message).
func (b *batcher) publish(ctx context.Context, msgs []*wharf.Message, resolve func(context.Context, *wharf.Message) (target, error)) []error {
	res := wharf.NewResults(msgs)
	if len(msgs) == 0 {
		return nil
	}
	var mu sync.Mutex // guards res
	type queue struct {
		t   target
		idx []int
	}
	var order []*queue
	byDest := map[string]*queue{}
	for i, m := range msgs {
		if err := ctx.Err(); err != nil {
			res.FailRest(notSent(ctx))
			return res.Errors()
		}
		if res.Blocked(i) {
			continue
		}
		t, err := resolve(ctx, m)
		if err != nil {
			res.Set(i, err)
			continue
		}
		q := byDest[t.dest]
		if q == nil {
			q = &queue{t: t}
			byDest[t.dest] = q
			order = append(order, q)
		}
		q.idx = append(q.idx, i)
	}
	// Each destination's messages go in lanes by ordering key: a lane sends
	// its requests one at a time, in order, and the lanes of a destination
	// run in parallel, so a key's messages keep their order while a batch
	// of many keys is not held to one request at a time.
	sem := make(chan struct{}, parallelRequests)
	var wg sync.WaitGroup
	for _, q := range order {
		for _, lane := range splitLanes(msgs, q.idx, lanesPerDestination) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				b.publishTo(ctx, msgs, q.t, lane, res, &mu)
			})
		}
	}
	wg.Wait()
	return res.Errors()
}

// splitLanes splits idx (in order) into at most n lanes: the messages of
// one ordering key always in the same lane, unkeyed ones spread evenly, and
// each lane at least a full request unless there are too few messages.
func splitLanes(msgs []*wharf.Message, idx []int, n int) [][]int {
	if want := (len(idx) + maxEntries - 1) / maxEntries; want < n {
		n = max(want, 1)
	}
	if n == 1 {
		return [][]int{idx}
	}
	lanes := make([][]int, n)
	for j, i := range idx {
		l := j % n
		if k := msgs[i].OrderingKey(); k != "" {
			h := fnv.New32a()
			_, _ = h.Write([]byte(k))
			l = int(h.Sum32() % uint32(n))
		}
		lanes[l] = append(lanes[l], i)
	}
	out := lanes[:0]
	for _, l := range lanes {
		if len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// publishTo sends the messages idx of msgs, all for destination t, in
// order, one request at a time.
func (b *batcher) publishTo(ctx context.Context, msgs []*wharf.Message, t target, idx []int, res *wharf.Results, mu *sync.Mutex) {
	pending := idx
	for len(pending) > 0 {
		var chunk []*entry
		var rest []int
		size := 0
		inChunk := map[string]bool{}
		full := false
		mu.Lock()
		for _, i := range pending {
			if res.Done(i) || res.Blocked(i) {
				continue
			}
			k := msgs[i].OrderingKey()
			if full || (b.strict && k != "" && inChunk[k]) {
				rest = append(rest, i)
				if k != "" {
					inChunk[k] = true // keep the key's later messages behind
				}
				continue
			}
			en, err := b.enc.encode(msgs[i], i, t.fifo)
			if err != nil {
				res.Set(i, err)
				continue
			}
			if len(chunk) == maxEntries || size+en.size > b.enc.maxBytes {
				full = true
				rest = append(rest, i)
				if k != "" {
					inChunk[k] = true
				}
				continue
			}
			chunk = append(chunk, en)
			size += en.size
			if k != "" {
				inChunk[k] = true
			}
		}
		mu.Unlock()
		pending = rest
		if len(chunk) == 0 {
			continue
		}
		if ctx.Err() != nil {
			mu.Lock()
			for _, en := range chunk {
				res.Set(en.idx, notSent(ctx))
			}
			for _, i := range pending {
				if !res.Done(i) {
					res.Set(i, notSent(ctx))
				}
			}
			mu.Unlock()
			return
		}
		errs, err := b.send(ctx, t.dest, chunk)
		mu.Lock()
		if err != nil {
			err = fmt.Errorf("wharfsqs: %s %s: %w", b.what, t.name, err)
			for _, en := range chunk {
				res.Set(en.idx, err)
			}
			// The next request would most likely fail the same way: leave
			// the rest to the relay's retry.
			for _, i := range pending {
				if !res.Done(i) {
					res.Set(i, fmt.Errorf("%w: an earlier request to %s %s failed", wharf.ErrNotAttempted, b.what, t.name))
				}
			}
			mu.Unlock()
			return
		}
		for j, en := range chunk {
			res.Set(en.idx, errs[j])
		}
		mu.Unlock()
	}
}

// errNotSent marks a message Publish did not send because its context ended.
var errNotSent = errors.New("not sent: the publish was cut short")

func notSent(ctx context.Context) error {
	return fmt.Errorf("wharfsqs: %w: %w", errNotSent, ctxErr(ctx))
}

// ctxErr is ctx's error, with its cause when one was given.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}

// failedEntry is a batch entry the destination refused.
type failedEntry struct {
	id, code, msg string
	senderFault   bool
}

// batchResults maps the result of a batch request of n entries, whose ids
// are their indexes, to one result per entry: nil for an entry listed as
// successful, the refusal for a failed one (see entryResult), and an error
// to retry for an entry the result does not mention.
func batchResults(what, dest string, n int, successful []string, failed []failedEntry) []error {
	errs := make([]error, n)
	seen := make([]bool, n)
	index := func(id string) (int, bool) {
		j, err := strconv.Atoi(id)
		return j, err == nil && j >= 0 && j < n
	}
	for _, id := range successful {
		if j, ok := index(id); ok {
			seen[j] = true
		}
	}
	for _, f := range failed {
		if j, ok := index(f.id); ok {
			seen[j] = true
			errs[j] = entryResult(what, dest, f.code, f.msg, f.senderFault)
		}
	}
	for j := range errs {
		if !seen[j] {
			errs[j] = fmt.Errorf("wharfsqs: %s %s: the batch result does not mention the message; retried", what, dest)
		}
	}
	return errs
}

// entryResult turns one failed batch entry into a message result: an entry
// the destination refused for the sender's fault fails permanently,
// anything else is retried.
func entryResult(what, name, code, msg string, senderFault bool) error {
	err := fmt.Errorf("wharfsqs: %s %s refused the message: %s: %s", what, name, code, msg)
	if senderFault {
		return wharf.Permanent(err)
	}
	return err
}

// isAlnum reports whether c is an ASCII letter or digit.
func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
