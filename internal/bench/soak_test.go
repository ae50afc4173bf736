package bench

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf/internal/testtool"
)

// soakSeries is a 30-minute soak's samples (every 9 s) with noisy readings:
// rss rising by rssPerHour, the rest flat.
func soakSeries(rssPerHour float64, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 1))
	var out []Sample
	for i := range 200 {
		sec := float64(i) * 9
		noise := func(sd float64) float64 { return rng.NormFloat64() * sd }
		out = append(out, Sample{Seconds: sec, Phase: "measure",
			RSSBytes:   int64(80<<20 + rssPerHour*sec/3600 + noise(1<<20)),
			HeapBytes:  int64(30<<20 + noise(2<<20)),
			Goroutines: 40 + rng.IntN(3),
			P99:        8 + noise(2),
			// autovacuum's sawtooth
			DeadTuples: int64(i%20) * 5000,
		})
	}
	return out
}

func TestSoakTrendsFlat(t *testing.T) {
	s := soakTrends(soakSeries(0, 1), 5000, false)
	for _, tr := range s.Trends {
		require.True(t, tr.Flat, tr.String())
		require.True(t, tr.Growth.Valid, tr.Name)
	}
	require.True(t, s.Flat)
}

// A leak of 16 MiB an hour (a 20 % rise of an 80 MiB process) must fail,
// even though each reading's noise (1 MiB) hides it from one sample to the next.
func TestSoakTrendsCatchAMemoryLeak(t *testing.T) {
	for seed := range uint64(10) {
		s := soakTrends(soakSeries(16<<20, seed), 5000, false)
		require.False(t, s.Flat, "seed %d", seed)
		require.Equal(t, "rss_bytes", s.Trends[0].Name)
		require.False(t, s.Trends[0].Flat, s.Trends[0].String())
		require.Contains(t, s.Trends[0].String(), "RISING")
	}
}

// In WAL mode the slot's retained WAL and the relay's held bytes replace the
// dead tuples: flat when they hover, failed when the retained WAL climbs
// (a slot confirmed less and less far: 64 MiB an hour here).
func TestSoakTrendsWALMode(t *testing.T) {
	series := func(lagPerHour float64, seed uint64) []Sample {
		ss := soakSeries(0, seed)
		rng := rand.New(rand.NewPCG(seed, 2))
		for i := range ss {
			ss[i].DeadTuples = 0
			ss[i].SlotLagBytes = int64(2<<20 + lagPerHour*ss[i].Seconds/3600 + rng.NormFloat64()*(1<<20))
			ss[i].HeldBytes = int64(8<<20 + rng.NormFloat64()*(2<<20))
		}
		return ss
	}
	s := soakTrends(series(0, 1), 5000, true)
	var names []string
	for _, tr := range s.Trends {
		names = append(names, tr.Name)
		require.True(t, tr.Flat, tr.String())
	}
	require.Equal(t, []string{"rss_bytes", "heap_bytes", "goroutines", "p99_ms", "slot_lag_bytes", "held_bytes"}, names)
	require.True(t, s.Flat)
	for seed := range uint64(5) {
		s := soakTrends(series(64<<20, seed), 5000, true)
		require.False(t, s.Flat, "seed %d", seed)
		require.False(t, s.Trends[4].Flat, s.Trends[4].String())
		require.Contains(t, s.Trends[4].String(), "MiB")
	}
}

// Warm-up and tail samples are not part of the trend.
func TestSoakTrendsUseTheMeasurementWindowOnly(t *testing.T) {
	ss := soakSeries(0, 3)
	ss = append(ss, Sample{Seconds: 2000, Phase: "tail", RSSBytes: 900 << 20, Goroutines: 4000, P99: 900, DeadTuples: 1e7})
	require.True(t, soakTrends(ss, 5000, false).Flat)
}

// A short soak against the real database: every sample carries the
// resource readings and the verdict has a criterion per trend.
func TestSoak(t *testing.T) {
	testtool.Long(t, "a 30 s soak")
	o := smokeOptions(ModeSoak)
	o.Rate = 2000
	o.Duration = soakMinDuration
	o.Warmup = time.Second
	o.TailWait = 2 * time.Minute // ends once the relay caught up: a hang guard
	r, err := Run(context.Background(), o)
	require.NoError(t, err)
	m := decode(t, r)
	require.Equal(t, "soak", m["mode"])
	require.Contains(t, m, "soak")
	require.True(t, r.Settings.InProcess)
	require.NotNil(t, r.Soak)
	require.Len(t, r.Soak.Trends, 5)
	require.Len(t, r.Criteria, 4+5)
	measured := 0
	for _, x := range r.Samples {
		if x.Phase != "measure" {
			continue
		}
		measured++
		require.Positive(t, x.RSSBytes)
		require.Positive(t, x.HeapBytes)
		require.Positive(t, x.Goroutines)
	}
	require.GreaterOrEqual(t, measured, 25, "a sample a second over 30 s")
	require.Equal(t, r.Messages, r.Delivered)
	sum, html := report(t, r)
	require.Contains(t, sum, "trend_rss_bytes")
	require.Contains(t, html, "Goroutines")
}

func TestSoakOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: ModeSoak, DatabaseURL: "x", Duration: time.Minute}, "--rate"},
		{Options{Mode: ModeSoak, DatabaseURL: "x", Rate: 100, Duration: time.Minute, Relays: 2}, "--relays 1"},
		{Options{Mode: ModeSoak, DatabaseURL: "x", Rate: 100, Duration: 5 * time.Second}, "--duration must be at least 30s"},
	} {
		err := c.o.Validate()
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "\n")
	}
	o, err := Options{Mode: ModeSoak, DatabaseURL: "x", Rate: 100, Duration: 30 * time.Minute}.withDefaults()
	require.NoError(t, err)
	require.True(t, o.InProcess)
	require.Equal(t, 9*time.Second+25*time.Millisecond, o.SampleInterval, "(warm-up + duration) / 200")
}
