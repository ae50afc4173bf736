#!/usr/bin/env bash
# One sitting of the figures that back the sustainable-rate and physical-limit
# claims: ROUNDS sweeps interleaved with ROUNDS baselines (Wharf's enqueue and
# drain beside the bare INSERT and bare claim+delete limits), then the
# enqueue-parts benchmark. Every run's JSON and summary land in OUTDIR, and
# the tables are printed at the end.
# usage: scripts/bench-sitting.sh DATABASE_URL OUTDIR [ROUNDS]
# Run it on a machine as quiet as you can get: producers, relays and
# PostgreSQL share the cores. The load average is logged before every run.
set -euo pipefail
url=$1 out=$2 rounds=${3:-3}
mkdir -p "$out"
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || go build -o "$bin" ./cmd/wharf
shape=(--records-per-key 10 --producers 4 --producer-batch 100 --payload-bytes 200 --duration 10s)

# settle waits (at most SETTLE_MAX seconds, default 120) for the 1-minute load
# average to fall below SETTLE_LOAD (default 1.0): the previous run's
# processes are gone at once, but PostgreSQL's checkpoint and the page cache
# writeback it left are not, and they weigh on the next run.
settle() {
  local max=${SETTLE_MAX:-120} limit=${SETTLE_LOAD:-1.0} waited=0
  while [ "$waited" -lt "$max" ] && awk -v l="$limit" '{exit !($1 >= l)}' /proc/loadavg; do
    sleep 5; waited=$((waited + 5))
  done
}

run() { # name, wharf bench flags...
  local name=$1; shift
  settle
  echo "$(date +%T) $name: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/sitting.log" >&2
  "$bin" bench --database-url "$url" "${shape[@]}" "$@" --json "$out/$name.json" >"$out/$name.txt" 2>"$out/$name.progress"
}

for i in $(seq 1 "$rounds"); do
  run "sweep-$i" --mode sweep --limits
  run "baseline-$i" --mode baseline
done
if [ -z "${SKIP_PARTS:-}" ]; then # SKIP_PARTS=1 leaves the enqueue-parts benchmark out
  settle
  echo "$(date +%T) enqueue parts: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/sitting.log" >&2
  TEST_DATABASE_URL=$url go test -run '^$' -bench EnqueueParts -benchtime 1x -timeout 60m ./internal/bench \
    >"$out/enqueue-parts.txt" 2>"$out/enqueue-parts.progress"
fi

python3 - "$out" "$rounds" <<'EOF'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
load = lambda n: json.load(open(f"{out}/{n}.json"))
print("| sweep | highest sustainable rate | runs at it | of insert limit | load avg at start |")
print("|---|---|---|---|---|")
for i in range(1, rounds + 1):
    s = load(f"sweep-{i}")
    la = s["environment"].get("load_average_start") or ["?"]
    lim = s.get("limits") or {}
    frac = f"{100*lim['producer_fraction']:.1f} % of {lim['insert_rate']:,.0f}" if lim.get("producer_fraction") else "-"
    print(f"| {i} | {s['target_rate']:,.0f} msg/s | {s.get('confirmed_runs', 0)} | {frac} | {la[0]} |")
for i in range(1, rounds + 1):
    s = load(f"sweep-{i}")
    print(f"\nsweep {i} runs:\n")
    print("| rate | role | producers | growth msg/s ± 95 % | tolerance | p | detects ≥ | backlog at stop | median p99/s ms (bound) | window p99 ms | deadlocks | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for st in s["steps"]:
        g = st["backlog_growth"]
        lat = st.get("latency_ms") or {}
        p99s, p99 = lat.get("p99_per_second_median", float("nan")), lat.get("p99", float("nan"))
        bound = f" (≤ {st['p99_bound_ms']:.0f})" if st.get("p99_bound_ms") else ""
        failed = [c["name"] for c in st["criteria"] if c["judged"] and not c["met"]]
        verdict = "pass" if st["sustainable"] else "FAIL " + ", ".join(failed)
        print(f"| {st['rate']:,} | {st['role']} | {100*st['producer_rate']/st['rate']:.1f} % | {g['slope']:.0f} ± {g['upper_95']-g['slope']:.0f} | {g['tolerance']:.0f} | {g['p_value']:.2g} | {g['detectable_95']:.0f} | {st['backlog_at_stop']:,} | {p99s:.1f}{bound} | {p99:.1f} | {st.get('deadlocks', '?')} | {verdict} |")
print("\n| baseline | Wharf enqueue | insert limit | fraction | Wharf drain | removal limit | fraction | load avg at start |")
print("|---|---|---|---|---|---|---|---|")
for i in range(1, rounds + 1):
    b = load(f"baseline-{i}")
    l = b["limits"]
    la = b["environment"].get("load_average_start") or ["?"]
    print(f"| {i} | {b['producer_rate']:,.0f} | {l['insert_rate']:,.0f} | {100*l['producer_fraction']:.1f} % | {b['processing_rate']:,.0f} | {l['removal_rate']:,.0f} | {100*l['drain_fraction']:.1f} % | {la[0]} |")
env = load("sweep-1")["environment"]
print("\nPostgreSQL:", " ".join(f"{s['name']}={s['value']}" for s in env["postgres_settings"]), "TLS:", env["tls"], "cores:", env["cores"])
import os
if os.path.exists(f"{out}/enqueue-parts.txt"):
    print()
    print(open(f"{out}/enqueue-parts.txt").read())
EOF
