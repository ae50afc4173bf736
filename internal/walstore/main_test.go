package walstore

import (
	"testing"

	"github.com/wharfhq/wharf/internal/testdb"
)

// databaseURL is unused by these tests (they run on testdb.LogicalURL's
// cluster, which testdb stops after them).
var databaseURL string

func TestMain(m *testing.M) { testdb.Main(m, &databaseURL) }
