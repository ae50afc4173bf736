-- wharfmigrate:keeps-messages
GRANT EXECUTE ON FUNCTION
    {{schema}}.start_flows(jsonb),
    {{schema}}.signal_flows(jsonb, boolean),
    {{schema}}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text),
    {{schema}}.signal(text, text, text, jsonb, text)
TO PUBLIC;
ALTER FUNCTION {{schema}}.signal_flows(jsonb, boolean) SECURITY INVOKER RESET search_path;
-- start_flows as migration 7 made it (the caller's rights, no trace).
CREATE OR REPLACE FUNCTION {{schema}}.start_flows(p_starts jsonb) RETURNS TABLE (ord bigint, id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
BEGIN
    v_ids := ARRAY(SELECT nextval('{{schema}}.flow_instances_id_seq') FROM generate_series(1, jsonb_array_length(p_starts)));
    INSERT INTO {{schema}}.flow_instances AS i
        (id, flow, step, state, correlation_key, priority, run_at, not_before,
         concurrency_key, concurrency_limit, rate_key)
    SELECT v_ids[e.n], e.doc->>'flow', coalesce(e.doc->>'step', 'start'), coalesce(e.doc->'state', '{}'),
           e.doc->>'key', coalesce((e.doc->>'priority')::integer, 0),
           coalesce((e.doc->>'run_at')::timestamptz, now()), coalesce((e.doc->>'run_at')::timestamptz, now()),
           e.doc->>'concurrency_key', coalesce((e.doc->>'concurrency_limit')::integer, 1), e.doc->>'rate_key'
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
ALTER TABLE {{schema}}.flow_instances DROP COLUMN trace_context;
