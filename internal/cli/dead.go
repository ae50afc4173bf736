package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wharfhq/wharf"
)

// requestPrefix is the request a sink error names before its cause, as in
// "POST https://hooks.example/in: 500 Internal Server Error".
var requestPrefix = regexp.MustCompile(`^(GET|HEAD|POST|PUT|PATCH|DELETE) \S+: `)

// deadCause is the part of a dead letter's last error that says why it
// failed: without the sink's name, the message id (shown in its own column)
// and the request it made, all of which every such error starts with. A
// permanent error keeps its "permanent: " mark.
func deadCause(d wharf.DeadLetter) string {
	s := d.LastError
	mark := ""
	if strings.HasPrefix(s, "permanent: ") {
		mark = "permanent: "
	}
	if _, after, ok := strings.Cut(s, "message "+d.ID+": "); ok {
		s = after
	}
	if m := requestPrefix.FindStringIndex(s); m != nil {
		s = s[m[1]:]
	}
	if mark != "" && !strings.HasPrefix(s, mark) {
		s = mark + s
	}
	return s
}

// deadJSON is the JSON form of a dead letter in `wharf dead list|show
// --json`: the same names and payload rules as a pending message in
// `wharf outbox list --json`, with the failure.
type deadJSON struct {
	messageJSON
	Cause    string    `json:"cause"`
	FailedAt time.Time `json:"failed_at"`
}

func writeDeadJSON(out io.Writer, dead []wharf.DeadLetter) error {
	enc := json.NewEncoder(out)
	for _, d := range dead {
		j := deadJSON{messageJSON: newMessageJSON(&d.Message), Cause: deadCause(d), FailedAt: d.FailedAt.UTC()}
		j.Attempts = d.Attempts
		j.LastError = d.LastError
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

func writeDeadDetail(out io.Writer, d wharf.DeadLetter) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fmt.Fprintf(w, "id\t%s\n", d.ID)
	fmt.Fprintf(w, "seq\t%d\n", d.Seq)
	fmt.Fprintf(w, "topic\t%s\n", d.Topic)
	fmt.Fprintf(w, "key\t%s\n", dash(d.Key))
	fmt.Fprintf(w, "created at\t%s\n", d.CreatedAt.UTC().Format(time.RFC3339Nano))
	deliverAt := "-"
	if !d.DeliverAt.IsZero() {
		deliverAt = d.DeliverAt.UTC().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(w, "deliver at\t%s\n", deliverAt)
	fmt.Fprintf(w, "dedup key\t%s\n", dash(d.DedupKey))
	fmt.Fprintf(w, "failed at\t%s (%s ago)\n", d.FailedAt.UTC().Format(time.RFC3339Nano), roundAge(time.Since(d.FailedAt)))
	fmt.Fprintf(w, "attempts\t%d\n", d.Attempts)
	fmt.Fprintf(w, "cause\t%s\n", deadCause(d))
	fmt.Fprintf(w, "last error\t%s\n", strings.Join(strings.Fields(d.LastError), " "))
	writeHeadersAndPayload(w, out, d.Headers, d.Payload)
}
