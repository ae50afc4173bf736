// Package wharfflow runs durable multi-step processes (flows) on the
// PostgreSQL schema of a Wharf outbox.
//
// A flow is a named set of steps over a state S saved as JSON ([New],
// [Flow.Step]). Each step returns one [Outcome]: [Next] or [NextAt],
// [Retry] or [RetryAfter], [Await] (with [Outcome.Deadline]), [Spawn],
// [Done], [Fail] or [RateLimited]; [Outcome.Emit] adds outbox messages that
// commit with it and that the Wharf relay then delivers. The outcome (new
// state, next step, consumed signals, children, step history and messages)
// commits in one transaction, once, and only while the runner still holds
// the step's lease.
//
// Applications start instances and send signals inside their own
// transactions ([Client.StartTx], [Client.SignalTx], and the database/sql
// forms), or from SQL: <schema>.start_flow(...) and <schema>.signal(...).
// A [Runner] claims due steps in batches, runs them and writes their
// outcomes in batches; any number of runners may share a schema. A runner
// holds one pool connection for LISTEN and uses a few more for its claims,
// outcome writes and lease renewals.
//
// The schema is migrations 7 and 8 of wharfmigrate (`wharf migrate up`);
// `wharf migrate roles` creates a producer role that may start and signal
// flows, a flow runner role and a flow reader role. The
// guide is docs/flows.md, its design and costs docs/flows-design.md; the
// operators' commands are `wharf flow list|show|signal|cancel|retry`.
package wharfflow
