#!/usr/bin/env bash
# Runs every wharf bench shape of BENCHMARKS.md's quiet-sitting table in one
# sitting and keeps each result as JSON in OUTDIR.
# usage: scripts/bench-tables.sh DATABASE_URL OUTDIR
# Run it on an otherwise idle machine: producers, relays and PostgreSQL share
# the cores, so anything else running skews every figure.
set -euo pipefail
url=$1 out=$2
mkdir -p "$out"
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || go build -o "$bin" ./cmd/wharf
common=(--database-url "$url" --producers 4 --producer-batch 100 --payload-bytes 200)
pg() { psql -X -q -At "$url" -c "$1"; }
settle() { pg "CHECKPOINT"; sleep 5; }   # start each shape from a quiet WAL

run() { # name, wharf bench flags...
  local name=$1; shift
  settle
  echo "== $name: wharf bench $*" >&2
  "$bin" bench "${common[@]}" "$@" --json "$out/$name.json" 2>/dev/null | tee "$out/$name.txt"
}

run baseline  --mode baseline --duration 20s --records-per-key 10
run sweep-1   --mode sweep --records-per-key 10 --duration 10s --min-rate 20000 --max-rate 140000
sustainable=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['target_rate']))" "$out/sweep-1.json")
run sweep-3   --mode sweep --records-per-key 10 --duration 10s --min-rate 20000 --max-rate 140000 --relays 3
run drain-unkeyed --mode drain --messages 1000000 --records-per-key 0
run drain-keyed   --mode drain --messages 1000000 --keys 1000
run drain-keyed-1proc --mode drain --messages 1000000 --keys 1000 --in-process=false
run drain-keyed-2proc --mode drain --messages 1000000 --keys 1000 --relays 2
half=$(( ${sustainable:-50000} / 2 ))
run latency-settled --mode steady --rate "$half" --duration 20s --warmup 5s --records-per-key 10
# The same right after a 1M drain, without the checkpoint in between: what a
# relay sees when a backlog was just worked off.
"$bin" bench "${common[@]}" --mode drain --messages 1000000 --keys 1000 >/dev/null 2>&1
echo "== latency-after-drain (no checkpoint first)" >&2
"$bin" bench "${common[@]}" --mode steady --rate "$half" --duration 20s --warmup 5s --records-per-key 10 \
  --json "$out/latency-after-drain.json" --report "$out/latency-after-drain" 2>/dev/null | tee "$out/latency-after-drain.txt"
pg "SELECT 'checkpoints_timed=' || checkpoints_timed || ' checkpoints_req=' || checkpoints_req FROM pg_stat_bgwriter" | tee "$out/checkpoints.txt"
