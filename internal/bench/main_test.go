package bench_test

import (
	"os"
	"testing"

	"github.com/wharfhq/wharf/internal/bench"
	"github.com/wharfhq/wharf/internal/cli"
	"github.com/wharfhq/wharf/internal/testdb"
)

// TestMain doubles as the `wharf` executable for the tests that run relay
// processes: with relayHelperEnv set, the test binary is the CLI.
func TestMain(m *testing.M) {
	if os.Getenv(bench.RelayHelperEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	// A database of its own: the runs report commits per message from
	// pg_stat_database, which counts every session in the database.
	testdb.MainOwnDatabase(m, bench.TestDatabaseURL, "wharf_bench_test")
}
