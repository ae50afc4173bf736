package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Environment is the machine the bench ran on and the server settings that
// move its figures.
type Environment struct {
	// Cores is the number of CPUs this process can use.
	Cores int `json:"cores"`
	// OS is GOOS/GOARCH.
	OS string `json:"os"`
	// LoadAverageStart and LoadAverageEnd are the 1, 5 and 15 minute load
	// averages when the run started and ended; empty where the system does
	// not expose them (/proc/loadavg).
	LoadAverageStart []float64 `json:"load_average_start"`
	LoadAverageEnd   []float64 `json:"load_average_end"`
	// ServerAddress is where PostgreSQL answered (inet_server_addr(); empty
	// over a Unix socket).
	ServerAddress string `json:"server_address"`
	// TLS is the protocol the bench's connection to PostgreSQL uses, or "no".
	TLS string `json:"tls"`
	// PostgresSettings are the server settings that matter to these figures.
	PostgresSettings []Setting `json:"postgres_settings"`
	// Warnings name settings or conditions that make the figures differ from
	// a production server's.
	Warnings []string `json:"warnings,omitempty"`
}

// Setting is one named value.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// serverSettings are the PostgreSQL settings reported with every result.
var serverSettings = []string{"autovacuum", "autovacuum_naptime", "shared_buffers", "synchronous_commit", "fsync", "full_page_writes",
	"max_wal_size", "checkpoint_timeout", "wal_compression", "jit"}

func (e *env) environment(ctx context.Context) (Environment, error) {
	env := Environment{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAverageStart: loadAverage()}
	rows, err := e.ctl.Query(ctx, `SELECT s, current_setting(s) FROM unnest($1::text[]) AS s`, serverSettings)
	if err != nil {
		return env, err
	}
	for rows.Next() {
		var s Setting
		if err := rows.Scan(&s.Name, &s.Value); err != nil {
			rows.Close()
			return env, err
		}
		env.PostgresSettings = append(env.PostgresSettings, s)
	}
	if err := rows.Err(); err != nil {
		return env, err
	}
	var addr *string
	if err := e.ctl.QueryRow(ctx, `SELECT inet_server_addr()::text,
		coalesce((SELECT CASE WHEN ssl THEN version ELSE 'no' END FROM pg_stat_ssl WHERE pid = pg_backend_pid()), 'unknown')`).Scan(&addr, &env.TLS); err != nil {
		return env, err
	}
	if addr != nil {
		env.ServerAddress = strings.TrimSuffix(*addr, "/32")
	}
	get := func(name string) string {
		for _, s := range env.PostgresSettings {
			if s.Name == name {
				return s.Value
			}
		}
		return ""
	}
	if get("autovacuum") == "off" {
		env.Warnings = append(env.Warnings, "autovacuum is off: the outbox's own autovacuum settings do nothing, so its dead tuples pile up during a run (the bench vacuums only between runs) and long runs slow down")
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		if get(name) == "off" {
			env.Warnings = append(env.Warnings, name+" is off: commits are cheaper than on a durable server")
		}
	}
	if env.TLS != "no" && env.TLS != "unknown" {
		env.Warnings = append(env.Warnings, "the connections use "+env.TLS+" (sslmode=prefer is the default): encryption costs CPU on both sides; add sslmode=disable to the URL to measure without it")
	}
	if la := env.LoadAverageStart; len(la) > 0 && la[0] > float64(env.Cores)/2 {
		env.Warnings = append(env.Warnings, fmt.Sprintf("the machine was busy at the start (1-minute load average %.2f on %d cores)", la[0], env.Cores))
	}
	return env, nil
}

// loadAverage returns the 1, 5 and 15 minute load averages, or nil where
// /proc/loadavg does not exist.
func loadAverage() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		if out[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil
		}
	}
	return out
}
