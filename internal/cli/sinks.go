package cli

import (
	"github.com/wharfhq/wharf/internal/sinkurl"
	"github.com/wharfhq/wharf/wharfkafka"
	"github.com/wharfhq/wharf/wharfnats"
)

// The broker sinks live in their own packages so a library user who only
// enqueues does not pull in their clients; the CLI offers all of them.
func init() {
	sinkurl.Register("kafka", wharfkafka.Open)
	sinkurl.Register("nats", wharfnats.Open)
}
