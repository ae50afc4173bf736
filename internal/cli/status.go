package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf"
)

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	q := u.Query()
	changed := false
	for k := range q {
		if sensitiveOption(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// sensitiveOption reports whether a sink URL option may hold a credential
// (a webhook's static Authorization header, a SASL password), whose value
// must not reach logs.
func sensitiveOption(k string) bool {
	k = strings.ToLower(k)
	for _, w := range []string{"header", "secret", "password", "token", "sasl", "key"} {
		if strings.Contains(k, w) && !strings.HasSuffix(k, "_template") && !strings.HasSuffix(k, "_env") && !strings.HasSuffix(k, "_file") {
			return true
		}
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
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show backlog, oldest message age, relays, lanes and dead letters (cheap queries only)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			owners := map[string]int{}
			for _, l := range st.Lanes {
				name := l.Owner
				if name == "" || l.LeaseUntil.Before(time.Now()) {
					name = "(unowned)"
				}
				owners[name]++
			}
			names := make([]string, 0, len(owners))
			for n := range owners {
				names = append(names, n)
			}
			sort.Strings(names)
			var lanes []string
			for _, n := range names {
				lanes = append(lanes, fmt.Sprintf("%s=%d", n, owners[n]))
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "schema\t%s\n", st.Schema)
			fmt.Fprintf(w, "backlog\t~%d messages (statistics estimate)\n", st.BacklogEstimate)
			fmt.Fprintf(w, "oldest message\t%s\n", st.OldestAge.Round(time.Millisecond))
			fmt.Fprintf(w, "retrying\t%d\n", st.Retrying)
			fmt.Fprintf(w, "dead letters\t%d\n", st.DeadLetters)
			fmt.Fprintf(w, "dead tuples\t%d\n", st.DeadTuples)
			fmt.Fprintf(w, "relays\t%d %s\n", len(st.Relays), strings.Join(st.Relays, " "))
			fmt.Fprintf(w, "lanes\t%d: %s\n", len(st.Lanes), strings.Join(lanes, " "))
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

type deadSelector struct {
	all   bool
	ids   []int64
	topic string
	limit int
}

func (s *deadSelector) register(cmd *cobra.Command, withAll bool) {
	cmd.Flags().Int64SliceVar(&s.ids, "id", nil, "message ids (repeat or comma-separate)")
	cmd.Flags().StringVar(&s.topic, "topic", "", "only this topic")
	if withAll {
		cmd.Flags().BoolVar(&s.all, "all", false, "every dead letter (required when no --id or --topic is given)")
	}
}

func (s *deadSelector) filter(requireSelector bool) (wharf.DeadLetterFilter, error) {
	if requireSelector && !s.all && len(s.ids) == 0 && s.topic == "" {
		return wharf.DeadLetterFilter{}, usageError{errors.New("say which dead letters: --id N, --topic T, or --all")}
	}
	return wharf.DeadLetterFilter{IDs: s.ids, Topic: s.topic, Limit: s.limit}, nil
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
			f, _ := listSel.filter(false)
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
				enc := json.NewEncoder(g.stdout)
				for _, d := range dead {
					if err := enc.Encode(d); err != nil {
						return err
					}
				}
				return nil
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTOPIC\tKEY\tATTEMPTS\tFAILED AT\tLAST ERROR")
			for _, d := range dead {
				fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Topic, d.Key, d.Attempts, d.FailedAt.Format(time.RFC3339), oneLine(d.LastError, 100))
			}
			return w.Flush()
		},
	}
	listSel.register(list, false)
	list.Flags().IntVar(&listSel.limit, "limit", 1000, "most rows to list")
	list.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")

	retry := newDeadChangeCmd(g, "retry", "Move dead letters back into the outbox (same ids, delivered in id order per key)",
		"%d dead letters moved back to the outbox\n", (*wharf.Client).RetryDeadLetters)
	purge := newDeadChangeCmd(g, "purge", "Delete dead letters for good",
		"%d dead letters purged\n", (*wharf.Client).PurgeDeadLetters)
	cmd.AddCommand(list, retry, purge)
	return cmd
}

// newDeadChangeCmd builds `dead retry` and `dead purge`: both need an explicit
// selector, apply one client call and report how many dead letters it touched.
func newDeadChangeCmd(g *globals, use, short, report string, apply func(*wharf.Client, context.Context, wharf.DeadLetterFilter) (int, error)) *cobra.Command {
	var sel deadSelector
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sel.filter(true)
			if err != nil {
				return err
			}
			c, closeFn, err := g.client(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			n, err := apply(c, cmd.Context(), f)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, report, n)
			return nil
		},
	}
	sel.register(cmd, true)
	return cmd
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}
