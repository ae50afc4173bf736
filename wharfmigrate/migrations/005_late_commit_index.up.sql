-- The relay reads late commits (rows of transactions that started or finished
-- since its previous read) by lane and xid, and its forward reads through
-- (lane, id). With both indexes leading with lane, the planner could read late
-- commits through (lane, id) too, scanning each lane below the relay's
-- position: every delivered row vacuum has not removed yet, on every fetch.
-- It did whenever its statistics made the two look alike, and a queue table's
-- statistics mostly come from an ANALYZE that saw it nearly empty or empty:
-- fetches took 3-25 ms instead of under 1 and a relay that kept up fell behind
-- for good. Keyed by lane::integer, this index is the only one the late-commit
-- reads (which say lane::integer) can use, whatever the statistics. Building
-- it blocks inserts into the outbox while it runs (about a second per million
-- rows waiting).
DROP INDEX {{schema}}.outbox_lane_xid;
CREATE INDEX outbox_lane_xid ON {{schema}}.outbox ((lane::integer), xid, id);
