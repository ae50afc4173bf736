-- wharfmigrate:keeps-messages
ALTER TABLE {{schema}}.outbox ALTER COLUMN xid SET (n_distinct = -0.01);
