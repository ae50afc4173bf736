-- The relay reads the rows of a transaction that finished after its previous
-- read by (lane, xid). Version 4 said an outbox holds one distinct xid per 100
-- rows, a fraction of the row count: after autovacuum's ANALYZE of a nearly
-- empty queue (a few hundred rows), that made a handful of xids, so xid = x
-- looked as unselective as id <= cursor, and the prepared fetch's generic
-- plan scanned each lane below its cursor through (lane, id) instead, over
-- every delivered row vacuum had not removed yet: 3-9 ms per fetch instead of
-- under 1, and the relay fell behind producers it kept up with before. An
-- absolute count does not shrink with the table: a million distinct xids keeps
-- xid = x one row whatever ANALYZE saw. The setting takes effect at the next
-- ANALYZE, so run one now.
ALTER TABLE {{schema}}.outbox ALTER COLUMN xid SET (n_distinct = 1000000);
ANALYZE {{schema}}.outbox;
