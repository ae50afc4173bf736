package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf/internal/store"
	"github.com/wharfhq/wharf/wharfflow"
)

func newFlowCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "flow",
		Short: "List, show, signal, cancel or retry durable flow instances (package wharfflow)",
		Long: `Operate the durable flows that run on this schema (package wharfflow, docs/flows.md).

Instances are addressed by id (as 'wharf flow list' shows). Signals may also address an
instance by flow and correlation key (--flow and --key).`,
	}
	cmd.AddCommand(newFlowListCmd(g), newFlowShowCmd(g), newFlowSignalCmd(g), newFlowCancelCmd(g), newFlowRetryCmd(g))
	return cmd
}

func (g *globals) flowClient(cmd *cobra.Command) (*wharfflow.Client, func(), error) {
	pool, err := g.connect(cmd.Context(), 2)
	if err != nil {
		return nil, nil, err
	}
	c, err := wharfflow.NewClient(pool, g.schema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	if err := g.flowsReady(cmd.Context(), c); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, pool.Close, nil
}

// flowsReady checks, before a flow command reads or changes anything, that
// the schema has the flow tables, so a schema never migrated (or migrated
// before flows came, with migration 7) is said in one line with the command
// that fixes it, not as PostgreSQL's "relation does not exist". (A role that
// may not read them is not refused here: a producer may signal without.)
func (g *globals) flowsReady(ctx context.Context, c *wharfflow.Client) error {
	s, err := c.Setup(ctx)
	if err != nil {
		return err
	}
	if !s.Installed {
		return fmt.Errorf("schema %s has no flow tables (they come with migration 7): run `wharf migrate up --schema %[1]s`", g.schema)
	}
	return nil
}

// flowSchemaErr is err for the command line: a statement naming a table or
// column the schema lacks (a schema older than this build's flows) says to
// migrate it.
func (g *globals) flowSchemaErr(err error) error {
	if store.IsUndefined(err) {
		return fmt.Errorf("schema %s is older than this build's flows: run `wharf migrate up --schema %[1]s` (%w)", g.schema, err)
	}
	return err
}

func parseInstanceID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || id < 1 {
		return 0, usageError{fmt.Errorf("instance id %q must be a positive number (as 'wharf flow list' shows)", arg)}
	}
	return id, nil
}

func newFlowListCmd(g *globals) *cobra.Command {
	var o wharfflow.ListOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List instances, newest first: flow, key, status, step, attempt, age and error",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Limit < 1 {
				return usageError{fmt.Errorf("--limit must be at least 1 (got %d)", o.Limit)}
			}
			if o.Status != "" && !slices.Contains(wharfflow.Statuses(), o.Status) {
				return usageError{fmt.Errorf("--status %q: use one of %s", o.Status, strings.Join(wharfflow.Statuses(), ", "))}
			}
			c, closeFn, err := g.flowClient(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			is, err := c.List(cmd.Context(), o)
			if err != nil {
				return g.flowSchemaErr(err)
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				for _, i := range is {
					if err := enc.Encode(i); err != nil {
						return err
					}
				}
				return nil
			}
			now := time.Now()
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tFLOW\tKEY\tSTATUS\tSTEP\tATTEMPT\tAGE\tERROR")
			for _, i := range is {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", i.ID, i.Flow, dashIfEmpty(i.Key), i.Status, stepLabel(i), i.Attempt,
					roundAge(now.Sub(i.CreatedAt)), oneLine(i.Error, 80))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(is) == o.Limit {
				fmt.Fprintf(g.stderr, "(first %d shown; raise --limit, narrow with --flow / --status / --key, or page with --before %d)\n",
					o.Limit, is[len(is)-1].ID)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Flow, "flow", "", "only instances of this flow")
	fl.StringVar(&o.Status, "status", "", "only instances with this status: "+strings.Join(wharfflow.Statuses(), ", "))
	fl.StringVar(&o.Key, "key", "", "only instances with this correlation key")
	fl.Int64Var(&o.Parent, "parent", 0, "only the children of this instance")
	fl.IntVar(&o.Limit, "limit", 100, "most instances to list")
	fl.Int64Var(&o.Before, "before", 0, "only instances with a lower id (the next page)")
	fl.BoolVar(&asJSON, "json", false, "one JSON object per line")
	return cmd
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newFlowShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := newFlowInstanceCmd(g, "show ID", "Show one instance: its state, step history with timings and errors, and signals",
		func(ctx context.Context, c *wharfflow.Client, id int64) error {
			d, err := c.Get(ctx, id)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(g.stdout).Encode(d)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			ts := func(t *time.Time) string {
				if t == nil {
					return "-"
				}
				return t.UTC().Format(time.RFC3339Nano)
			}
			fmt.Fprintf(w, "id\t%d\n", d.ID)
			fmt.Fprintf(w, "flow\t%s\n", d.Flow)
			fmt.Fprintf(w, "key\t%s\n", dashIfEmpty(d.Key))
			fmt.Fprintf(w, "status\t%s\n", d.Status)
			if d.Status == "awaiting" {
				fmt.Fprintf(w, "step\t%s, once %s comes (attempt %d)\n", d.Step, strings.Join(d.AwaitSignals, " or "), d.Attempt)
			} else {
				fmt.Fprintf(w, "step\t%s (attempt %d)\n", d.Step, d.Attempt)
			}
			fmt.Fprintf(w, "priority\t%d\n", d.Priority)
			fmt.Fprintf(w, "run at\t%s\n", ts(d.RunAt))
			if d.LeaseOwner != "" {
				fmt.Fprintf(w, "runner\t%s\n", d.LeaseOwner)
			}
			if d.ParentID != 0 {
				fmt.Fprintf(w, "parent\t%d\n", d.ParentID)
			}
			if len(d.AwaitSignals) > 0 {
				fmt.Fprintf(w, "awaiting\t%s\n", strings.Join(d.AwaitSignals, ", "))
			}
			if d.ConcurrencyKey != "" {
				fmt.Fprintf(w, "concurrency key\t%s\n", d.ConcurrencyKey)
			}
			if d.RateKey != "" {
				fmt.Fprintf(w, "rate key\t%s\n", d.RateKey)
			}
			fmt.Fprintf(w, "created at\t%s\n", d.CreatedAt.UTC().Format(time.RFC3339Nano))
			fmt.Fprintf(w, "finished at\t%s\n", ts(d.FinishedAt))
			fmt.Fprintf(w, "state\t%s\n", oneLine(string(d.State), 200))
			if len(d.Result) > 0 {
				fmt.Fprintf(w, "result\t%s\n", oneLine(string(d.Result), 200))
			}
			if d.Error != "" {
				// A retried or retrying instance keeps the error of its
				// last failed attempt: say it is not the current status.
				label := "error"
				if d.Status != "failed" {
					label = "last error"
				}
				fmt.Fprintf(w, "%s\t%s\n", label, oneLine(d.Error, 200))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "\nsteps:")
			w = tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "STEP\tATTEMPT\tOUTCOME\tSTARTED\tTOOK\tRUNNER\tERROR")
			for _, s := range d.Steps {
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Step, s.Attempt, s.Outcome, s.StartedAt.UTC().Format(time.RFC3339Nano),
					s.FinishedAt.Sub(s.StartedAt).Round(time.Microsecond), s.Runner, oneLine(s.Error, 80))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "\nsignals:")
			w = tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tNAME\tDEDUP KEY\tRECEIVED\tCONSUMED BY\tPAYLOAD")
			for _, s := range d.Signals {
				by := "pending"
				if s.ConsumedAt != nil {
					by = s.ConsumedStep
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, dashIfEmpty(s.DedupKey), s.CreatedAt.UTC().Format(time.RFC3339Nano),
					by, oneLine(string(s.Payload), 80))
			}
			return w.Flush()
		})
	cmd.Flags().BoolVar(&asJSON, "json", false, "the instance, its steps and signals as one JSON object")
	return cmd
}

func newFlowSignalCmd(g *globals) *cobra.Command {
	var s wharfflow.Signal
	var payload string
	cmd := &cobra.Command{
		Use:   "signal [ID] --name NAME",
		Short: "Send a signal to an instance (by id, or by --flow and --key)",
		Example: `  wharf flow signal 42 --name payment-captured --payload '{"cents": 4200}' --dedup-key psp-evt-981
  wharf flow signal --flow checkout --key o-1 --name payment-captured`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				id, err := parseInstanceID(args[0])
				if err != nil {
					return err
				}
				if s.Flow != "" || s.Key != "" {
					return usageError{errors.New("give an instance id or --flow and --key, not both")}
				}
				s.Instance = id
			} else if s.Flow == "" || s.Key == "" {
				return usageError{errors.New("address the instance: an id, or --flow and --key")}
			}
			if s.Name == "" {
				return usageError{errors.New("--name is required: the signal name the flow awaits")}
			}
			if payload != "" {
				if !json.Valid([]byte(payload)) {
					return usageError{fmt.Errorf("--payload must be JSON (quote a string: '\"text\"'), got %q", payload)}
				}
				s.Payload = json.RawMessage(payload)
			}
			c, closeFn, err := g.flowClient(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			ids, err := c.Send(cmd.Context(), s)
			if err != nil {
				return g.flowSchemaErr(noInstanceErr(err))
			}
			fmt.Fprintf(g.stdout, "signal %d recorded\n", ids[0])
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&s.Name, "name", "", "signal name (required)")
	fl.StringVar(&s.Flow, "flow", "", "with --key: the flow of the instance")
	fl.StringVar(&s.Key, "key", "", "with --flow: the instance's correlation key")
	fl.StringVar(&payload, "payload", "", "JSON payload")
	fl.StringVar(&s.DedupKey, "dedup-key", "", "a second signal with this key to the same instance is not recorded again")
	return cmd
}

func newFlowCancelCmd(g *globals) *cobra.Command {
	return newFlowInstanceCmd(g, "cancel ID", "Cancel an instance that has not ended, and its children; a step running now commits nothing",
		func(ctx context.Context, c *wharfflow.Client, id int64) error {
			n, err := c.Cancel(ctx, id)
			if err == nil {
				fmt.Fprintf(g.stdout, "cancelled %d instance(s)\n", n)
			}
			return noInstanceErr(err)
		})
}

func newFlowRetryCmd(g *globals) *cobra.Command {
	return newFlowInstanceCmd(g, "retry ID", "Run a failed instance's failed step again, from attempt 0",
		func(ctx context.Context, c *wharfflow.Client, id int64) error {
			err := c.Retry(ctx, id)
			if err == nil {
				fmt.Fprintf(g.stdout, "instance %d will run its failed step again\n", id)
			}
			return noInstanceErr(err)
		})
}

// newFlowInstanceCmd is a command on one instance given by its id: it checks
// the id, connects, and runs run.
func newFlowInstanceCmd(g *globals, use, short string, run func(context.Context, *wharfflow.Client, int64) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseInstanceID(args[0])
			if err != nil {
				return err
			}
			c, closeFn, err := g.flowClient(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			return g.flowSchemaErr(run(cmd.Context(), c, id))
		},
	}
}

// noInstanceErr is err for the command line: an instance the command cannot
// act on is said as the library says it, without its package's name.
func noInstanceErr(err error) error {
	if errors.Is(err, wharfflow.ErrNoInstance) {
		return errors.New(strings.TrimPrefix(err.Error(), "wharfflow: "))
	}
	return err
}

// stepLabel is the step the list shows: an awaiting instance runs its step
// only once a signal comes.
func stepLabel(i wharfflow.Instance) string {
	if i.Status == "awaiting" && len(i.AwaitSignals) > 0 {
		return "awaits " + strings.Join(i.AwaitSignals, ",") + " → " + i.Step
	}
	return i.Step
}
