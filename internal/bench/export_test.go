package bench

// TestDatabaseURL lets the external TestMain (main_test.go) fill in the
// database URL the package's tests use.
var TestDatabaseURL = &databaseURL

// RelayHelperEnv makes the test binary run as the wharf CLI (see main_test.go).
const RelayHelperEnv = "WHARF_BENCH_TEST_AS_CLI"
