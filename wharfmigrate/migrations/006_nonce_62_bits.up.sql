-- A message's nonce carries 62 random bits. The default of migration 2 scaled
-- one random() (52 bits of entropy) up to 62 bits, so the low 10 bits of every
-- nonce were 0; two draws of 31 bits each fill all 62. Existing rows keep
-- their nonces (and so their ids).
ALTER TABLE {{schema}}.outbox ALTER COLUMN nonce SET DEFAULT
    ((floor(random() * 2147483648)::bigint << 31) | floor(random() * 2147483648)::bigint);
