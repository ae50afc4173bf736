-- wharfmigrate:keeps-messages
GRANT EXECUTE ON FUNCTION
    {{schema}}.start_flows(jsonb),
    {{schema}}.signal_flows(jsonb, boolean),
    {{schema}}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text),
    {{schema}}.signal(text, text, text, jsonb, text, boolean)
TO PUBLIC;
ALTER FUNCTION {{schema}}.start_flows(jsonb) SECURITY INVOKER RESET search_path;
ALTER FUNCTION {{schema}}.signal_flows(jsonb, boolean) SECURITY INVOKER RESET search_path;
