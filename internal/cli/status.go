package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/laneset"
	"github.com/wharfhq/wharf/wharfwebhook"
)

// redactURL shows a sink or database URL without its secrets: the password
// of user info, every query value except the options known to be harmless,
// a webhook URL's path past its first segment (Slack, Discord and the like
// carry the credential there), and a key=value DSN reduced to its host, port
// and database.
func redactURL(raw string) string {
	if !strings.Contains(raw, "://") && strings.Contains(raw, "=") {
		cfg, err := pgconn.ParseConfig(raw)
		if err != nil {
			return "(unparsable connection string)"
		}
		return fmt.Sprintf("host=%s port=%d dbname=%s", cfg.Host, cfg.Port, cfg.Database)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.Opaque != "" && strings.Contains(u.Opaque, "@") {
		// user:password@host with the scheme forgotten: url.Parse sees a
		// scheme "user" and no user info to redact.
		return u.Scheme + ":xxxxx" + u.Opaque[strings.LastIndexByte(u.Opaque, '@'):]
	}
	if u.Scheme == "http" || u.Scheme == "https" {
		return wharfwebhook.RedactURL(raw)
	}
	q := u.Query()
	changed := false
	for k := range q {
		if !harmlessOption(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// harmlessOption reports whether a URL option is known to hold no
// credential; every other option's value is hidden in logs.
func harmlessOption(k string) bool {
	switch strings.ToLower(k) {
	case "stream", "create_stream", "subject_template", "ack_timeout", "strict_order", "allow_system_subjects",
		"topic_template", "client_id", "max_message_bytes", "delivery_timeout", "compression", "tls",
		"exchange", "routing_key_template", "mandatory", "confirm_timeout", "max_in_flight", "max_message_size",
		"dial_timeout", "heartbeat", "name", "stream_template", "maxlen", "timeout", "max_payload",
		"sslmode", "connect_timeout", "application_name", "target_session_attrs", "default_query_exec_mode",
		"pool_max_conns", "search_path":
		return true
	}
	return false
}

func (g *globals) client(cmd *cobra.Command) (*wharf.Client, func(), error) {
	pool, err := g.connect(cmd.Context(), 2)
	if err != nil {
		return nil, nil, err
	}
	c, err := wharf.NewClient(pool, &wharf.Config{Schema: g.schema, Logger: g.log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, pool.Close, nil
}

func newStatusCmd(g *globals) *cobra.Command {
	var asJSON, acrossTopics bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show messages due and scheduled, the oldest due message, relays, lanes and dead letters",
		Long: `Shows the outbox's state with bounded queries whatever the backlog:

  messages       counted exactly while the outbox table is at most 16 MiB, otherwise
                 estimated from a random sample of about 2,048 of its pages ("~")
  oldest due     age of the oldest message that should be on its way: not scheduled for
                 later nor held behind a scheduled message of its key (messages waiting
                 for a retry count: they are late). One index probe per lane; a lane
                 whose first message is scheduled is read up to 2,000 rows further, and
                 lanes where that was not enough are named
  relays         every registered relay with its last heartbeat and the lanes it leases;
                 a relay whose heartbeat is older than the lease TTL is shown dead
  lanes          per owner, with expired leases (a crashed relay's) and free lanes
  flows          on a schema with the flow tables: steps due and not running, running,
                 instances awaiting a signal, parents joining their children, failed
                 instances (counted as the wharf_flow_* gauges count them, through the
                 partial indexes of the active and failed instances) and live runners

--json prints the same with snake_case names, durations in seconds and lanes
summarised per owner.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context(), 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			c, err := wharf.NewClient(pool, &wharf.Config{Schema: g.schema, Logger: g.log, OrderAcrossTopics: acrossTopics})
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			flows, err := readFlowsStatus(cmd.Context(), pool, g.schema)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				sj := statusJSONOf(st)
				sj.Flows = flows
				return enc.Encode(sj)
			}
			return writeStatus(g.stdout, st, flows)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&acrossTopics, "order-across-topics", false, "the relays keep order per key across topics: a scheduled message holds its key's messages of every topic")
	markSettings(cmd.Flags(), "order-across-topics")
	return cmd
}

// approx writes a count, with "~" when it is an estimate.
func approx(c wharf.Count) string {
	if c.Exact {
		return strconv.FormatInt(c.N, 10)
	}
	return "~" + strconv.FormatInt(c.N, 10)
}

func writeStatus(out io.Writer, st *wharf.Status, flows *flowsStatus) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "schema\t%s\n", st.Schema)
	if st.WAL != nil {
		state := "no relay streams it"
		if st.WAL.Active {
			state = "a relay streams it"
		}
		lag := ""
		if st.WAL.Active {
			lag = fmt.Sprintf(", oldest unsettled commit %s old", st.WAL.OldestUnsettled.Round(time.Millisecond))
		}
		fmt.Fprintf(w, "mode\tWAL: slot %s, %s, %d bytes of WAL behind%s (%s)\n", st.WAL.Slot, state, st.WAL.LagBytes, lag, st.WAL.WALStatus)
		if st.WAL.WALStatus == "missing" || st.WAL.WALStatus == "lost" {
			fmt.Fprintf(w, "\tthe slot is %s: enqueues are refused until `wharf migrate up --mode wal --schema %s` creates it again\n", st.WAL.WALStatus, st.Schema)
		}
	}
	how := "counted"
	if !st.Messages.Exact {
		how = "estimated from a sample"
	}
	due := wharf.Count{N: st.Due(), Exact: st.Messages.Exact && st.Scheduled.Exact}
	fmt.Fprintf(w, "messages\t%s (%s): %s due, %s scheduled for later\n", approx(st.Messages), how, approx(due), approx(st.Scheduled))
	oldest := "none"
	if st.OldestDueAge > 0 {
		oldest = roundAge(st.OldestDueAge)
	}
	if len(st.OldestDueUnknown) > 0 {
		oldest += fmt.Sprintf(" (lanes %s not looked into: more than %d scheduled messages ahead)", laneset.Ranges(st.OldestDueUnknown), wharf.StatusScanBound)
	}
	fmt.Fprintf(w, "oldest due\t%s\n", oldest)
	fmt.Fprintf(w, "retrying\t%s\n", approx(st.Retrying))
	fmt.Fprintf(w, "dead letters\t%s\n", approx(st.DeadLetters))
	fmt.Fprintf(w, "dead tuples\t%d\n", st.DeadTuples)
	live := 0
	for _, r := range st.Relays {
		if r.Live {
			live++
		}
	}
	fmt.Fprintf(w, "relays\t%d live, %d dead (lease TTL %s)\n", live, len(st.Relays)-live, st.LeaseTTL)
	for _, r := range st.Relays {
		state := fmt.Sprintf("live, heartbeat %s ago", roundAge(r.HeartbeatAge))
		if !r.Live {
			state = fmt.Sprintf("DEAD, no heartbeat for %s", roundAge(r.HeartbeatAge))
		}
		lanes := "no lanes"
		if len(r.Lanes) > 0 {
			lanes = fmt.Sprintf("%d lanes (%s), leases end in %s unless renewed", len(r.Lanes), laneset.Ranges(r.Lanes), roundAge(r.LeaseLeft))
		}
		fmt.Fprintf(w, "  %s\t%s pid %d: %s; %s\n", r.ID, r.Host, r.PID, state, lanes)
	}
	ls := summariseLanes(st)
	fmt.Fprintf(w, "lanes\t%d leased, %d expired, %d free\n", ls.Leased, ls.Expired, ls.Free)
	for _, o := range ls.ByOwner {
		if o.Expired {
			fmt.Fprintf(w, "  expired\t%d lanes (%s) of %s, leases ended %s ago: waiting for a live relay to claim them\n", o.Count, o.Lanes, o.Owner, roundAge(-o.leaseLeft))
		}
	}
	if ls.Free > 0 {
		fmt.Fprintf(w, "  free\t%d lanes (%s)\n", ls.Free, ls.FreeLanes)
	}
	writeFlowsStatus(w, flows)
	return w.Flush()
}

// roundAge shows a duration to a useful precision.
func roundAge(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	default:
		return d.Round(100 * time.Millisecond).String()
	}
}

// statusJSON is `wharf status --json`: snake_case names, durations in
// seconds, lanes summarised per owner.
type statusJSON struct {
	Schema                string          `json:"schema"`
	Messages              int64           `json:"messages"`
	MessagesExact         bool            `json:"messages_exact"`
	Due                   int64           `json:"due"`
	Scheduled             int64           `json:"scheduled"`
	OldestDueAgeSeconds   float64         `json:"oldest_due_age_seconds"`
	OldestDueUnknownLanes string          `json:"oldest_due_unknown_lanes"`
	Retrying              int64           `json:"retrying"`
	RetryingExact         bool            `json:"retrying_exact"`
	DeadLetters           int64           `json:"dead_letters"`
	DeadLettersExact      bool            `json:"dead_letters_exact"`
	DeadTuples            int64           `json:"dead_tuples"`
	LeaseTTLSeconds       float64         `json:"lease_ttl_seconds"`
	Relays                []relayJSON     `json:"relays"`
	Lanes                 laneSummaryJSON `json:"lanes"`
	// Flows is left out on a schema without the flow tables.
	Flows *flowsStatus `json:"flows,omitempty"`
}

type relayJSON struct {
	RelayID             string    `json:"relay_id"`
	Host                string    `json:"host"`
	PID                 int       `json:"pid"`
	StartedAt           time.Time `json:"started_at"`
	HeartbeatAgeSeconds float64   `json:"heartbeat_age_seconds"`
	Live                bool      `json:"live"`
	LaneCount           int       `json:"lane_count"`
	Lanes               string    `json:"lanes"`
	LeaseLeftSeconds    float64   `json:"lease_left_seconds"`
}

type laneSummaryJSON struct {
	Total     int             `json:"total"`
	Leased    int             `json:"leased"`
	Expired   int             `json:"expired"`
	Free      int             `json:"free"`
	FreeLanes string          `json:"free_lanes"`
	ByOwner   []laneOwnerJSON `json:"by_owner"`
}

type laneOwnerJSON struct {
	Owner     string `json:"owner"`
	Count     int    `json:"count"`
	Lanes     string `json:"lanes"`
	Expired   bool   `json:"expired"`
	leaseLeft time.Duration
}

func secs(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// summariseLanes groups the lanes by owner, apart for live and expired
// leases, in owner order.
func summariseLanes(st *wharf.Status) laneSummaryJSON {
	out := laneSummaryJSON{Total: len(st.Lanes), ByOwner: []laneOwnerJSON{}}
	type group struct {
		lanes []int
		left  time.Duration
	}
	groups := map[[2]string]*group{}
	var free []int
	for _, l := range st.Lanes {
		if l.Owner == "" {
			free = append(free, l.Lane)
			continue
		}
		state := "leased"
		if l.Expired() {
			state = "expired"
			out.Expired++
		} else {
			out.Leased++
		}
		k := [2]string{l.Owner, state}
		gr := groups[k]
		if gr == nil {
			gr = &group{left: l.LeaseLeft}
			groups[k] = gr
		}
		gr.lanes = append(gr.lanes, l.Lane)
		gr.left = max(gr.left, l.LeaseLeft)
	}
	keys := make([][2]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] > keys[j][1]
	})
	for _, k := range keys {
		gr := groups[k]
		out.ByOwner = append(out.ByOwner, laneOwnerJSON{Owner: k[0], Count: len(gr.lanes), Lanes: laneset.Ranges(gr.lanes), Expired: k[1] == "expired", leaseLeft: gr.left})
	}
	out.Free = len(free)
	out.FreeLanes = laneset.Ranges(free)
	return out
}

func statusJSONOf(st *wharf.Status) statusJSON {
	out := statusJSON{
		Schema:                st.Schema,
		Messages:              st.Messages.N,
		MessagesExact:         st.Messages.Exact,
		Due:                   st.Due(),
		Scheduled:             st.Scheduled.N,
		OldestDueAgeSeconds:   secs(st.OldestDueAge),
		OldestDueUnknownLanes: laneset.Ranges(st.OldestDueUnknown),
		Retrying:              st.Retrying.N,
		RetryingExact:         st.Retrying.Exact,
		DeadLetters:           st.DeadLetters.N,
		DeadLettersExact:      st.DeadLetters.Exact,
		DeadTuples:            st.DeadTuples,
		LeaseTTLSeconds:       secs(st.LeaseTTL),
		Relays:                []relayJSON{},
		Lanes:                 summariseLanes(st),
	}
	for _, r := range st.Relays {
		out.Relays = append(out.Relays, relayJSON{
			RelayID: r.ID, Host: r.Host, PID: r.PID, StartedAt: r.StartedAt.UTC(),
			HeartbeatAgeSeconds: secs(r.HeartbeatAge), Live: r.Live,
			LaneCount: len(r.Lanes), Lanes: laneset.Ranges(r.Lanes), LeaseLeftSeconds: secs(r.LeaseLeft),
		})
	}
	return out
}

type deadSelector struct {
	all   bool
	ids   []string
	topic string
	key   string
	limit int
}

func (s *deadSelector) register(cmd *cobra.Command, withAll bool) {
	cmd.Flags().StringSliceVar(&s.ids, "id", nil, "message ids (UUIDs) or outbox seqs (numbers); repeat or comma-separate")
	cmd.Flags().StringVar(&s.topic, "topic", "", "only this topic")
	cmd.Flags().StringVar(&s.key, "key", "", "only this key")
	if withAll {
		cmd.Flags().BoolVar(&s.all, "all", false, "every dead letter (required when no --id, --topic or --key is given)")
	}
}

func (s *deadSelector) filter(requireSelector bool) (wharf.DeadLetterFilter, error) {
	if requireSelector && !s.all && len(s.ids) == 0 && s.topic == "" && s.key == "" {
		return wharf.DeadLetterFilter{}, usageError{errors.New("say which dead letters: --id N, --topic T, --key K, or --all")}
	}
	ids, seqs, err := parseIDs(s.ids, "wharf dead list")
	if err != nil {
		return wharf.DeadLetterFilter{}, err
	}
	return wharf.DeadLetterFilter{IDs: ids, Seqs: seqs, Topic: s.topic, Key: s.key, Limit: s.limit}, nil
}

// describe names the selection in a question.
func (s *deadSelector) describe() string {
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

func newDeadCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List, retry or purge dead letters",
	}
	var listSel deadSelector
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters in id order",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listSel.limit < 1 {
				return usageError{fmt.Errorf("--limit must be at least 1 (got %d)", listSel.limit)}
			}
			f, err := listSel.filter(false)
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			dead, err := c.DeadLetters(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeDeadJSON(g.stdout, dead)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SEQ\tID\tTOPIC\tKEY\tATTEMPTS\tFAILED AT\tCAUSE")
			for _, d := range dead {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Seq, d.ID, d.Topic, d.Key, d.Attempts, d.FailedAt.UTC().Format(time.RFC3339), oneLine(deadCause(d), 100))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(dead) > 0 {
				fmt.Fprintln(g.stderr, "(the cause is the end of the last error; wharf dead show ID prints it in full, with the payload)")
			}
			return nil
		},
	}
	listSel.register(list, false)
	list.Flags().IntVar(&listSel.limit, "limit", 1000, "most rows to list")
	list.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")

	var showIDs []string
	var showJSON bool
	show := &cobra.Command{
		Use:   "show ID|SEQ...",
		Short: "Show dead letters in full: the whole last error, headers and payload",
		RunE: func(cmd *cobra.Command, args []string) error {
			all := append(append([]string(nil), showIDs...), args...)
			if len(all) == 0 {
				return usageError{errors.New("say which dead letters: wharf dead show ID (a message id or a seq; see wharf dead list)")}
			}
			uuids, seqs, err := parseIDs(all, "wharf dead list")
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			dead, err := c.DeadLetters(cmd.Context(), wharf.DeadLetterFilter{IDs: uuids, Seqs: seqs, Limit: len(all)})
			if err != nil {
				return err
			}
			if len(dead) == 0 {
				return fmt.Errorf("no dead letter has id %s: see wharf dead list (a retried one is back in the outbox: wharf outbox show)", strings.Join(all, ", "))
			}
			if showJSON {
				return writeDeadJSON(g.stdout, dead)
			}
			for i, d := range dead {
				if i > 0 {
					fmt.Fprintln(g.stdout)
				}
				writeDeadDetail(g.stdout, d)
			}
			return nil
		},
	}
	show.Flags().StringSliceVar(&showIDs, "id", nil, "message ids (UUIDs) or outbox seqs (numbers); repeat or comma-separate")
	show.Flags().BoolVar(&showJSON, "json", false, "print one JSON object per line")

	retry := newDeadChangeCmd(g, "retry", "Move dead letters back into the outbox (same ids, delivered in id order per key)",
		"%s moved back to the outbox\n", false, (*wharf.Client).RetryDeadLetters)
	purge := newDeadChangeCmd(g, "purge", "Delete dead letters for good (asks for confirmation, or --yes)",
		"%s purged\n", true, (*wharf.Client).PurgeDeadLetters)
	cmd.AddCommand(list, show, retry, purge)
	return cmd
}

// newDeadChangeCmd builds `dead retry` and `dead purge`: both need an explicit
// selector, apply one client call and report how many dead letters it
// touched. A destructive one asks for confirmation on a terminal and needs
// --yes otherwise.
func newDeadChangeCmd(g *globals, use, short, report string, destructive bool, apply func(*wharf.Client, context.Context, wharf.DeadLetterFilter) (int, error)) *cobra.Command {
	var sel deadSelector
	var yes bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sel.filter(true)
			if err != nil {
				return err
			}
			if destructive && !yes && !g.terminal {
				return g.confirm("", "wharf dead "+use, false)
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			if destructive && !yes {
				// A bounded look, not a count: this is a question, not a report.
				const preview = 10
				lf := f
				lf.Limit = preview + 1
				dead, err := c.DeadLetters(cmd.Context(), lf)
				if err != nil {
					return err
				}
				if len(dead) == 0 {
					fmt.Fprintf(g.stdout, "no dead letter matches %s: nothing to %s\n", sel.describe(), use)
					return nil
				}
				count := countOf(int64(len(dead)), "dead letter")
				if len(dead) > preview {
					count = fmt.Sprintf("more than %d dead letters", preview)
				}
				q := fmt.Sprintf("%s %s selected by %s in schema %s? This cannot be undone.",
					strings.ToUpper(use[:1])+use[1:], count, sel.describe(), g.schema)
				if err := g.confirm(q, "wharf dead "+use, false); err != nil {
					return err
				}
			}
			n, err := apply(c, cmd.Context(), f)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, report, plural(int64(n), "dead letter"))
			return nil
		},
	}
	sel.register(cmd, true)
	if destructive {
		cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation (required when standard input is not a terminal)")
	}
	return cmd
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}
