-- wharfmigrate:keeps-messages
-- Back to one retry record per seq: the records stay, without their nonces.
ALTER TABLE {{schema}}.retries DROP COLUMN nonce;
