-- wharfmigrate:keeps-messages
DROP FUNCTION {{schema}}.cleanup_flows(timestamptz, integer);
DROP FUNCTION {{schema}}.retry_flow(bigint);
DROP FUNCTION {{schema}}.cancel_flow(bigint);
DROP FUNCTION {{schema}}.wake_flows(bigint[]);
DROP FUNCTION {{schema}}.renew_flow_leases(text, bigint[], bigint[], interval);
DROP FUNCTION {{schema}}.complete_flow_steps(text, jsonb);
DROP FUNCTION {{schema}}.next_flow_due();
DROP FUNCTION {{schema}}.claim_flow_steps(text, text[], integer, interval);
DROP FUNCTION {{schema}}.signal(text, text, text, jsonb, text);
DROP FUNCTION {{schema}}.signal_flows(jsonb);
DROP FUNCTION {{schema}}.start_flow(text, jsonb, text, text, integer, timestamptz, text, integer, text);
DROP FUNCTION {{schema}}.start_flows(jsonb);
DROP TABLE {{schema}}.flow_keys;
DROP TABLE {{schema}}.flow_steps;
DROP TABLE {{schema}}.flow_signals;
DROP TABLE {{schema}}.flow_instances;
