package cli

import (
	"cmp"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// newMigrateRolesCmd is `wharf migrate roles`: least-privilege roles for
// producers, relays, flow runners and flow readers.
func newMigrateRolesCmd(g *globals) *cobra.Command {
	var create bool
	var o wharfmigrate.RoleOptions
	cmd := &cobra.Command{
		Use:   "roles",
		Short: "Print (or --create) least-privilege producer, relay and flow roles",
		Long: `Prints the SQL that creates four roles with the least rights on the schema, or runs it
with --create:
  the producer role (default wharf_producer) may enqueue (insert into the outbox,
    directly or through the enqueue functions) and read back only the id, nonce and
    dedup key columns that enqueue returns: no topic, key, payload or header, no
    delete, no other table. It starts and signals flows through <schema>.start_flows,
    start_flow, signal_flows and signal, which run with their owner's rights: it can
    neither read nor change a flow's row itself;
  the relay role (default wharf_relay) may run a relay: read and delete outbox rows,
    lease lanes, register in the relays table, record retries and dead letters, read
    the schema version, LISTEN. It cannot enqueue or touch flows;
  the flow runner role (default wharf_flow_runner) may run wharfflow runners: claim
    steps, write their outcomes, history and children, renew and release leases,
    register in flow_runners (signals lease it the steps they resume), write rate
    limits, delete finished flows after their retention, enqueue the messages outcomes
    emit, start and signal flows. It cannot read or delete outbox messages;
  the flow reader role (default wharf_flow_reader) may read the flow tables (wharf flow
    list and show, the flow metrics) and change nothing.
No role can change the schema.
On an outbox in WAL mode the producer and flow runner roles may also call
<schema>.enqueue_wal (no other role may), and the relay role gets REPLICATION to stream
the slot and INSERT on the outbox (it moves messages held long there); only a superuser
can give REPLICATION (or create the relay role with it beforehand).
A role without a password is NOLOGIN: grant it to your login roles
(GRANT wharf_producer TO app). With --producer-password, --relay-password,
--flow-runner-password or --flow-reader-password (or WHARF_PRODUCER_PASSWORD,
WHARF_RELAY_PASSWORD, WHARF_FLOW_RUNNER_PASSWORD, WHARF_FLOW_READER_PASSWORD) it is
LOGIN with that password; the printed SQL then reads it from a psql variable instead of
showing it. Running it again keeps the roles and resets their grants on the schema to
exactly these. The admin commands (outbox, dead, notify, migrate) need the schema's
owner; flow cancel and flow retry the owner or the flow runner role.`,
		Example: `  wharf migrate roles > roles.sql
  psql "$DATABASE_URL" -v wharf_relay_password=... -f roles.sql
  wharf migrate roles --create --relay-password "$RELAY_PW"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := wharfmigrate.New(g.schema)
			if err != nil {
				return err
			}
			o.ProducerPassword = cmp.Or(o.ProducerPassword, os.Getenv("WHARF_PRODUCER_PASSWORD"))
			o.RelayPassword = cmp.Or(o.RelayPassword, os.Getenv("WHARF_RELAY_PASSWORD"))
			o.FlowRunnerPassword = cmp.Or(o.FlowRunnerPassword, os.Getenv("WHARF_FLOW_RUNNER_PASSWORD"))
			o.FlowReaderPassword = cmp.Or(o.FlowReaderPassword, os.Getenv("WHARF_FLOW_READER_PASSWORD"))
			if !create {
				script, err := m.RolesSQL(o)
				if err != nil {
					return usageError{err}
				}
				fmt.Fprint(g.stdout, script)
				return nil
			}
			if _, err := m.RolesSQL(o); err != nil {
				return usageError{err} // bad names, before connecting
			}
			pool, err := g.connect(cmd.Context(), 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := m.CreateRoles(cmd.Context(), pool, o); err != nil {
				return err
			}
			for _, r := range []struct{ what, name, pw string }{
				{"producer", cmp.Or(o.Producer, wharfmigrate.DefaultProducerRole), o.ProducerPassword},
				{"relay", cmp.Or(o.Relay, wharfmigrate.DefaultRelayRole), o.RelayPassword},
				{"flow runner", cmp.Or(o.FlowRunner, wharfmigrate.DefaultFlowRunnerRole), o.FlowRunnerPassword},
				{"flow reader", cmp.Or(o.FlowReader, wharfmigrate.DefaultFlowReaderRole), o.FlowReaderPassword},
			} {
				login := "NOLOGIN: grant it to a login role"
				if r.pw != "" {
					login = "LOGIN with the given password"
				}
				fmt.Fprintf(g.stdout, "%s role %s: grants on schema %s set (%s)\n", r.what, r.name, g.schema, login)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&create, "create", false, "create the roles and grant them in the database, instead of printing the SQL")
	fl.StringVar(&o.Producer, "producer", wharfmigrate.DefaultProducerRole, "name of the producer role")
	fl.StringVar(&o.Relay, "relay", wharfmigrate.DefaultRelayRole, "name of the relay role")
	fl.StringVar(&o.FlowRunner, "flow-runner", wharfmigrate.DefaultFlowRunnerRole, "name of the flow runner role")
	fl.StringVar(&o.FlowReader, "flow-reader", wharfmigrate.DefaultFlowReaderRole, "name of the flow reader role")
	fl.StringVar(&o.ProducerPassword, "producer-password", "", "make the producer role LOGIN with this password [WHARF_PRODUCER_PASSWORD]")
	fl.StringVar(&o.RelayPassword, "relay-password", "", "make the relay role LOGIN with this password [WHARF_RELAY_PASSWORD]")
	fl.StringVar(&o.FlowRunnerPassword, "flow-runner-password", "", "make the flow runner role LOGIN with this password [WHARF_FLOW_RUNNER_PASSWORD]")
	fl.StringVar(&o.FlowReaderPassword, "flow-reader-password", "", "make the flow reader role LOGIN with this password [WHARF_FLOW_READER_PASSWORD]")
	return cmd
}
