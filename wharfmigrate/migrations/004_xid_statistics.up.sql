-- The relay reads the rows of a transaction that finished after its previous
-- read by (lane, xid). When ANALYZE's sample holds one xid (an outbox filled
-- by one large transaction: a backfill, a COPY), the planner took every row to
-- match any xid and scanned each lane below its read position instead, on
-- every fetch that followed another transaction. An outbox transaction writes
-- a few rows, not a table's worth: say so, as at most 100 rows per xid on
-- average. The setting takes effect at the next ANALYZE, so run one now.
ALTER TABLE {{schema}}.outbox ALTER COLUMN xid SET (n_distinct = -0.01);
ANALYZE {{schema}}.outbox;
