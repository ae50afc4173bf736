#!/usr/bin/env bash
# Before/after comparison of two wharf builds on one machine, in one sitting:
# runs `wharf bench` with the same flags alternately (A B, then B A, ...) and
# prints, for each run, the machine's busy CPU time over the run (user,
# nice, system, irq and softirq from /proc/stat: producers, relays,
# PostgreSQL and the bench's setup alike) per message delivered, beside the
# bench's commits per message and latency. On a shared machine the rates move
# with the neighbours; CPU per message moves much less.
# usage: scripts/ab-cpu.sh DATABASE_URL OUTDIR BIN_A BIN_B PAIRS [wharf bench flags...]
# e.g.   scripts/ab-cpu.sh "$URL" out/ ./wharf-before ./wharf-after 2 --mode steady --rate 40000 --duration 15s
set -euo pipefail
url=$1 out=$2 a=$3 b=$4 pairs=$5
shift 5
mkdir -p "$out"
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
hz=$(getconf CLK_TCK)
for i in $(seq 1 "$pairs"); do
  order="A B"
  [ $((i % 2)) -eq 0 ] && order="B A"
  for which in $order; do
    bin=$a
    [ "$which" = B ] && bin=$b
    sleep 5 # let the previous run's writeback settle
    c0=$(busy)
    "$bin" bench --database-url "$url" "$@" --json "$out/$which-$i.json" >"$out/$which-$i.txt" 2>"$out/$which-$i.progress"
    c1=$(busy)
    python3 - "$out/$which-$i.json" "$which" "$i" "$c0" "$c1" "$hz" <<'PY'
import json, sys
path, which, i, c0, c1, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
d = json.load(open(path))
n = d.get("delivered") or d.get("messages")
cpu = (c1 - c0) / hz
lat = d.get("latency_ms") or {}
rate = d.get("producer_rate") if d.get("mode") == "steady" else d.get("processing_rate")
print(f"{which} {i}: cpu {cpu:.2f} s, {n} msgs, {cpu * 1e6 / n:.2f} us/msg, rate {rate:,.0f} msg/s, "
      f"commits/msg {d.get('commits_per_msg', 0):.4f}, p50 {lat.get('p50', float('nan')):.2f} ms, p99 {lat.get('p99', float('nan')):.2f} ms")
PY
  done
done
