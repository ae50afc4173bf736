package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// CheckArgs accepts what wharf would run and refuses, with wharf's own
// one-line error, what it would refuse as a usage error; it runs nothing.
func TestCheckArgs(t *testing.T) {
	for _, ok := range [][]string{
		{"relay", "--sink", "stdout:", "--drain"},
		{"--schema", "app", "migrate", "up"},
		{"migrate", "roles", "--create", "--relay-password", "x"},
		{"flow", "signal", "42", "--name", "payment-captured"},
		{"status", "--help"},
		{"help", "relay"},
		{"outbox"},
	} {
		require.NoError(t, CheckArgs(ok), "%q", ok)
	}
	for args, want := range map[string][]string{
		`unknown command "relya" for "wharf": did you mean relay? (see wharf --help)`:             {"relya"},
		`unknown command "lsit" for "wharf outbox": did you mean list? (see wharf outbox --help)`: {"outbox", "lsit"},
		`unknown flag: --no-such-flag (see wharf --help)`:                                         {"relay", "--no-such-flag"},
		`invalid value "many" for --steps`:                                                        {"migrate", "down", "--steps", "many"},
		`wharf version takes no arguments, got ["now"]`:                                           {"version", "now"},
		`accepts 1 arg(s), received 0`:                                                            {"flow", "show"},
	} {
		err := CheckArgs(want)
		require.Error(t, err, "%q", want)
		require.Contains(t, err.Error(), args, "%q", want)
	}
}
