-- Message ids unique beyond one database. Every message gets a random nonce at
-- enqueue; its id is the UUID (RFC 9562 version 8) made of its seq and nonce
-- (message_id below, wharf.FormatID in Go). Rows already in the outbox and the
-- dead letters share one nonce drawn now: unique with their seqs, and different
-- from every other outbox's. The new columns get a constant default, so adding
-- them rewrites nothing.
DO $do$
DECLARE
    n bigint := (random() * 4611686018427387904)::bigint & 4611686018427387903;
BEGIN
    EXECUTE format('ALTER TABLE {{schema}}.outbox ADD COLUMN nonce bigint NOT NULL DEFAULT %s', n);
    EXECUTE format('ALTER TABLE {{schema}}.dead_letters ADD COLUMN nonce bigint NOT NULL DEFAULT %s', n);
END
$do$;
ALTER TABLE {{schema}}.outbox ALTER COLUMN nonce SET DEFAULT ((random() * 4611686018427387904)::bigint & 4611686018427387903);
ALTER TABLE {{schema}}.dead_letters ALTER COLUMN nonce DROP DEFAULT;
-- A retried dead letter keeps its dedup key.
ALTER TABLE {{schema}}.dead_letters ADD COLUMN dedup_key text;

-- A relay's incarnation (random per start): a second relay started with the
-- same relay id while the first is alive is refused instead of sharing its
-- lanes.
ALTER TABLE {{schema}}.relays ADD COLUMN incarnation text NOT NULL DEFAULT '';

-- Positions come from the sequence only: an explicit id could repeat one, and
-- one below a relay's read position would not be seen until the lane changes
-- hands. Moving dead letters back uses OVERRIDING SYSTEM VALUE.
ALTER TABLE {{schema}}.outbox ALTER COLUMN id SET GENERATED ALWAYS;

CREATE FUNCTION {{schema}}.message_id(seq bigint, nonce bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
    SELECT (lpad(to_hex(seq >> 12), 12, '0') || '8' || lpad(to_hex(seq & 4095), 3, '0')
            || lpad(to_hex((nonce & 4611686018427387903) | -9223372036854775808), 16, '0'))::uuid
$fn$;

-- The enqueue functions return the message id.
DROP FUNCTION {{schema}}.enqueue(text, text, jsonb, jsonb, timestamptz, text);
DROP FUNCTION {{schema}}.enqueue_bytes(text, text, bytea, jsonb, timestamptz, text);

CREATE FUNCTION {{schema}}.enqueue_bytes(
    topic text, key text, payload bytea, headers jsonb DEFAULT '{}',
    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    new_id bigint;
    new_nonce bigint;
BEGIN
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'wharf.enqueue: topic is required' USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'wharf.enqueue: payload is required (use ''null''::jsonb or ''''::bytea)' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'wharf.enqueue: headers must be a JSON object of strings, got %', jsonb_typeof(headers) USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(headers) h WHERE jsonb_typeof(h.value) <> 'string') THEN
        RAISE EXCEPTION 'wharf.enqueue: header values must be strings' USING ERRCODE = '22023';
    END IF;
    FOR attempt IN 1..3 LOOP
        INSERT INTO {{schema}}.outbox (topic, key, payload, headers, deliver_at, dedup_key)
        VALUES (enqueue_bytes.topic, NULLIF(enqueue_bytes.key, ''), enqueue_bytes.payload,
                NULLIF(enqueue_bytes.headers, '{}'::jsonb), enqueue_bytes.deliver_at, NULLIF(enqueue_bytes.dedup_key, ''))
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING id, nonce INTO new_id, new_nonce;
        IF new_id IS NULL THEN
            SELECT o.id, o.nonce INTO new_id, new_nonce FROM {{schema}}.outbox o WHERE o.dedup_key = enqueue_bytes.dedup_key;
        END IF;
        -- The conflicting row can be delivered and removed between the two
        -- statements: then insert again.
        EXIT WHEN new_id IS NOT NULL;
    END LOOP;
    IF new_id IS NULL THEN
        RAISE EXCEPTION 'wharf.enqueue: dedup key % kept conflicting with rows that disappeared; retry the transaction', dedup_key USING ERRCODE = '40001';
    END IF;
    RETURN {{schema}}.message_id(new_id, new_nonce);
END
$fn$;

CREATE FUNCTION {{schema}}.enqueue(
    topic text, key text, payload jsonb, headers jsonb DEFAULT '{}',
    deliver_at timestamptz DEFAULT NULL, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $fn$
    SELECT {{schema}}.enqueue_bytes(topic, key, convert_to(payload::text, 'UTF8'), headers, deliver_at, dedup_key)
$fn$;
