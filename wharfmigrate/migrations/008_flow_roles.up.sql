-- Least-privilege flows. A producer starts and signals flows only through
-- start_flows and signal_flows (and their one-row forms start_flow and
-- signal), as it enqueues through the outbox's functions: they run with
-- their owner's rights, with a fixed search_path, so the producer role needs
-- no right on the flow tables at all. With the caller's rights it would need
-- UPDATE on flow_instances (a signal makes its awaiting instance due), which
-- would let it move any instance's run_at: time out an await, or expire a
-- running step's lease. Only the roles granted them may call them
-- (wharf migrate roles grants the producer and flow runner roles).
ALTER FUNCTION {{schema}}.start_flows(jsonb) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.signal_flows(jsonb, boolean) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION
    {{schema}}.start_flows(jsonb),
    {{schema}}.signal_flows(jsonb, boolean),
    {{schema}}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text),
    {{schema}}.signal(text, text, text, jsonb, text, boolean)
FROM PUBLIC;
