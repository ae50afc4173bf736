// Command wharf runs the Wharf outbox relay and its tools: migrate, relay,
// status, dead letters, demo. See `wharf --help`.
package main

import (
	"os"

	"github.com/wharfhq/wharf/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
