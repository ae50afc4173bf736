// Package wharf is a transactional outbox for PostgreSQL.
//
// An application enqueues messages with [Client.EnqueueTx] (or the SQL function
// wharf.enqueue) inside the same transaction as its business data; a relay
// ([Client.Start], or the wharf CLI) delivers every committed message to a [Sink]
// at least once, in order per (topic, key).
//
// # Message identity
//
// Every message has an [Message.ID] that is unique beyond its database: a UUID
// built from the message's position in its outbox ([Message.Seq]) and a random
// value drawn at enqueue (see [FormatID]). It is the same on every redelivery,
// and every sink sends it as the destination's deduplication id, so consumers
// can drop redeliveries without ever dropping another outbox's messages.
//
// # Enqueue
//
// [Client.EnqueueTx] inserts messages in the caller's pgx transaction in one
// round trip; [Client.EnqueueSQLTx] does the same for database/sql. Messages
// only become visible to the relay when the transaction commits; a rolled-back
// transaction's messages are never delivered.
//
// # Running the relay
//
// [Client.Start] runs the relay in the background and [Client.Stop] stops it
// gracefully; [Client.Drain] runs it until nothing deliverable is left. Any
// number of relays may run against one database: they share the outbox's lanes
// through leases with fencing tokens.
//
// # Sinks and routing
//
// A [Sink] receives batches and reports one result per message. The broker
// sinks live in their own packages (wharfkafka, wharfnats, wharfamqp,
// wharfredis, wharfwebhook); [Config.Handler] delivers to a Go function, and a
// [Router] sends topics to different sinks by pattern. Sink authors use
// [Results] to keep the ordering contract.
//
// # Ordering, retries and dead letters
//
// Messages with the same topic and key are delivered in [Message.Seq] order
// ([Config.OrderAcrossTopics] widens the scope to the key alone). A failing
// message is retried with exponential backoff and holds only its own key;
// [Permanent] moves it to the dead-letter table at once, [RetryAfter] sets the
// delay. [Client.DeadLetters], [Client.RetryDeadLetters] and
// [Client.PurgeDeadLetters] manage the dead letters.
package wharf
