-- wharfmigrate:keeps-messages
-- Back to one lease per lane: every owned lane gets its owner's lease.
ALTER TABLE {{schema}}.lanes ADD COLUMN lease_until timestamptz;
UPDATE {{schema}}.lanes l SET lease_until = r.lease_until FROM {{schema}}.relays r WHERE r.relay_id = l.owner;
ALTER TABLE {{schema}}.relays DROP COLUMN lease_until;
