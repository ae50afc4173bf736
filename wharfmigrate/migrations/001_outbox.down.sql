DROP TRIGGER IF EXISTS outbox_notify ON {{schema}}.outbox;
DROP FUNCTION IF EXISTS {{schema}}.notify();
DROP FUNCTION IF EXISTS {{schema}}.enqueue(text, text, jsonb, jsonb, timestamptz, text);
DROP FUNCTION IF EXISTS {{schema}}.enqueue_bytes(text, text, bytea, jsonb, timestamptz, text);
DROP TABLE IF EXISTS {{schema}}.dead_letters;
DROP TABLE IF EXISTS {{schema}}.retries;
DROP TABLE IF EXISTS {{schema}}.relays;
DROP TABLE IF EXISTS {{schema}}.lanes;
DROP TABLE IF EXISTS {{schema}}.outbox;
