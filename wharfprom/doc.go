// Package wharfprom exports a relay's metrics to Prometheus and serves its
// health probes.
//
// [NewCollector] turns the counters a [wharf.Client] keeps ([wharf.Stats])
// into Prometheus metrics when scraped: the relay's hot path pays nothing but
// the atomic increments it does anyway. [Handler] serves them on /metrics
// (with the Go runtime and process collectors), and the liveness and
// readiness probes on /healthz and /readyz:
//
//	client, _ := wharf.NewClient(pool, cfg)
//	_ = client.Start(ctx)
//	go http.ListenAndServe(":9750", wharfprom.Handler(client))
//
// or, to add the metrics to a registry of your own:
//
//	prometheus.MustRegister(wharfprom.NewCollector(client))
//
// # Metrics
//
// No metric has a message-key label: keys are unbounded. Topic labels are
// capped at [wharf.MaxTopicLabels] distinct topics; the messages of any
// further topic are counted under topic="_other" ([wharf.OtherTopics]). The
// sink label is the sink's name (its package, e.g. "wharfkafka", or the name
// it reports); sinks of one name are summed.
//
//	name                                     type       labels            meaning
//	wharf_relay_info                         gauge      version,relay_id  always 1: the build and the relay id
//	wharf_messages_delivered_total           counter    topic             messages acknowledged and removed from the outbox
//	wharf_delivery_failures_total            counter    topic             failed delivery attempts (each one retried or dead-lettered)
//	wharf_dead_lettered_total                counter    topic             messages moved to the dead-letter table
//	wharf_duplicate_acks_total               counter                      deliveries the destination acknowledged as duplicates (counted as delivered)
//	wharf_resent_total                       counter                      messages sent again because an earlier message of their key failed after them
//	wharf_failed_publishes_total             counter                      sink calls in which at least one message failed
//	wharf_sink_failed_messages_total         counter    sink              messages a sink failed (retried or dead-lettered)
//	wharf_sink_publish_seconds               histogram  sink              duration of one sink call (a batch)
//	wharf_commit_to_ack_seconds              histogram                    from the enqueuing transaction's start to the acknowledgement written
//	wharf_fetch_seconds                      histogram                    duration of one fetch from the outbox
//	wharf_fetch_rows                         histogram                    rows per fetch
//	wharf_removal_batch_size                 histogram                    acknowledgements per result write
//	wharf_result_write_seconds               histogram                    duration of one write of delivery results
//	wharf_messages_in_flight                 gauge                        messages at a sink now
//	wharf_messages_buffered                  gauge                        messages loaded in memory
//	wharf_buffered_payload_bytes             gauge                        payload bytes of the messages loaded in memory
//	wharf_messages_held                      gauge                        messages kept as positions (behind a held key, scheduled, waiting for a retry)
//	wharf_lanes_owned                        gauge                        lanes this relay owns
//	wharf_lanes_uncovered                    gauge                        lanes no live relay owns (as of this relay's last lease round)
//	wharf_wal_lag_bytes                      gauge                        WAL mode: WAL past the slot's confirmed position (the streaming relay's)
//	wharf_wal_lag_seconds                    gauge                        WAL mode: age of the oldest commit streamed and not settled (database clock)
//	wharf_wal_held_bytes                     gauge                        WAL mode: streamed, unsettled messages held in memory
//	wharf_wal_slot_gone                      gauge                        WAL mode: 1 while the streaming relay finds the slot missing or lost (enqueues refused)
//	wharf_lease_renewals_total               counter                      lane leases renewed (one per lane per lease round)
//	wharf_lease_losses_total                 counter                      lanes lost to another relay before their lease was handed back
//	wharf_database_errors_total              counter                      failed fetches, result writes and lease rounds
//	wharf_rewinds_total                      counter                      times the database went back in time and every lane was read again
//	wharf_oldest_due_message_age_seconds     gauge                        age of the oldest message due or retrying; 0 when there is none
//	wharf_backlog_messages                   gauge                        PostgreSQL's estimate of the rows in the outbox (statistics, no count)
//	wharf_engine_last_loop_age_seconds       gauge                        time since the relay's engine loop last ran
//	wharf_database_last_success_age_seconds  gauge                        time since a fetch or lease round last succeeded
//
// The ages are measured when scraped, so a relay that stops working shows
// growing ages rather than frozen values (the oldest due message's creation
// time is refreshed every RebalanceInterval, converted from the database's
// clock to this host's). wharf_backlog_messages reads PostgreSQL's
// statistics at most once every few seconds ([WithBacklogInterval]), waiting at
// most a second for it (one scrape at a time; others meanwhile reuse the last
// value), and is left out while the database does not answer: scrapes add no
// load to the database and never fail because of it. The engine
// and database ages are left out until the relay first ran.
//
// The metrics are read from the relay's atomic counters one at a time (the
// relay takes no lock to update them): a scrape is not a consistent snapshot across metrics,
// which Prometheus's rate() and histogram_quantile() do not need.
//
// # Probes
//
// /healthz answers 200 while the relay's engine loop runs (live) and 503
// otherwise; it never asks the database or a sink, so an outage of either
// cannot make an orchestrator restart a relay that would recover by itself.
// /readyz answers 200 when the relay is ready ([wharf.Client.Health]: live,
// the database answered recently, the schema is current, the sinks answer
// their pings) and 503 otherwise. Both answer JSON with snake_case fields:
//
//	{"ready":false,"live":true,"running":true,"spare":false,"lanes_owned":0,
//	 "relay_id":"host-42-9f1c","problems":["the database last answered 6.2s ago"]}
package wharfprom
