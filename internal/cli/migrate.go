package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// migrator returns the schema's migrator and a small pool for it.
func (g *globals) migrator(cmd *cobra.Command) (*wharfmigrate.Migrator, *pgxpool.Pool, error) {
	m, err := wharfmigrate.New(g.schema)
	if err != nil {
		return nil, nil, err
	}
	pool, err := g.connect(cmd.Context(), 2)
	if err != nil {
		return nil, nil, err
	}
	return m, pool, nil
}

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create, upgrade or remove the outbox schema",
	}
	var mode string
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration",
		Long: `Apply every pending migration. With --mode wal, also switch the outbox to WAL mode
(messages kept in the WAL only, streamed by the relay from a logical replication slot
named after the schema): it needs wal_level=logical, a role with REPLICATION (or
superuser) and an empty outbox, and cannot be switched back to table mode. It revokes
EXECUTE on pg_logical_emit_message from PUBLIC, so that only producers write messages;
a role that cannot (not a superuser) is told the SQL a superuser must run. What it needs
is checked before any migration is applied. Run again on an outbox in WAL mode, it brings
it up to date and creates a missing or lost replication slot again.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch wharfmigrate.Mode(mode) {
			case wharfmigrate.ModeTable, wharfmigrate.ModeWAL:
			default:
				return usageError{fmt.Errorf("--mode must be table or wal, got %q", mode)}
			}
			m, pool, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			if wharfmigrate.Mode(mode) == wharfmigrate.ModeWAL {
				// Refuse before any migration: the schema stays as it was.
				if err := m.CheckWALMode(cmd.Context(), pool); err != nil {
					return err
				}
			}
			done, err := m.Up(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if len(done) == 0 {
				fmt.Fprintf(g.stdout, "schema %s is up to date (version %d)\n", g.schema, m.Latest())
			} else {
				fmt.Fprintf(g.stdout, "schema %s migrated up: applied %v, now at version %d\n", g.schema, done, m.Latest())
			}
			current, err := m.Mode(cmd.Context(), pool)
			if err != nil {
				return err
			}
			switch {
			case wharfmigrate.Mode(mode) == wharfmigrate.ModeWAL:
				// Also on an outbox in WAL mode: brings it up to date and
				// creates a missing or lost slot again.
				rep, err := m.SetWALModeReport(cmd.Context(), pool)
				if err != nil {
					return err
				}
				if len(rep.Revoked) > 0 {
					fmt.Fprintf(g.stdout, "revoked EXECUTE on %s from PUBLIC: only roles granted %s.enqueue_wal (wharf migrate roles) can write messages to the outbox\n", strings.Join(rep.Revoked, ", "), g.schema)
				}
				switch rep.Slot {
				case wharfmigrate.SlotMissing:
					fmt.Fprintf(g.stdout, "the replication slot %s was missing: created it again; enqueueing works again, from now on\n", g.schema)
				case wharfmigrate.SlotLost:
					fmt.Fprintf(g.stdout, "the replication slot %s was lost (PostgreSQL removed WAL it had not read): dropped it and created it again; enqueueing works again, from now on, and messages committed before it was lost and not yet delivered are gone\n", g.schema)
				}
				if rep.Switched {
					fmt.Fprintf(g.stdout, "schema %s switched to WAL mode: relays stream the replication slot %s; run `wharf migrate roles` (again) to give the producer and relay roles their WAL mode rights\n", g.schema, g.schema)
				} else if current == wharfmigrate.ModeWAL {
					fmt.Fprintf(g.stdout, "schema %s is in WAL mode, with its replication slot %s\n", g.schema, g.schema)
				}
			case wharfmigrate.Mode(mode) == wharfmigrate.ModeTable && current == wharfmigrate.ModeWAL && cmd.Flags().Changed("mode"):
				return fmt.Errorf("schema %s is in WAL mode, and switching back to table mode is not supported: create a new schema (--schema) in table mode and move producers to it", g.schema)
			}
			return nil
		},
	}
	up.Flags().StringVar(&mode, "mode", string(wharfmigrate.ModeTable), "where the outbox keeps messages: table (rows) or wal (the WAL only, streamed from a logical replication slot)")
	cmd.AddCommand(up)
	cmd.AddCommand(newMigrateDownCmd(g), newMigrateRolesCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, pool, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := m.Status(cmd.Context(), pool)
			if err != nil {
				return err
			}
			for _, s := range st {
				state := "pending"
				if !s.AppliedAt.IsZero() {
					state = "applied " + s.AppliedAt.Format("2006-01-02 15:04:05Z07:00")
				}
				fmt.Fprintf(g.stdout, "%03d_%s\t%s\n", s.Version, s.Name, state)
			}
			return nil
		},
	})
	var printDown bool
	print := &cobra.Command{
		Use:   "print",
		Short: "Print the migration SQL (for teams that run their own migration tool)",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			m, err := wharfmigrate.New(g.schema)
			if err != nil {
				return err
			}
			fmt.Fprint(g.stdout, m.SQL(!printDown))
			return nil
		},
	}
	print.Flags().BoolVar(&printDown, "down", false, "print the down migrations instead")
	cmd.AddCommand(print)
	return cmd
}

func newMigrateDownCmd(g *globals) *cobra.Command {
	var steps, target int
	var dryRun, force bool
	down := &cobra.Command{
		Use:   "down",
		Short: "Revert the latest migration (or --steps N, or down to --target-version N)",
		Long: `Reverts migrations, one by default. Reverting version 1 drops the outbox and every
table Wharf created; reverting version 2 drops the message ids' nonces, so pending
messages would be delivered under other ids. So when either is to be reverted it
refuses while the outbox or the dead-letter table holds rows: deliver, cancel ('wharf
outbox cancel') or purge ('wharf dead purge') them first, or pass --force to lose them.
Reverting version 6 (the nonce's default), 5 (the late-commit index), 4 (the xid column's statistics setting)
or 3 (leases per relay back to leases per lane) keeps every message and is not refused.
Reverting version 7 drops the flow tables: it is refused while a flow instance has not
ended (ready, running, awaiting, joining or failed); let them finish or cancel them. The
checks run in each step's transaction with the tables locked, so nothing written
meanwhile is lost unseen. --dry-run prints what would be reverted and
whether it would be refused, and exits with status 1 when it would be.`,
		Example: `  wharf migrate down --dry-run
  wharf migrate down                       # one step
  wharf migrate down --target-version 0    # everything (the schema too, if Wharf created it)`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := wharfmigrate.New(g.schema)
			if err != nil {
				return err
			}
			flags := cmd.Flags()
			if flags.Changed("steps") && flags.Changed("target-version") {
				return usageError{errors.New("give --steps or --target-version, not both")}
			}
			if steps < 1 {
				return usageError{fmt.Errorf("--steps must be at least 1 (got %d); to revert everything use --target-version 0", steps)}
			}
			if flags.Changed("target-version") && (target < 0 || target > m.Latest()) {
				return usageError{fmt.Errorf("--target-version must be between 0 and %d (got %d)", m.Latest(), target)}
			}
			pool, err := g.connect(cmd.Context(), 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			applied, err := m.Version(ctx, pool)
			if err != nil {
				return err
			}
			if !flags.Changed("target-version") {
				target = max(0, applied-steps)
			}
			if target > applied {
				return usageError{fmt.Errorf("schema %s is at version %d: --target-version %d is not below it (use wharf migrate up)", g.schema, applied, target)}
			}
			_, plan, err := m.PlanDownTo(ctx, pool, target)
			if err != nil {
				return err
			}
			if len(plan) == 0 {
				fmt.Fprintf(g.stdout, "schema %s is at version %d: nothing to revert\n", g.schema, applied)
				return nil
			}
			if dryRun {
				for _, mg := range plan {
					fmt.Fprintf(g.stdout, "would revert %03d_%s\n", mg.Version, mg.Name)
				}
				msgs, dead, err := m.Contents(ctx, pool)
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "schema %s would go from version %d to %d\n", g.schema, applied, target)
				lossy := slices.ContainsFunc(plan, func(mg wharfmigrate.Migration) bool { return !mg.KeepsMessages })
				if msgs > 0 || dead > 0 {
					verdict := "it would be refused: pass --force to revert anyway and lose them"
					switch {
					case !lossy:
						verdict = "these reverts keep them"
					case force:
						verdict = "--force: they would be lost"
					}
					fmt.Fprintf(g.stdout, "the outbox holds %s and %s: %s\n", countOf(msgs, "pending message"), countOf(dead, "dead letter"), verdict)
					if lossy && !force {
						// A script that checks the plan before running it
						// must see that it would fail.
						return errors.New("dry run: this migrate down would be refused: the outbox is not empty (deliver, cancel or purge them first, or pass --force)")
					}
				}
				if live, err := m.LiveFlows(ctx, pool); err != nil {
					return err
				} else if live > 0 && slices.ContainsFunc(plan, wharfmigrate.Migration.DropsFlows) {
					if force {
						fmt.Fprintf(g.stdout, "%s not ended: --force: they would be lost\n", countOf(live, "flow instance"))
					} else {
						fmt.Fprintf(g.stdout, "%s not ended: it would be refused: pass --force to revert anyway and lose them\n", countOf(live, "flow instance"))
						return errors.New("dry run: this migrate down would be refused: flow instances have not ended (let them finish or cancel them, or pass --force)")
					}
				}
				return nil
			}
			var done []int
			if force {
				done, err = m.DownTo(ctx, pool, target)
			} else {
				done, err = m.DownToIfEmpty(ctx, pool, target)
			}
			if errors.Is(err, wharfmigrate.ErrNotEmpty) {
				if strings.HasPrefix(err.Error(), wharfmigrate.ErrNotEmpty.Error()) {
					return fmt.Errorf("refusing to migrate down: %w (deliver, cancel or purge them first, or pass --force)", err)
				}
				return fmt.Errorf("refusing to migrate down: %w", err) // live flows: the error says what to do
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "schema %s migrated down: reverted %v, now at version %d\n", g.schema, done, target)
			return nil
		},
	}
	down.Flags().IntVar(&steps, "steps", 1, "how many migrations to revert")
	down.Flags().IntVar(&target, "target-version", 0, "revert down to this version (0 reverts everything)")
	down.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be reverted, and whether it would be refused, without changing anything")
	down.Flags().BoolVar(&force, "force", false, "revert even if the outbox or the dead-letter table holds rows (they are lost)")
	return down
}

func countOf(n int64, what string) string {
	switch {
	case n > 1000:
		return "more than 1000 " + what + "s"
	case n == 1:
		return "1 " + what
	default:
		return fmt.Sprintf("%d %ss", n, what)
	}
}
