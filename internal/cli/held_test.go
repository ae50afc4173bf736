package cli

import (
	"context"
	"encoding/json"
	"os"
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

// Cancelling or rescheduling an id that names no pending message fails with
// a hint, instead of reporting 0 messages and exiting 0; one message is "1
// message"; the note on in-flight messages needs --verbose.
func TestCancelOfAnUnknownIDFails(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	ids, err := b.client.Enqueue(context.Background(), wharf.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	require.NoError(t, err)
	for _, cmd := range [][]string{{"outbox", "cancel", "--id", "999", "--yes"}, {"outbox", "reschedule", "--id", "999"}} {
		code, out, errOut := session{}.run(b.cmd(cmd...)...)
		require.Equal(t, 1, code, cmd)
		require.Empty(t, out)
		requireOneLineError(t, errOut, "no pending message matches --id 999: it was delivered, dead-lettered (see wharf dead list) or cancelled")
	}
	code, _, errOut := session{terminal: true, stdin: "yes\n"}.run(b.cmd("outbox", "cancel", "--id", "999")...)
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "no pending message matches --id 999")

	code, out, errOut := session{}.run(b.cmd("outbox", "reschedule", "--id", ids[0])...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "1 message rescheduled to now.\n", out)
	code, out, errOut = session{}.run(b.cmd("outbox", "cancel", "--id", ids[0], "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "1 message cancelled.\n", out)
}

// A command that groups others refuses an unknown subcommand with exit 2 and
// one line with a suggestion; without one it prints its help.
func TestUnknownSubcommandIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "bogus"}, `unknown command "bogus" for "wharf outbox": it takes cancel, list, reschedule, show (see wharf outbox --help)`},
		{[]string{"outbox", "lst"}, `unknown command "lst" for "wharf outbox": did you mean list?`},
		{[]string{"relya"}, `unknown command "relya" for "wharf": did you mean relay? (see wharf --help)`},
		{[]string{"dead", "shw"}, `unknown command "shw" for "wharf dead": did you mean show?`},
	} {
		code, out, errOut := run(c.args...)
		require.Equal(t, 2, code, c.args)
		require.Empty(t, out, c.args)
		requireOneLineError(t, errOut, c.want)
	}
	code, out, errOut := run("dead")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "Available Commands:")
}

// Standard input from /dev/null is not a terminal: scripts redirect from it,
// and nobody answers a question there.
func TestDevNullIsNotATerminal(t *testing.T) {
	fi, err := os.Stat(os.DevNull)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeCharDevice, "/dev/null is a character device")
	require.False(t, isTerminal(fi))
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	fi, err = r.Stat()
	require.NoError(t, err)
	require.False(t, isTerminal(fi))
}
