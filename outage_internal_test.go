package wharf

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Through a database outage the relay logs the first failure, every 10th,
// and one line when the database answers again; after lost leases, one line
// when it holds lanes again.
func TestOutageLogOneLineEachWay(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var o outageLog
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o.dbOK(log, t0)
	require.Empty(t, buf.String(), "no recovery line without an outage")
	var logged []int
	for i := 1; i <= 25; i++ {
		if o.dbFailed(t0.Add(time.Duration(i) * time.Second)) {
			logged = append(logged, i)
		}
	}
	require.Equal(t, []int{1, 10, 20}, logged)
	o.dbOK(log, t0.Add(31*time.Second))
	o.dbOK(log, t0.Add(32*time.Second))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], `msg="wharf: the database answers again" failed_round_trips=25 down_for=30s`)

	buf.Reset()
	o.lanesBack(log, t0, 64)
	require.Empty(t, buf.String(), "no recovery line without a loss")
	o.lanesLost(t0)
	o.lanesLost(t0.Add(time.Second))
	o.lanesBack(log, t0.Add(36*time.Second), 32)
	o.lanesBack(log, t0.Add(37*time.Second), 64)
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], `msg="wharf: holding lanes again after losing leases" lanes_owned=32 since_loss=36s`)
}

// A relay ages a held or due message from when it became due: its DeliverAt
// when later than its enqueue.
func TestDueSince(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	require.Equal(t, created, dueSince(&Message{CreatedAt: created}))
	require.Equal(t, created.Add(time.Hour), dueSince(&Message{CreatedAt: created, DeliverAt: created.Add(time.Hour)}))
	require.Equal(t, created, dueSince(&Message{CreatedAt: created, DeliverAt: created.Add(-time.Hour)}))
}
