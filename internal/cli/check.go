package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// CheckArgs reports whether args (the words after "wharf") name an existing
// command and give it only flags it has, with values of the right type, and
// positional arguments it accepts — without running it. It is for tests that
// check command lines written elsewhere (the docs): the error is the one
// line `wharf` itself would print for the same mistake.
func CheckArgs(args []string) error {
	root := newRoot(ioStreams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	cmd, rest, err := root.Find(args)
	if err != nil {
		if m := unknownCommandRE.FindStringSubmatch(err.Error()); m != nil {
			return unknownCommand(root, m[1])
		}
		return err
	}
	cmd.InitDefaultHelpFlag()
	cmd.InitDefaultVersionFlag()
	if err := cmd.ParseFlags(rest); err != nil {
		return cmd.FlagErrorFunc()(cmd, err)
	}
	if help, err := cmd.Flags().GetBool("help"); err == nil && help {
		return nil
	}
	positional := cmd.Flags().Args()
	if cmd.HasSubCommands() && len(positional) > 0 {
		// A command that only groups others (wharf outbox, wharf dead).
		return unknownCommand(cmd, positional[0])
	}
	if err := cmd.ValidateArgs(positional); err != nil {
		return err
	}
	if err := cmd.ValidateRequiredFlags(); err != nil {
		return fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	if err := cmd.ValidateFlagGroups(); err != nil {
		return fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	if !cmd.Runnable() {
		return errors.New(cmd.CommandPath() + " does nothing by itself: name one of its subcommands")
	}
	return nil
}

// commandTree is the wharf command tree, for the reference generator.
func commandTree() *cobra.Command {
	return newRoot(ioStreams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
}
