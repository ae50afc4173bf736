package tablestore

import (
	"testing"

	"github.com/wharfhq/wharf/internal/testdb"
)

// databaseURL is the test database (TEST_DATABASE_URL, or a throwaway
// cluster); the tests read it from the environment, which testdb sets.
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }
