package wharfflow

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"time"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// RateLimit is a token bucket: PerSecond tokens a second, at most Burst
// saved up.
type RateLimit struct {
	PerSecond float64
	// Burst defaults to 1.
	Burst float64
}

// Config configures a Runner.
type Config struct {
	// Schema is the schema of the outbox and its flows. Defaults to wharf.
	Schema string
	// Flows are the flows this runner executes; it claims steps of these
	// flows only. Required.
	Flows []Definition
	// RunnerID names the runner in leases and step history. Defaults to
	// host-pid-random.
	RunnerID string
	// MaxInFlight is how many steps run at once. Defaults to 256.
	MaxInFlight int
	// LeaseTTL is how long a claimed step is the runner's without renewal;
	// a step of a runner that died runs again after it. Renewed every third
	// of it while the step runs. Defaults to 30s.
	LeaseTTL time.Duration
	// RateLimits sets the token buckets of rate keys (Options.RateKey),
	// written to the database when the runner starts.
	RateLimits map[string]RateLimit
	// ConcurrencyLimits sets the limits of concurrency keys
	// (Options.ConcurrencyKey), written to the database when the runner
	// starts. A key's limit is the key's, whatever the limit its instances
	// were started with: set here, or else by the first instance of the key
	// a claim sees (its Options.ConcurrencyLimit). The last runner started
	// with a key in ConcurrencyLimits sets it.
	ConcurrencyLimits map[string]int
	// Retention is how long done and cancelled instances are kept. Defaults
	// to 7 days.
	Retention time.Duration
	// CleanupInterval is how often expired instances are deleted (in
	// batches of 1000). Defaults to 1m.
	CleanupInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, counts this runner's steps (NewMetrics; one
	// Metrics may serve every runner of a process).
	Metrics *Metrics
	// Tracer, when set, makes a span of each executed step, a child of the
	// trace context its instance (or its nearest ancestor) was started
	// with (NewClient WithTracer); wharfotel.New() implements it. When it
	// is also a wharf.Tracer (wharfotel's is), the messages a step emits
	// carry the step span's context. Costs one query per claim when set,
	// nothing when nil.
	Tracer Tracer
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = wharfmigrate.DefaultSchema
	}
	if err := wharfmigrate.ValidateSchema(out.Schema); err != nil {
		return out, fmt.Errorf("wharfflow: Config.Schema: %w", err)
	}
	if len(out.Flows) == 0 {
		return out, errors.New("wharfflow: Config.Flows is empty: give the runner the flows it executes")
	}
	seen := map[string]bool{}
	for i, f := range out.Flows {
		if f == nil || f.Name() == "" || f.firstStep() == "" {
			return out, fmt.Errorf("wharfflow: Config.Flows[%d]: a flow needs a name and at least one step", i)
		}
		if err := checkText(f.Name()); err != nil {
			return out, fmt.Errorf("wharfflow: Config.Flows[%d]: the flow's name %q %w", i, f.Name(), err)
		}
		if seen[f.Name()] {
			return out, fmt.Errorf("wharfflow: Config.Flows: flow %s is given twice", f.Name())
		}
		seen[f.Name()] = true
	}
	if out.RunnerID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		out.RunnerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if out.MaxInFlight <= 0 {
		out.MaxInFlight = 256
	}
	if out.LeaseTTL <= 0 {
		out.LeaseTTL = 30 * time.Second
	}
	if out.LeaseTTL < 100*time.Millisecond {
		return out, fmt.Errorf("wharfflow: Config.LeaseTTL %s is too short: use at least 100ms", out.LeaseTTL)
	}
	for k, n := range out.ConcurrencyLimits {
		if k == "" || checkKey(k) != nil {
			return out, fmt.Errorf("wharfflow: Config.ConcurrencyLimits: key %q must be non-empty valid UTF-8 without NUL, of at most %d bytes", k, maxKeyBytes)
		}
		if n <= 0 {
			return out, fmt.Errorf("wharfflow: Config.ConcurrencyLimits[%q]: the limit must be at least 1, got %d", k, n)
		}
	}
	// The caller's maps stay as they were (Burst's default is written here).
	out.RateLimits = maps.Clone(out.RateLimits)
	out.ConcurrencyLimits = maps.Clone(out.ConcurrencyLimits)
	for k, rl := range out.RateLimits {
		if k == "" || checkKey(k) != nil {
			return out, fmt.Errorf("wharfflow: Config.RateLimits: key %q must be non-empty valid UTF-8 without NUL, of at most %d bytes", k, maxKeyBytes)
		}
		if rl.PerSecond <= 0 {
			return out, fmt.Errorf("wharfflow: Config.RateLimits[%q]: PerSecond must be positive", k)
		}
		if rl.Burst == 0 {
			rl.Burst = 1
			out.RateLimits[k] = rl
		}
		if rl.Burst < 1 {
			return out, fmt.Errorf("wharfflow: Config.RateLimits[%q]: Burst must be at least 1", k)
		}
	}
	if out.Retention <= 0 {
		out.Retention = 7 * 24 * time.Hour
	}
	if out.CleanupInterval <= 0 {
		out.CleanupInterval = time.Minute
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}
