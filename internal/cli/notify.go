package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// newNotifyCmd toggles the outbox's NOTIFY trigger. It is off by default:
// NOTIFY serialises committing transactions on a global lock, which cut
// producer throughput 3-4x for one-row transactions on the project machine.
func newNotifyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "notify on|off|status",
		Short: "Enable or disable LISTEN/NOTIFY wake-ups (off by default: NOTIFY slows producers)",
		Long: `With notifications on, every inserting statement notifies listening relays, so an idle
relay wakes at once instead of at its next poll (--poll-interval, 50ms by default).
The price is paid by producers: NOTIFY takes a global lock at commit. On the project
machine one-row transactions ran 3-4x slower with it (see BENCHMARKS.md). Turn it on
for low write rates where idle latency matters more than producer throughput.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off", "status"},
		RunE: func(cmd *cobra.Command, args []string) error {
			var stmt string
			switch args[0] {
			case "on":
				stmt = "ENABLE"
			case "off":
				stmt = "DISABLE"
			case "status":
			default:
				return usageError{fmt.Errorf("notify takes on, off or status, got %q", args[0])}
			}
			pool, err := g.connect(cmd.Context(), 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			m, err := wharfmigrate.New(g.schema)
			if err != nil {
				return err
			}
			if err := m.Check(cmd.Context(), pool); err != nil {
				return err
			}
			if stmt != "" {
				if _, err := pool.Exec(cmd.Context(), "ALTER TABLE "+g.schema+".outbox "+stmt+" TRIGGER outbox_notify"); err != nil {
					return err
				}
			}
			var enabled bool
			if err := pool.QueryRow(cmd.Context(), `SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgname = 'outbox_notify' AND tgrelid = $1::regclass`, g.schema+".outbox").Scan(&enabled); err != nil {
				return err
			}
			state := "off"
			if enabled {
				state = "on"
			}
			fmt.Fprintf(g.stdout, "notifications are %s for schema %s (channel %s)\n", state, g.schema, wharfmigrate.NotifyChannel(g.schema))
			return nil
		},
	}
	return cmd
}
