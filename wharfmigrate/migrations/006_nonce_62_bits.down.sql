-- wharfmigrate:keeps-messages
ALTER TABLE {{schema}}.outbox ALTER COLUMN nonce SET DEFAULT ((random() * 4611686018427387904)::bigint & 4611686018427387903);
