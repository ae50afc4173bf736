-- wharfmigrate:keeps-messages
ALTER TABLE {{schema}}.outbox ALTER COLUMN xid RESET (n_distinct);
