// Package testdb gives a test binary its PostgreSQL: TEST_DATABASE_URL when it
// is set, otherwise a throwaway cluster started from the local server binaries.
// It never skips: without a database the test binary fails.
package testdb

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wharfhq/wharf/internal/pgembed"
)

// Main is Run followed by os.Exit. Call it from TestMain.
func Main(m *testing.M, url *string) { os.Exit(Run(m, url)) }

// Run resolves the database URL into *url, runs the tests, stops the cluster
// it started, checks for leaked goroutines and returns the exit status.
func Run(m *testing.M, url *string) int {
	*url = os.Getenv("TEST_DATABASE_URL")
	var cluster *pgembed.Cluster
	if *url == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var err error
		cluster, err = pgembed.Start(ctx, pgembed.Options{})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "TEST_DATABASE_URL is not set and no local PostgreSQL could be started:", err)
			return 1
		}
		*url = cluster.URL()
		// Tests in the package itself (not _test) read it from here.
		_ = os.Setenv("TEST_DATABASE_URL", *url)
	}
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop()
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// CleanEnv is the test's environment without anything that could point a
// wharf binary at a database or schema other than the one a test passes on
// its command line (DATABASE_URL, WHARF_*).
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "WHARF_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
