-- wharfmigrate:keeps-messages
DROP INDEX {{schema}}.outbox_lane_xid;
CREATE INDEX outbox_lane_xid ON {{schema}}.outbox (lane, xid, id);
