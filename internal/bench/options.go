// Package bench implements `wharf bench`, the project's reproducible
// benchmark: drain a pre-filled outbox, measure Wharf's enqueue and drain
// beside the server's physical limits (a bare INSERT, a bare claim+delete
// loop), run producers at a fixed rate against relays and judge whether the
// rate is sustainable, and search for the highest sustainable rate. Run
// does the work and returns a Result; WriteSummary, WriteJSON and
// WriteReport present it.
package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/wharfhq/wharf"
)

// Mode selects what Run measures.
type Mode string

// The benchmark modes.
const (
	// ModeDrain pre-fills Messages rows with COPY, then times the relays
	// emptying the outbox.
	ModeDrain Mode = "drain"
	// ModeBaseline runs the producers alone, flat out, for Duration, then the
	// relays draining what they wrote, each beside the server's physical
	// limit measured in the same run: a bare multi-row INSERT and a bare
	// claim+delete loop.
	ModeBaseline Mode = "baseline"
	// ModeSteady runs the producers at Rate msgs/s for Warmup+Duration with the
	// relays running, and judges whether the rate is sustainable.
	ModeSteady Mode = "steady"
	// ModeSweep bisects the rate between MinRate and MaxRate with SweepSteps
	// steady runs, repeats the winner Confirm times and reports the highest
	// rate sustainable in every run.
	ModeSweep Mode = "sweep"
	// ModeSoak is a long steady run (Rate msgs/s for Warmup+Duration, e.g.
	// 30m at a fraction of the sustainable rate) with the relay in this
	// process: besides the steady verdict it samples the process's RSS, Go
	// heap and goroutines, the p99 latency and the outbox's dead tuples (in
	// WAL mode: the WAL its slot retains and the bytes the relay holds), and
	// tests that none of them trends upward.
	ModeSoak Mode = "soak"
)

// Modes lists the modes, for help texts and errors.
var Modes = []Mode{ModeDrain, ModeBaseline, ModeSteady, ModeSweep, ModeSoak}

// Options configures Run. The zero value of a field means its default, as
// the CLI flag of the same name documents.
type Options struct {
	// Mode is what to measure. Required.
	Mode Mode
	// OutboxMode is where the bench's outbox keeps messages: table (the
	// default) or wal (wharfmigrate.SetWALMode): one relay, in this
	// process for steady, sweep and soak, a process for drain and baseline.
	OutboxMode string
	// DatabaseURL is the PostgreSQL to measure. Required (the CLI starts a
	// throwaway cluster when none is given).
	DatabaseURL string
	// Schema is the fresh schema to work in; it must not exist. Defaults to
	// wharf_bench_<random>. A sweep runs every step in it; baseline and
	// --limits add scratch tables (bare_insert, bare_queue) that they drop.
	Schema string
	// Keep leaves the schema in place at the end instead of dropping it.
	Keep bool

	// Messages is the drain backlog. Defaults to 200000.
	Messages int
	// Duration is how long producers run after the warm-up (baseline, steady,
	// each sweep step). Defaults to 10s.
	Duration time.Duration
	// Warmup precedes Duration in steady runs; its samples are excluded from
	// the slope, the rates and the latency. Defaults to 5s; negative means none.
	Warmup time.Duration
	// Rate is the steady target in msgs/s. Required for steady.
	Rate int
	// Backlog, in steady mode, pre-fills the outbox with this many messages
	// (COPY for a table outbox, Enqueue calls of ProducerBatch messages for
	// an outbox in WAL mode) before the relay and the producers start, so
	// that the relay is offered Rate plus the backlog: an overload run (see
	// Overload). 0 (the default) pre-fills nothing.
	Backlog int
	// MinRate and MaxRate bound the sweep. Default to 10000 and 400000.
	MinRate, MaxRate int
	// SweepSteps bounds the bisection runs the sweep makes after its
	// reference run at MinRate; it stops sooner once the bracket is within
	// SweepPrecision. Defaults to 8 (enough for 10k-400k msg/s).
	SweepSteps int
	// Confirm is how many times the sweep repeats its winner; every repeat
	// must be sustainable. Defaults to 2, the least allowed.
	Confirm int
	// MaxP99 is the p99 commit → ack bound of a steady run; 0 leaves the
	// latency unjudged (a sweep judges each run against the runs below it).
	MaxP99 time.Duration
	// P99Floor is the floor of a sweep run's p99 bound: a run above the
	// reference fails when the median of its per-second p99s exceeds
	// max(P99Floor, 3 × the same median at the highest passing run below
	// it). Defaults to 50 ms.
	P99Floor time.Duration
	// Limits also measures the physical limits in drain (the removal limit;
	// a table outbox only), steady and sweep runs (the insert limit, and for
	// an outbox in WAL mode the emit limit too). Baseline always does.
	Limits bool

	// Producers is the number of producer connections. Defaults to 4.
	Producers int
	// ProducerBatch is the messages per producer transaction. Defaults to
	// 100. A drain of an outbox in WAL mode pre-fills through Enqueue calls
	// of this many messages, each a transaction of its own holding one
	// logical message; there it defaults to 1000.
	ProducerBatch int
	// AsyncCommit makes the producers of steady, sweep, soak and baseline
	// runs (and the insert and emit limits beside them) commit with
	// synchronous_commit off: a commit does not wait for its WAL to reach
	// the disk, so producers committing one message per transaction are not
	// held to the disk's flush rate. The relay's own connections are not
	// affected.
	AsyncCommit bool
	// EnqueueFill makes a drain of a table outbox pre-fill through Enqueue
	// calls of ProducerBatch messages, each a transaction of its own, as a
	// WAL outbox's drain does, instead of one COPY: with ProducerBatch 1,
	// the backlog of producers that commit one event per transaction. The
	// CLI sets it when --producer-batch (--messages-per-tx) is given.
	EnqueueFill bool
	// RecordsPerKey is how many consecutive messages share a key before a new
	// key is used; negative means no keys (NULL).
	// Defaults to 10. Ignored when Keys is set.
	RecordsPerKey int
	// Keys, when positive, cycles message i over keys k<i % Keys> instead (the
	// shape of scripts/drain-bench.sh and wharf demo).
	Keys int
	// PayloadBytes is the payload size. Defaults to 200.
	PayloadBytes int

	// Relays is the number of relays. Defaults to 1 (baseline runs them only
	// for its drain phase).
	Relays int
	// InProcess runs the single relay inside this process, behind a probe
	// sink that records acknowledgement times: the only way to measure
	// commit-to-ack latency. Requires Relays == 1.
	InProcess bool
	// Sink is the sink URL. Defaults to "null:".
	Sink string
	// PoisonPercent, when positive, makes that share of the messages poison
	// (steady, sweep and soak, relay in this process): the probe sink fails
	// them on every attempt, so each is retried and then dead-lettered
	// (3 attempts and a 50 ms first backoff unless RelayConfig sets them),
	// and the messages behind it of its key wait. Dead-lettered messages
	// count as worked off in the backlog and are left out of the latency.
	PoisonPercent float64
	// RelayConfig tunes the in-process relay (Schema, Sink and Logger are set
	// by Run).
	RelayConfig wharf.Config
	// RelayArgs are extra flags for relay processes (`wharf relay ...`).
	RelayArgs []string
	// RelayCommand is the program and leading arguments that run a relay
	// process; "relay" and its flags are appended. Defaults to this executable.
	RelayCommand []string
	// RelayStderr receives the relay processes' stderr. Defaults to discarding it.
	RelayStderr io.Writer

	// SampleInterval fixes the sampling period. By default it adapts to the
	// run: 100 ms (250 ms with relay processes), doubling whenever the series
	// passes 240 points.
	SampleInterval time.Duration
	// TailWait bounds how long a steady run waits after the producers stopped
	// for the relays to deliver the rest (for complete latency figures).
	// Defaults to 10s; negative means none. A sweep waits until the outbox is
	// empty (at least TailWait, at most 2 minutes) so that its next run
	// starts from an empty outbox.
	TailWait time.Duration
	// Timeout bounds a drain and the removal limit. Defaults to 10m.
	Timeout time.Duration

	// Progress receives a progress line per sample; nil for none.
	Progress io.Writer
	// Logger receives the in-process relay's logs. Defaults to discarding them
	// below warn.
	Logger *slog.Logger
}

// Validate checks the options other than the database URL, with one-line
// errors that name the CLI flag to fix.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// RelayInProcess reports whether the run's relay runs in this process once
// the defaults apply (false for options that do not validate).
func (o Options) RelayInProcess() bool {
	d, err := o.withDefaults()
	return err == nil && d.InProcess
}

func (o Options) withDefaults() (Options, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Messages, 200000)
	def(&o.MinRate, 10000)
	def(&o.MaxRate, 400000)
	def(&o.SweepSteps, 8)
	def(&o.Confirm, 2)
	if o.P99Floor == 0 {
		o.P99Floor = time.Duration(P99FloorMS * float64(time.Millisecond))
	}
	def(&o.Producers, 4)
	if o.Mode == ModeDrain && o.OutboxMode == "wal" {
		def(&o.ProducerBatch, walFillBatch)
	}
	def(&o.ProducerBatch, 100)
	def(&o.RecordsPerKey, 10)
	def(&o.PayloadBytes, 200)
	def(&o.Relays, 1)
	defDur(&o.Duration, 10*time.Second)
	defDur(&o.Warmup, 5*time.Second)
	defDur(&o.TailWait, 10*time.Second)
	defDur(&o.Timeout, 10*time.Minute)
	if o.Warmup < 0 {
		o.Warmup = 0
	}
	if o.TailWait < 0 {
		o.TailWait = 0
	}
	if o.Sink == "" {
		o.Sink = "null:"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.RelayStderr == nil {
		o.RelayStderr = io.Discard
	}
	switch o.OutboxMode {
	case "", "table":
		o.OutboxMode = "table"
	case "wal":
		// One replication slot, which one relay streams.
		if o.Relays != 1 {
			return o, fmt.Errorf("--outbox-mode wal streams one replication slot, which one relay reads: use --relays 1 (got --relays %d)", o.Relays)
		}
		switch o.Mode {
		case ModeDrain:
			if o.Limits {
				return o, errors.New("--limits measures the table outbox's removal limit; leave it out with --outbox-mode wal")
			}
			// The messages were pre-filled: no producer registers their
			// seqs with the tracker (see tracker), so the relay runs as a
			// process and the slot's progress tells the drain's.
			o.InProcess = false
		case ModeBaseline:
			// Its drain phase is a drain of pre-filled messages, as above.
			o.InProcess = false
		case ModeSteady, ModeSweep, ModeSoak:
			// Latency needs the tracker: the relay runs in this process.
			o.InProcess = true
		}
	default:
		return o, fmt.Errorf("--outbox-mode must be table or wal, got %q", o.OutboxMode)
	}
	switch o.Mode {
	case ModeDrain, ModeBaseline, ModeSteady, ModeSweep, ModeSoak:
	case "":
		return o, errors.New("--mode is required: drain, baseline, steady, sweep or soak")
	default:
		return o, fmt.Errorf("--mode %q: use drain, baseline, steady, sweep or soak", o.Mode)
	}
	for _, c := range []struct {
		name string
		v    int
	}{
		{"--messages", o.Messages}, {"--producers", o.Producers}, {"--producer-batch", o.ProducerBatch},
		{"--relays", o.Relays}, {"--sweep-steps", o.SweepSteps}, {"--min-rate", o.MinRate},
	} {
		if c.v < 1 {
			return o, fmt.Errorf("%s must be at least 1, got %d", c.name, c.v)
		}
	}
	if o.AsyncCommit && o.Mode == ModeDrain {
		return o, fmt.Errorf("--async-commit applies to the producers of steady, sweep, soak and baseline runs; a %s run has none (leave it out)", o.Mode)
	}
	if o.Keys < 0 {
		return o, fmt.Errorf("--keys must not be negative, got %d", o.Keys)
	}
	if o.PayloadBytes < 2 {
		return o, fmt.Errorf("--payload-bytes must be at least 2, got %d", o.PayloadBytes)
	}
	switch {
	case o.Backlog < 0:
		return o, fmt.Errorf("--backlog must not be negative, got %d", o.Backlog)
	case o.Backlog > 0 && o.Mode != ModeSteady:
		return o, fmt.Errorf("--backlog pre-fills the outbox of a steady run: use it with --mode steady (got --mode %s)", o.Mode)
	case o.Backlog > 0 && o.PoisonPercent > 0:
		return o, errors.New("--backlog and --poison-percent do not go together: the pre-filled messages would be poisoned too; leave one out")
	}
	if (o.Mode == ModeSteady || o.Mode == ModeSoak) && o.Rate < 1 {
		return o, fmt.Errorf("--rate must be at least 1 msg/s in %s mode, got %d", o.Mode, o.Rate)
	}
	if o.Mode == ModeSoak {
		// The trends are the relay's own: it must run in this process.
		if o.Relays != 1 {
			return o, fmt.Errorf("--mode soak samples one relay's memory and goroutines, so it runs with --relays 1 (got %d)", o.Relays)
		}
		o.InProcess = true
		if o.Duration < soakMinDuration {
			return o, fmt.Errorf("--duration must be at least %s in soak mode (a trend needs time to show), got %s", soakMinDuration, o.Duration)
		}
		if o.SampleInterval == 0 {
			// A fixed interval: the automatic one keeps every sample's
			// histogram, memory the soak would then see growing.
			o.SampleInterval = max(time.Second, (o.Warmup+o.Duration)/soakSamples)
		}
	}
	if o.Confirm < 2 {
		return o, fmt.Errorf("--confirm must be at least 2 (the winner is repeated to confirm it), got %d", o.Confirm)
	}
	if o.Mode == ModeSweep && o.MaxRate <= o.MinRate {
		return o, fmt.Errorf("--max-rate (%d) must be above --min-rate (%d)", o.MaxRate, o.MinRate)
	}
	for _, c := range []struct {
		name string
		v    time.Duration
	}{{"--duration", o.Duration}, {"--sample-interval", o.SampleInterval}, {"--timeout", o.Timeout}, {"--max-p99", o.MaxP99}, {"--p99-floor", o.P99Floor}} {
		if c.v < 0 {
			return o, fmt.Errorf("%s must not be negative, got %s", c.name, c.v)
		}
	}
	if o.Mode != ModeDrain && o.Duration < time.Second {
		return o, fmt.Errorf("--duration must be at least 1s (the growth test needs readings), got %s", o.Duration)
	}
	if o.InProcess && o.Relays != 1 {
		return o, fmt.Errorf("--in-process needs --relays 1 (got %d): several relays run as processes", o.Relays)
	}
	switch {
	case o.PoisonPercent < 0 || o.PoisonPercent > 50:
		return o, fmt.Errorf("--poison-percent must be between 0 and 50, got %g", o.PoisonPercent)
	case o.PoisonPercent > 0 && (o.Mode == ModeDrain || o.Mode == ModeBaseline || !o.InProcess):
		return o, fmt.Errorf("--poison-percent fails messages in the in-process relay's sink: use it with --mode steady, sweep or soak and --relays 1 (got --mode %s, in-process %t)", o.Mode, o.InProcess)
	}
	return o, nil
}

// Settings are the options a run used, as recorded in the JSON output. The
// database URL is left out: it may hold a password.
type Settings struct {
	Mode           Mode     `json:"mode"`
	OutboxMode     string   `json:"outbox_mode"`
	Schema         string   `json:"schema"`
	Messages       int      `json:"messages"`
	Duration       string   `json:"duration"`
	Warmup         string   `json:"warmup"`
	Rate           int      `json:"rate"`
	Backlog        int      `json:"backlog,omitempty"`
	MinRate        int      `json:"min_rate"`
	MaxRate        int      `json:"max_rate"`
	SweepSteps     int      `json:"sweep_steps"`
	Confirm        int      `json:"confirm"`
	MaxP99         string   `json:"max_p99"`
	P99Floor       string   `json:"p99_floor"`
	Limits         bool     `json:"limits"`
	Producers      int      `json:"producers"`
	ProducerBatch  int      `json:"producer_batch"`
	EnqueueFill    bool     `json:"enqueue_fill,omitempty"`
	AsyncCommit    bool     `json:"async_commit,omitempty"`
	RecordsPerKey  int      `json:"records_per_key"`
	Keys           int      `json:"keys"`
	PayloadBytes   int      `json:"payload_bytes"`
	Relays         int      `json:"relays"`
	InProcess      bool     `json:"in_process"`
	Sink           string   `json:"sink"`
	PoisonPercent  float64  `json:"poison_percent,omitempty"`
	RelayArgs      []string `json:"relay_args"`
	SampleInterval string   `json:"sample_interval"`
	TailWait       string   `json:"tail_wait"`
	Timeout        string   `json:"timeout"`
}

func (o Options) settings() Settings {
	si := "auto"
	if o.SampleInterval > 0 {
		si = o.SampleInterval.String()
	}
	return Settings{
		Mode: o.Mode, OutboxMode: o.OutboxMode, Schema: o.Schema, Messages: o.Messages, Duration: o.Duration.String(), Warmup: o.Warmup.String(),
		Rate: o.Rate, Backlog: o.Backlog, MinRate: o.MinRate, MaxRate: o.MaxRate, SweepSteps: o.SweepSteps, Confirm: o.Confirm,
		MaxP99: o.MaxP99.String(), P99Floor: o.P99Floor.String(), Limits: o.Limits || o.Mode == ModeBaseline,
		Producers: o.Producers, ProducerBatch: o.ProducerBatch, EnqueueFill: o.EnqueueFill, AsyncCommit: o.AsyncCommit, RecordsPerKey: o.RecordsPerKey, Keys: o.Keys,
		PayloadBytes: o.PayloadBytes, Relays: o.Relays, InProcess: o.InProcess, Sink: o.Sink, PoisonPercent: o.PoisonPercent,
		RelayArgs: append([]string{}, o.RelayArgs...), SampleInterval: si, TailWait: o.TailWait.String(),
		Timeout: o.Timeout.String(),
	}
}

// Applicable lists the settings that shape a run of s.Mode, named as the
// CLI flags are, in the order of the help text.
func (s Settings) Applicable() []Setting {
	m := s.Mode
	drain, baseline, sweep := m == ModeDrain, m == ModeBaseline, m == ModeSweep
	steady := m == ModeSteady || m == ModeSoak
	loaded := baseline || steady || sweep
	keys := fmt.Sprintf("%d consecutive messages per key", s.RecordsPerKey)
	switch {
	case s.Keys > 0:
		keys = fmt.Sprintf("cycling over %d keys", s.Keys)
	case s.RecordsPerKey < 0:
		keys = "none (NULL)"
	}
	var out []Setting
	add := func(ok bool, name string, v any) {
		if ok {
			out = append(out, Setting{Name: name, Value: fmt.Sprint(v)})
		}
	}
	add(true, "mode", m)
	add(s.OutboxMode == "wal", "outbox-mode", s.OutboxMode)
	add(drain, "messages", s.Messages)
	add(sweep, "min-rate", s.MinRate)
	add(sweep, "max-rate", s.MaxRate)
	add(sweep, "sweep-steps", s.SweepSteps)
	add(sweep, "confirm", s.Confirm)
	add(sweep, "p99-floor", s.P99Floor)
	add(steady, "rate", s.Rate)
	add(s.Backlog > 0, "backlog", s.Backlog)
	add(loaded, "duration", s.Duration)
	add(steady || sweep, "warmup", s.Warmup)
	add(steady && s.MaxP99 != "0s", "max-p99", s.MaxP99)
	add(loaded, "producers", s.Producers)
	add(loaded || (drain && (s.OutboxMode == "wal" || s.EnqueueFill)), "producer-batch", s.ProducerBatch)
	add(loaded && s.AsyncCommit, "async-commit", s.AsyncCommit)
	add(true, "keys", keys)
	add(true, "payload-bytes", s.PayloadBytes)
	add(true, "relays", s.Relays)
	add(true, "in-process", s.InProcess)
	add(true, "sink", s.Sink)
	add(s.PoisonPercent > 0, "poison-percent", s.PoisonPercent)
	add(len(s.RelayArgs) > 0, "relay-arg", strings.Join(s.RelayArgs, " "))
	add(steady || sweep, "tail-wait", s.TailWait)
	add(drain || baseline, "timeout", s.Timeout)
	add(!baseline, "limits", s.Limits)
	add(true, "sample-interval", s.SampleInterval)
	add(true, "schema", s.Schema)
	return out
}
