package upgradetest

import (
	"os"
	"os/exec"
	"testing"
)

// futureMigrationEnv holds SQL that TestUpgradeRunsWhatEachReleaseLeftToTheEnd
// runs after migrating to the head, as if a later migration ran it.
const futureMigrationEnv = "WHARF_UPGRADE_SIMULATED_MIGRATION"

// The upgrade test exists to catch a migration that loses or changes what a
// release left behind. Each case here is such a migration; the upgrade test,
// run with it applied after the head, must fail.
func TestUpgradeCatchesHarmfulMigrations(t *testing.T) {
	if os.Getenv(futureMigrationEnv) != "" {
		t.Skip("in the child")
	}
	for name, sql := range map[string]string{
		// Consumers deduplicate by message id: a migration that
		// recomputes nonces (as 006_nonce_62_bits did) changes every
		// pending message's id.
		"pending message ids change": `UPDATE {{schema}}.outbox SET nonce = nonce # 1;
UPDATE {{schema}}.retries SET nonce = nonce # 1`,
		"pending payloads rewritten":     `UPDATE {{schema}}.outbox SET payload = '\x7b7d' WHERE id <> 4`,
		"a dead letter's payload lost":   `UPDATE {{schema}}.dead_letters SET payload = '\x6e756c6c'`,
		"a concurrency key dropped":      `UPDATE {{schema}}.flow_instances SET concurrency_key = NULL`,
		"the outbox's id sequence reset": `SELECT setval('{{schema}}.outbox_id_seq', 1, false)`,
		// Caught today: the check that the harness works.
		"a pending message deleted": `DELETE FROM {{schema}}.outbox WHERE id = 1`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestUpgradeRunsWhatEachReleaseLeftToTheEnd$", "-test.count=1")
			cmd.Env = append(os.Environ(), futureMigrationEnv+"="+sql, "TEST_DATABASE_URL="+databaseURL)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Errorf("the upgrade test passed although a migration after the head did this to the data 0.1.0 left:\n%s", sql)
			} else {
				t.Logf("caught:\n%s", out)
			}
		})
	}
}
