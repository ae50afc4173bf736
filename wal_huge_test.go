//go:build faults

package wharf_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// One producer transaction of 200 MB, against a 16 MiB budget: the relay's
// heap stays far below the transaction's size (it used to hold it whole,
// and a transaction larger than its memory killed it at every start).
// Minutes long: behind the faults build tag (go test -tags faults -run
// TestWALRelayHugeTransaction .).
func TestWALRelayHugeTransactionStaysWithinTheBudget(t *testing.T) {
	heap := walLargeTransaction(t, 50000, 4000, 16<<20)
	require.Less(t, heap, uint64(100<<20), "the relay's heap grew with the transaction")
}
