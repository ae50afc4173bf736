package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

// A message queued behind a scheduled or retrying message of its key says
// so, with the holder's id and time, in outbox list, show and --json;
// it is not shown as due.
func TestOutboxShowsWhatAHeldMessageWaitsFor(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	ids, err := b.client.Enqueue(ctx,
		wharf.Message{Topic: "orders.scheduled", Key: "S1", Payload: []byte(`1`), DeliverAt: later},
		wharf.Message{Topic: "orders.scheduled", Key: "S1", Payload: []byte(`2`)},
		wharf.Message{Topic: "orders.scheduled", Key: "S2", Payload: []byte(`3`)},
	)
	require.NoError(t, err)
	held := later.Local().Format(time.RFC3339)

	code, out, errOut := session{}.run(b.cmd("outbox", "list")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^\d+\s+`+ids[1]+`\s+orders.scheduled\s+S1\s+held behind `+ids[0]+` \(scheduled until `+regexp.QuoteMeta(held)+`\)\s`, out)
	require.Regexp(t, `(?m)^\d+\s+`+ids[2]+`\s+orders.scheduled\s+S2\s+due\s`, out)

	code, out, errOut = session{}.run(b.cmd("outbox", "show", ids[1])...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^state\s+held behind `+ids[0]+` \(scheduled until `+regexp.QuoteMeta(held)+`\)$`, out)

	code, out, errOut = session{}.run(b.cmd("outbox", "list", "--json", "--key", "S1")...)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var j struct {
		State      string `json:"state"`
		HeldBehind *struct {
			ID     string    `json:"id"`
			Seq    int64     `json:"seq"`
			Reason string    `json:"reason"`
			Until  time.Time `json:"until"`
		} `json:"held_behind"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &j))
	require.Equal(t, "held", j.State)
	require.NotNil(t, j.HeldBehind)
	require.Equal(t, ids[0], j.HeldBehind.ID)
	require.Equal(t, "scheduled", j.HeldBehind.Reason)
	require.WithinDuration(t, later, j.HeldBehind.Until, time.Millisecond)
	require.NotContains(t, lines[0], "held_behind")
}
