#!/usr/bin/env bash
# Drain benchmark for `wharf relay --drain` until `wharf bench` exists.
# usage: scripts/drain-bench.sh DATABASE_URL MESSAGES KEYS [relay flags...]
# Pre-fills MESSAGES rows (200-byte JSON payloads, KEYS keys; 0 = unkeyed) in 10
# transactions into a scratch schema wharf_drain_bench, then times a relay that
# drains them to stdout redirected to /dev/null. Prints the relay's own rate
# (from the first fetch that returned rows to the last removal).
set -euo pipefail
export PGOPTIONS="${PGOPTIONS:-} --client-min-messages=warning"
url=$1 n=$2 keys=$3; shift 3
schema=wharf_drain_bench
bin=${WHARF_BIN:-./wharf}
[ -x "$bin" ] || go build -o "$bin" ./cmd/wharf
psql -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" 2>/dev/null
"$bin" --database-url "$url" --schema $schema migrate up >/dev/null
for c in $(seq 0 9); do
  psql -q "$url" -c "INSERT INTO $schema.outbox (topic, key, payload)
    SELECT 'orders', CASE WHEN $keys > 0 THEN 'k' || (i % $keys) END,
           convert_to('\"' || rpad('x', 198, 'x') || '\"', 'UTF8')
    FROM generate_series($c::bigint * $n / 10, ($c + 1)::bigint * $n / 10 - 1) i"
done
psql -q "$url" -c "VACUUM ANALYZE $schema.outbox"
/usr/bin/time -f "wall %e s, relay cpu %U+%S s, max rss %M KB" \
  "$bin" --database-url "$url" --schema $schema relay --sink stdout: --drain "$@" 2>&1 >/dev/null \
  | grep -E "drained|wall" | sed -E 's/.*(delivered=[0-9]+).*(msgs_per_sec=[0-9]+).*/\1 \2/'
psql -q "$url" -c "DROP SCHEMA $schema CASCADE"
