package wharf

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// Config configures a [Client]. The zero value of every field means its default.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to "wharf".
	Schema string

	// Sink receives the messages the relay delivers. Required to Start a relay,
	// unless Handler is set.
	Sink Sink
	// Handler, when Sink is nil, delivers each message to a Go function in this
	// process. Messages of one key are handled one at a time, in order.
	Handler HandlerFunc
	// HandlerConcurrency is how many Handler calls run at once (across keys).
	// Defaults to 16.
	HandlerConcurrency int

	// Tracer instruments enqueue and delivery (see wharfotel). Defaults to
	// nil: no tracing, at no cost.
	Tracer Tracer

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// RelayID names this relay in the lanes table. Defaults to host-pid-random.
	RelayID string

	// FetchBatch is the most rows one fetch reads across all lanes. Defaults
	// to 4000.
	FetchBatch int
	// SinkBatch is the most messages handed to the sink in one Publish call.
	// Defaults to 1000 (or MaxBuffered, when that is less); at most
	// MaxBuffered.
	SinkBatch int
	// SinkConcurrency is how many Publish calls may be in flight at once.
	// Defaults to 4.
	SinkConcurrency int
	// MaxBuffered bounds the messages loaded in memory (fetched with their
	// payloads, not yet removed): about 1 KB each with 200-byte payloads.
	// Messages that wait (a retry backoff, a deliver_at in the future, or
	// behind such a message of their key) are kept as positions only, about
	// 8 bytes each, and do not count; a key that waits less than a second
	// keeps its messages loaded while less than half the budget is used.
	// Defaults to 20000.
	MaxBuffered int
	// MaxBufferedBytes bounds the payload bytes loaded in memory: a fetch
	// brings at most a quarter of it (at least one message per lane), and no
	// fetch starts while it is used up. Defaults to 64 MiB.
	MaxBufferedBytes int64

	// OrderAcrossTopics makes the key alone the ordering scope: messages with
	// the same key are delivered in order whatever their topics (for
	// example orders.created and orders.paid of one order, sent to one
	// webhook). By default the scope is (topic, key): a held key of one
	// topic never holds another topic's messages. Defaults to false.
	OrderAcrossTopics bool

	// PollOnly disables LISTEN (for PgBouncer in transaction mode). The relay
	// listens by default so that enabling notifications (`wharf notify on`)
	// wakes it at once. Defaults to false.
	PollOnly bool
	// PollInterval is how often an idle relay looks for new messages. After
	// an empty fetch the relay waits FetchInterval, doubling up to
	// PollInterval while the outbox stays empty. An empty fetch costs well
	// under a millisecond. Defaults to 50ms.
	PollInterval time.Duration
	// FetchInterval is the least time from one fetch's start to the next
	// one's while the relay keeps up; a relay that is behind (the last fetch
	// brought a quarter or more of the rows it asked for, or a lane filled
	// its limit twice in a row) fetches again as soon as a fetch returns.
	// Every fetch reads all the relay's lanes, so a relay that kept up and
	// fetched back to back would spend most of its database time on fetches
	// of a few rows each; BENCHMARKS.md in the repository shows the
	// trade-off between CPU and latency. It adds at most this much latency,
	// half of it on average. A value below a fetch's round trip (1µs)
	// fetches back to back. Defaults to 5ms (PollInterval if that is
	// shorter).
	FetchInterval time.Duration

	// LeaseTTL is how long a lane lease lasts without renewal: a crashed relay's
	// lanes are taken over after at most about this long. Defaults to 10s.
	LeaseTTL time.Duration
	// RebalanceInterval is how often leases are renewed and lanes rebalanced
	// across relays. Defaults to 1s.
	RebalanceInterval time.Duration
	// Exclusive makes one relay hold every lane while the others stand by:
	// a relay with Exclusive claims all the lanes when no other live relay
	// holds any, and none otherwise; a standby takes them all over when
	// the holder stops (at once) or dies (after LeaseTTL). Choose it for a
	// single writer at the destination and hot standbys instead of shared
	// work: lanes never move between live relays, so no lane is handed over
	// and read again when a relay joins or leaves. Give every relay of the
	// outbox the same setting. Defaults to false (lanes shared fairly among
	// live relays).
	Exclusive bool

	// MaxAttempts is how many deliveries a message gets before it moves to the
	// dead-letter table. Defaults to 12.
	MaxAttempts int
	// RetryBackoff is the delay after the first failed attempt; it doubles with
	// each further attempt (with jitter). Defaults to 1s.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the retry delay. Defaults to 10m.
	MaxRetryBackoff time.Duration

	// clock is the relay's clock; nil is time.Now. Tests skew it to show
	// that no decision depends on this machine's clock agreeing with the
	// database's.
	clock func() time.Time
	// walSpillAfter is how long a WAL outbox's relay keeps a message handed
	// to delivery and unsettled in memory before it moves it to the outbox
	// table (walstore's spill); 0 is walstore.DefaultSpillAfter. Tests shorten it.
	walSpillAfter time.Duration
}

// withDefaults returns a copy of c with defaults filled in and checks every
// field, naming the one that is wrong.
func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.clock == nil {
		out.clock = time.Now
	}
	if out.Schema == "" {
		out.Schema = wharfmigrate.DefaultSchema
	}
	if err := wharfmigrate.ValidateSchema(out.Schema); err != nil {
		return out, fmt.Errorf("wharf: Config.Schema: %w", err)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.RelayID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		out.RelayID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	type intField struct {
		name string
		v    *int
		def  int
	}
	sinkBatchGiven := out.SinkBatch > 0
	for _, f := range []intField{
		{"HandlerConcurrency", &out.HandlerConcurrency, 16},
		{"FetchBatch", &out.FetchBatch, 4000},
		{"SinkBatch", &out.SinkBatch, 1000},
		{"SinkConcurrency", &out.SinkConcurrency, 4},
		{"MaxBuffered", &out.MaxBuffered, 20000},
		{"MaxAttempts", &out.MaxAttempts, 12},
	} {
		if *f.v < 0 {
			return out, fmt.Errorf("wharf: Config.%s must not be negative (got %d); leave it 0 for the default %d", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	type durField struct {
		name string
		v    *time.Duration
		def  time.Duration
	}
	for _, f := range []durField{
		{"PollInterval", &out.PollInterval, 50 * time.Millisecond},
		{"LeaseTTL", &out.LeaseTTL, 10 * time.Second},
		{"RebalanceInterval", &out.RebalanceInterval, time.Second},
		{"RetryBackoff", &out.RetryBackoff, time.Second},
		{"MaxRetryBackoff", &out.MaxRetryBackoff, 10 * time.Minute},
	} {
		if *f.v < 0 {
			return out, fmt.Errorf("wharf: Config.%s must not be negative (got %s); leave it 0 for the default %s", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if out.MaxBufferedBytes < 0 {
		return out, fmt.Errorf("wharf: Config.MaxBufferedBytes must not be negative (got %d); leave it 0 for the default 64 MiB", out.MaxBufferedBytes)
	}
	if out.MaxBufferedBytes == 0 {
		out.MaxBufferedBytes = 64 << 20
	}
	if out.MaxBufferedBytes < 1<<20 {
		return out, fmt.Errorf("wharf: Config.MaxBufferedBytes must be at least 1 MiB (got %d)", out.MaxBufferedBytes)
	}
	if out.FetchBatch < wharfmigrate.Lanes {
		return out, fmt.Errorf("wharf: Config.FetchBatch must be at least %d (one row per lane), got %d", wharfmigrate.Lanes, out.FetchBatch)
	}
	if out.MaxBuffered < out.FetchBatch {
		return out, fmt.Errorf("wharf: Config.MaxBuffered (%d) must be at least Config.FetchBatch (%d)", out.MaxBuffered, out.FetchBatch)
	}
	if out.SinkBatch > out.MaxBuffered && !sinkBatchGiven {
		out.SinkBatch = out.MaxBuffered
	}
	if out.SinkBatch > out.MaxBuffered {
		return out, fmt.Errorf("wharf: Config.SinkBatch (%d) must not be more than Config.MaxBuffered (%d): a sink call cannot carry more messages than the relay loads", out.SinkBatch, out.MaxBuffered)
	}
	if out.FetchInterval < 0 {
		return out, fmt.Errorf("wharf: Config.FetchInterval must not be negative (got %s); leave it 0 for the default 5ms", out.FetchInterval)
	}
	if out.FetchInterval == 0 {
		out.FetchInterval = min(5*time.Millisecond, out.PollInterval)
	}
	if out.FetchInterval > out.PollInterval {
		return out, fmt.Errorf("wharf: Config.FetchInterval (%s) must not be longer than Config.PollInterval (%s), the idle poll it starts from", out.FetchInterval, out.PollInterval)
	}
	if out.LeaseTTL < 3*out.RebalanceInterval {
		return out, fmt.Errorf("wharf: Config.LeaseTTL (%s) must be at least 3 x Config.RebalanceInterval (%s) so leases are renewed before they expire", out.LeaseTTL, out.RebalanceInterval)
	}
	if out.MaxRetryBackoff < out.RetryBackoff {
		return out, fmt.Errorf("wharf: Config.MaxRetryBackoff (%s) must be at least Config.RetryBackoff (%s)", out.MaxRetryBackoff, out.RetryBackoff)
	}
	return out, nil
}
