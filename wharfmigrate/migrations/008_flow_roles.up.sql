-- Least-privilege flows. A producer starts and signals flows only through
-- start_flows and signal_flows (and their one-row forms start_flow and
-- signal), as it enqueues through the outbox's functions: they run with
-- their owner's rights, with a fixed search_path, so the producer role needs
-- no right on the flow tables at all. With the caller's rights it would need
-- UPDATE on flow_instances (a signal makes its awaiting instance due), which
-- would let it move any instance's run_at: time out an await, or expire a
-- running step's lease. Only the roles granted them may call them
-- (wharf migrate roles grants the producer and flow runner roles).

-- trace_context: the W3C trace context (a JSON object of its header fields)
-- of the transaction that started the instance, when the starting client
-- has a tracer (wharfflow.WithTracer): the runner makes each step's span a
-- child of it, and of its nearest ancestor's for children. NULL otherwise.
ALTER TABLE {{schema}}.flow_instances ADD COLUMN trace_context jsonb;

-- start_flows as in migration 7, with the owner's rights and the trace
-- context of each start ("trace").
CREATE OR REPLACE FUNCTION {{schema}}.start_flows(p_starts jsonb) RETURNS TABLE (ord bigint, id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
BEGIN
    v_ids := ARRAY(SELECT nextval('{{schema}}.flow_instances_id_seq') FROM generate_series(1, jsonb_array_length(p_starts)));
    INSERT INTO {{schema}}.flow_instances AS i
        (id, flow, step, state, correlation_key, priority, run_at, not_before,
         concurrency_key, concurrency_limit, rate_key, trace_context)
    SELECT v_ids[e.n], e.doc->>'flow', coalesce(e.doc->>'step', 'start'), coalesce(e.doc->'state', '{}'),
           e.doc->>'key', coalesce((e.doc->>'priority')::integer, 0),
           coalesce((e.doc->>'run_at')::timestamptz, now()), coalesce((e.doc->>'run_at')::timestamptz, now()),
           e.doc->>'concurrency_key', coalesce((e.doc->>'concurrency_limit')::integer, 1), e.doc->>'rate_key',
           e.doc->'trace'
      FROM jsonb_array_elements(p_starts) WITH ORDINALITY AS e(doc, n)
        ON CONFLICT (flow, correlation_key) WHERE correlation_key IS NOT NULL AND status NOT IN ('done', 'cancelled')
        DO NOTHING;
    PERFORM pg_notify('{{schema}}_flows', '');
    -- A new statement, so a start that conflicted with one committed meanwhile
    -- finds it. Each id is looked up on its own (a join to the table let the
    -- planner, which expects 100 elements, hash the whole instance table:
    -- 13 ms a call with 110,000 instances kept).
    RETURN QUERY
    SELECT e.n, coalesce((SELECT i.id FROM {{schema}}.flow_instances i WHERE i.id = v_ids[e.n]),
                         (SELECT x.id FROM {{schema}}.flow_instances x
                           WHERE x.flow = e.doc->>'flow' AND x.correlation_key = e.doc->>'key'
                             AND x.status NOT IN ('done', 'cancelled')))
      FROM jsonb_array_elements(p_starts) WITH ORDINALITY AS e(doc, n);
END $$;
ALTER FUNCTION {{schema}}.signal_flows(jsonb, boolean) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION
    {{schema}}.start_flows(jsonb),
    {{schema}}.signal_flows(jsonb, boolean),
    {{schema}}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text),
    {{schema}}.signal(text, text, text, jsonb, text)
FROM PUBLIC;
