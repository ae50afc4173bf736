package cli

import (
	"fmt"

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
	cmd.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, pool, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			done, err := m.Up(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if len(done) == 0 {
				fmt.Fprintf(g.stdout, "schema %s is up to date (version %d)\n", g.schema, m.Latest())
				return nil
			}
			fmt.Fprintf(g.stdout, "schema %s migrated up: applied %v, now at version %d\n", g.schema, done, m.Latest())
			return nil
		},
	})
	var steps int
	down := &cobra.Command{
		Use:   "down",
		Short: "Revert migrations (all by default); reverting 1 drops the outbox and its messages",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, pool, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			done, err := m.Down(cmd.Context(), pool, steps)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "schema %s migrated down: reverted %v\n", g.schema, done)
			return nil
		},
	}
	down.Flags().IntVar(&steps, "steps", 0, "how many migrations to revert (0 = all)")
	cmd.AddCommand(down)
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
