package cli

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/envelope"
)

// parseIDs splits --id values into message ids (UUIDs) and seqs (numbers).
func parseIDs(values []string, listCmd string) (ids []string, seqs []int64, err error) {
	for _, v := range values {
		v = strings.TrimSpace(v)
		if seq, err := strconv.ParseInt(v, 10, 64); err == nil && seq > 0 {
			seqs = append(seqs, seq)
			continue
		}
		if _, _, err := wharf.ParseID(v); err != nil {
			return nil, nil, usageError{fmt.Errorf("--id %q is neither a message id (a UUID, as `%s` shows) nor a seq (a positive number)", v, listCmd)}
		}
		ids = append(ids, v)
	}
	return ids, seqs, nil
}

// outboxSelector is the selection flags of the outbox commands.
type outboxSelector struct {
	all   bool
	ids   []string
	topic string
	key   string
	limit int
}

func (s *outboxSelector) register(cmd *cobra.Command, withAll bool) {
	cmd.Flags().StringSliceVar(&s.ids, "id", nil, "message ids (UUIDs) or outbox seqs (numbers); repeat or comma-separate")
	cmd.Flags().StringVar(&s.topic, "topic", "", "only this topic")
	cmd.Flags().StringVar(&s.key, "key", "", "only this key")
	if withAll {
		cmd.Flags().BoolVar(&s.all, "all", false, "every pending message (required when no --id, --topic or --key is given)")
	}
}

func (s *outboxSelector) filter(requireSelector bool) (wharf.PendingFilter, error) {
	if requireSelector && !s.all && len(s.ids) == 0 && s.topic == "" && s.key == "" {
		return wharf.PendingFilter{}, usageError{errors.New("say which messages: --id ID, --topic T, --key K, or --all")}
	}
	ids, seqs, err := parseIDs(s.ids, "wharf outbox list")
	if err != nil {
		return wharf.PendingFilter{}, err
	}
	return wharf.PendingFilter{IDs: ids, Seqs: seqs, Topic: s.topic, Key: s.key, All: s.all, Limit: s.limit}, nil
}

// describe names the selection in a question.
func (s *outboxSelector) describe() string {
	var parts []string
	if len(s.ids) > 0 {
		parts = append(parts, "--id "+strings.Join(s.ids, ","))
	}
	if s.topic != "" {
		parts = append(parts, fmt.Sprintf("--topic %q", s.topic))
	}
	if s.key != "" {
		parts = append(parts, fmt.Sprintf("--key %q", s.key))
	}
	if len(parts) == 0 {
		return "--all"
	}
	return strings.Join(parts, " ")
}

// inFlightNote is printed by cancel and reschedule: the table is all they
// change, and a relay may be delivering a due message at this moment.
const inFlightNote = "Held messages (scheduled for later, or waiting for a retry) are read again before delivery, so this applies to them. A message that was already due may be at a sink at this moment: it can still be delivered once."

func newOutboxCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "List, show, cancel or reschedule messages still waiting in the outbox",
		Long: `Inspect and change messages that are in the outbox and not yet delivered.

Held messages (scheduled for later with deliver_at, or waiting for a retry) are read
again from the table before the relay delivers them: cancelling one means it is never
delivered, rescheduling one means it is delivered at its new time. A message that is
already due may be at a sink at this moment: cancel and reschedule cannot hold it back.

--id takes message ids (UUIDs, as 'wharf outbox list' shows) or seqs (numbers).`,
	}
	cmd.AddCommand(newOutboxListCmd(g), newOutboxShowCmd(g), newOutboxCancelCmd(g), newOutboxRescheduleCmd(g))
	return cmd
}

func newOutboxListCmd(g *globals) *cobra.Command {
	var sel outboxSelector
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List pending messages in seq order: state, age, attempts and last error",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sel.limit < 1 {
				return usageError{fmt.Errorf("--limit must be at least 1 (got %d)", sel.limit)}
			}
			f, err := sel.filter(false)
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			ps, err := c.PendingMessages(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				return writePendingJSON(g.stdout, ps)
			}
			now := time.Now()
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SEQ\tID\tTOPIC\tKEY\tSTATE\tAGE\tATTEMPTS\tLAST ERROR")
			for _, p := range ps {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.Seq, p.ID, p.Topic, p.Key, pendingState(p, now),
					roundAge(now.Sub(p.CreatedAt)), p.Attempts, oneLine(p.LastError, 80))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(ps) == sel.limit {
				fmt.Fprintf(g.stderr, "(first %d shown; raise --limit or narrow with --topic / --key for more)\n", sel.limit)
			}
			return nil
		},
	}
	sel.register(cmd, false)
	cmd.Flags().IntVar(&sel.limit, "limit", 100, "most messages to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}

// pendingState says why a message has not gone out yet.
func pendingState(p wharf.PendingMessage, now time.Time) string {
	switch {
	case p.Scheduled:
		return "scheduled for " + p.DeliverAt.Local().Format(time.RFC3339)
	case p.Attempts > 0 && !p.NextAttemptAt.IsZero() && p.NextAttemptAt.After(now):
		return fmt.Sprintf("retrying at %s", p.NextAttemptAt.Local().Format(time.RFC3339))
	case p.Attempts > 0:
		return "retrying"
	case p.HeldBehind != nil:
		return "held behind " + p.HeldBehind.ID + " (" + holderState(p.HeldBehind) + ")"
	default:
		return "due"
	}
}

// holderState says what the message a held message waits behind waits for.
func holderState(h *wharf.Holder) string {
	when := "-"
	if !h.Until.IsZero() {
		when = h.Until.Local().Format(time.RFC3339)
	}
	if h.Reason == wharf.BlockedRetrying {
		return "retrying at " + when
	}
	return "scheduled until " + when
}

func newOutboxShowCmd(g *globals) *cobra.Command {
	var ids []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show [ID|SEQ...]",
		Short: "Show pending messages in full: headers, payload, schedule, attempts and last error",
		RunE: func(cmd *cobra.Command, args []string) error {
			all := append(append([]string(nil), ids...), args...)
			if len(all) == 0 {
				return usageError{errors.New("say which messages: wharf outbox show ID (a message id or a seq; see wharf outbox list)")}
			}
			uuids, seqs, err := parseIDs(all, "wharf outbox list")
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			ps, err := c.PendingMessages(cmd.Context(), wharf.PendingFilter{IDs: uuids, Seqs: seqs, Limit: len(all)})
			if err != nil {
				return err
			}
			if len(ps) == 0 {
				return fmt.Errorf("no pending message has id %s: it was delivered, dead-lettered (see wharf dead list) or cancelled", strings.Join(all, ", "))
			}
			if asJSON {
				return writePendingJSON(g.stdout, ps)
			}
			now := time.Now()
			for i, p := range ps {
				if i > 0 {
					fmt.Fprintln(g.stdout)
				}
				writePendingDetail(g.stdout, p, now)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&ids, "id", nil, "message ids (UUIDs) or outbox seqs (numbers); repeat or comma-separate")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}

func writePendingDetail(out io.Writer, p wharf.PendingMessage, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fmt.Fprintf(w, "id\t%s\n", p.ID)
	fmt.Fprintf(w, "seq\t%d\n", p.Seq)
	fmt.Fprintf(w, "topic\t%s\n", p.Topic)
	fmt.Fprintf(w, "key\t%s\n", dash(p.Key))
	fmt.Fprintf(w, "lane\t%d\n", p.Lane)
	fmt.Fprintf(w, "state\t%s\n", pendingState(p, now))
	fmt.Fprintf(w, "created at\t%s (%s ago)\n", p.CreatedAt.Local().Format(time.RFC3339Nano), roundAge(now.Sub(p.CreatedAt)))
	deliverAt := "-"
	if !p.DeliverAt.IsZero() {
		deliverAt = p.DeliverAt.Local().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(w, "deliver at\t%s\n", deliverAt)
	fmt.Fprintf(w, "dedup key\t%s\n", dash(p.DedupKey))
	fmt.Fprintf(w, "attempts\t%d failed\n", p.Attempts)
	if p.Attempts > 0 {
		fmt.Fprintf(w, "next attempt\t%s\n", p.NextAttemptAt.Local().Format(time.RFC3339Nano))
		fmt.Fprintf(w, "last error\t%s\n", oneLine(p.LastError, 4096))
	}
	writeHeadersAndPayload(w, out, p.Headers, p.Payload)
}

// writeHeadersAndPayload ends a message's detail: its headers in name order
// in w, then its payload on lines of its own in out (base64 when it is not
// UTF-8).
func writeHeadersAndPayload(w *tabwriter.Writer, out io.Writer, headers map[string]string, payload []byte) {
	names := make([]string, 0, len(headers))
	for k := range headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, k := range names {
		label := ""
		if i == 0 {
			label = "headers"
		}
		fmt.Fprintf(w, "%s\t%s: %s\n", label, k, headers[k])
	}
	if utf8.Valid(payload) {
		fmt.Fprintf(w, "payload\t%d bytes\n", len(payload))
		_ = w.Flush()
		fmt.Fprintf(out, "%s\n", payload)
		return
	}
	fmt.Fprintf(w, "payload\t%d bytes, not UTF-8, in base64:\n", len(payload))
	_ = w.Flush()
	fmt.Fprintf(out, "%s\n", base64.StdEncoding.EncodeToString(payload))
}

// messageJSON is the JSON form of a pending message in `wharf outbox
// --json`: snake_case names; payload embedded when it is valid JSON,
// otherwise base64 with "payload_encoding": "base64".
type messageJSON struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Lane            *int              `json:"lane,omitempty"`
	State           string            `json:"state,omitempty"`
	CreatedAt       time.Time         `json:"created_at"`
	DeliverAt       *time.Time        `json:"deliver_at"`
	DedupKey        *string           `json:"dedup_key"`
	Attempts        int               `json:"attempts"`
	LastError       string            `json:"last_error,omitempty"`
	NextAttemptAt   *time.Time        `json:"next_attempt_at,omitempty"`
	HeldBehind      *holderJSON       `json:"held_behind,omitempty"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding,omitempty"`
}

func newMessageJSON(m *wharf.Message) messageJSON {
	j := messageJSON{ID: m.ID, Seq: m.Seq, Topic: m.Topic, CreatedAt: m.CreatedAt.UTC(), Headers: m.Headers}
	if m.Key != "" {
		j.Key = &m.Key
	}
	if m.DedupKey != "" {
		j.DedupKey = &m.DedupKey
	}
	if !m.DeliverAt.IsZero() {
		t := m.DeliverAt.UTC()
		j.DeliverAt = &t
	}
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	if envelope.ValidJSON(m.Payload) {
		j.Payload = json.RawMessage(m.Payload)
	} else {
		b, _ := json.Marshal(base64.StdEncoding.EncodeToString(m.Payload))
		j.Payload, j.PayloadEncoding = b, "base64"
	}
	return j
}

// holderJSON is the message a held message waits behind.
type holderJSON struct {
	ID       string    `json:"id"`
	Seq      int64     `json:"seq"`
	Reason   string    `json:"reason"`
	Until    time.Time `json:"until"`
	Attempts int       `json:"attempts"`
}

func newHolderJSON(h *wharf.Holder) *holderJSON {
	if h == nil {
		return nil
	}
	return &holderJSON{ID: h.ID, Seq: h.Seq, Reason: string(h.Reason), Until: h.Until.UTC(), Attempts: h.Attempts}
}

func writePendingJSON(out io.Writer, ps []wharf.PendingMessage) error {
	enc := json.NewEncoder(out)
	now := time.Now()
	for _, p := range ps {
		j := newMessageJSON(&p.Message)
		lane := p.Lane
		j.Lane = &lane
		j.State = strings.Fields(pendingState(p, now))[0]
		j.Attempts = p.Attempts
		j.LastError = p.LastError
		if !p.NextAttemptAt.IsZero() {
			t := p.NextAttemptAt.UTC()
			j.NextAttemptAt = &t
		}
		j.HeldBehind = newHolderJSON(p.HeldBehind)
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

func newOutboxCancelCmd(g *globals) *cobra.Command {
	var sel outboxSelector
	var yes, verbose bool
	cmd := &cobra.Command{
		Use:   "cancel",
		Short: "Delete pending messages so they are never delivered (asks for confirmation)",
		Long: `Deletes the selected messages from the outbox, with their retry state. A held message
(scheduled for later, or waiting for a retry) is read again before delivery, so once
cancelled it is never delivered; the messages of its key queued behind it go out when
the relay would have delivered it (its deliver_at or next retry) and finds it gone, or
when its lane changes hands. A message that is already due may be at a sink at this
moment: it can still be delivered once. The payloads are gone for good.

On a terminal it shows what is selected and asks for confirmation; otherwise (scripts,
CI) it needs --yes.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sel.filter(true)
			if err != nil {
				return err
			}
			if !yes && !g.terminal {
				return g.confirm("", "wharf outbox cancel", false)
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			if !yes {
				const preview = 10
				pf := f
				pf.Limit = preview + 1
				ps, err := c.PendingMessages(cmd.Context(), pf)
				if err != nil {
					return err
				}
				if len(ps) == 0 {
					if len(sel.ids) > 0 {
						return nothingMatches(&sel)
					}
					fmt.Fprintf(g.stdout, "no pending message matches %s: nothing to cancel\n", sel.describe())
					return nil
				}
				if g.terminal {
					var b strings.Builder
					now := time.Now()
					w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "SEQ\tID\tTOPIC\tKEY\tSTATE")
					for _, p := range ps[:min(len(ps), preview)] {
						fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", p.Seq, p.ID, p.Topic, p.Key, pendingState(p, now))
					}
					_ = w.Flush()
					fmt.Fprint(g.stderr, b.String())
				}
				count := strconv.Itoa(len(ps))
				if len(ps) > preview {
					count = fmt.Sprintf("more than %d", preview)
				}
				what := "pending messages"
				if len(ps) == 1 {
					what = "pending message"
				}
				q := fmt.Sprintf("Cancel %s %s selected by %s in schema %s? Their payloads are deleted for good. %s",
					count, what, sel.describe(), g.schema, inFlightNote)
				if err := g.confirm(q, "wharf outbox cancel", false); err != nil {
					return err
				}
			}
			n, err := c.CancelMessages(cmd.Context(), f)
			if err != nil {
				return err
			}
			if n == 0 && len(sel.ids) > 0 {
				return nothingMatches(&sel)
			}
			fmt.Fprintf(g.stdout, "%s cancelled.%s\n", plural(int64(n), "message"), note(verbose))
			return nil
		},
	}
	sel.register(cmd, true)
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation (required when standard input is not a terminal)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also say what cancelling does to held messages and to messages already at a sink")
	return cmd
}

// note is inFlightNote, after a report, with --verbose.
func note(verbose bool) string {
	if !verbose {
		return ""
	}
	return " " + inFlightNote
}

// nothingMatches is the error of a cancel or reschedule whose --id names no
// pending message.
func nothingMatches(sel *outboxSelector) error {
	return fmt.Errorf("no pending message matches %s: it was delivered, dead-lettered (see wharf dead list) or cancelled, or the id is wrong (see wharf outbox list)", sel.describe())
}

// parseAt reads --at: "now", an RFC 3339 time, or a duration from now
// ("+10m", "90s", "1h30m").
func parseAt(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "now") {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "+")); err == nil && !strings.HasPrefix(s, "-") {
		return now.Add(d), nil
	}
	return time.Time{}, usageError{fmt.Errorf("--at %q: write now, a time such as 2026-01-02T15:04:05Z (RFC 3339), or a duration from now such as +10m", s)}
}

func newOutboxRescheduleCmd(g *globals) *cobra.Command {
	var sel outboxSelector
	var at string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "reschedule",
		Short: "Set when pending messages are delivered: now (the default), a time, or a delay",
		Long: `Sets the selected messages' delivery time (deliver_at), keeping their ids, payloads,
headers and dedup keys. A held message (scheduled for later, or waiting for a retry) is
read again before delivery, so it goes out at its new time, and its key's later messages
stay behind it. A message waiting for a retry keeps its attempt count; its next attempt
moves to the new time. A message that is already due may be at a sink at this moment: it
is delivered now whatever the new time.`,
		Example: `  wharf outbox reschedule --id 0000002a-0000-8001-9c1f-3e0b7a4d5c61          # deliver now
  wharf outbox reschedule --topic reminders --at +2h
  wharf outbox reschedule --key order-42 --at 2026-01-02T09:00:00Z`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sel.filter(true)
			if err != nil {
				return err
			}
			when, err := parseAt(at, time.Now())
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			n, err := c.RescheduleMessages(cmd.Context(), f, when)
			if err != nil {
				return err
			}
			shown := "now"
			if !when.IsZero() {
				shown = when.Local().Format(time.RFC3339)
			}
			if n == 0 && len(sel.ids) > 0 {
				return nothingMatches(&sel)
			}
			fmt.Fprintf(g.stdout, "%s rescheduled to %s.%s\n", plural(int64(n), "message"), shown, note(verbose))
			return nil
		},
	}
	sel.register(cmd, true)
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also say what rescheduling does to held messages and to messages already at a sink")
	cmd.Flags().StringVar(&at, "at", "now", "new delivery time: now, an RFC 3339 time (2026-01-02T15:04:05Z) or a delay such as +10m")
	return cmd
}
