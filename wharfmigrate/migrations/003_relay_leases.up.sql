-- One lease per relay instead of one per lane. A lane belongs to its owner
-- while the owner's relays row has lease_until in the future; the heartbeat
-- that every lease round writes anyway extends it. Lane rows change only when
-- lanes change hands, so a transaction holding the xmin horizon for an hour
-- no longer piles up dead lane row versions that every renewal must walk.
ALTER TABLE {{schema}}.relays ADD COLUMN lease_until timestamptz;
ALTER TABLE {{schema}}.lanes DROP COLUMN lease_until;
