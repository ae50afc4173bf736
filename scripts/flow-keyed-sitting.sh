#!/usr/bin/env bash
# One sitting of the flow-control workloads, Wharf beside DBOS: the keyed
# workload (parents spawning 3 one-step children of 2-10 ms under 4
# concurrency keys of limit 2) with 1, 2 and 4 runners, the ratelimited
# workload (200/s, burst 10, for 10 s) with 1 and 2 runners, and the same
# keyed workload on DBOS (a partitioned queue) with 1 and 2 executors. Every
# run's summary, progress and (Wharf) JSON land in OUTDIR, its exit status
# in OUTDIR/sitting.log: a keyed run that stalls past DRAIN_TIMEOUT (default
# 240s) is reported incomplete, with how far it got, and exits non-zero.
# usage: scripts/flow-keyed-sitting.sh DATABASE_URL OUTDIR [FLOWS]
# FLOWS is the keyed parents (default 750). Numbers are noisy on a shared
# machine: compare ratios within one sitting.
set -uo pipefail
url=$1 out=$2 flows=${3:-750}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || (cd "$here" && go build -o "$bin" ./cmd/wharf) || exit 1
dbos=${DBOS_BIN:-$out/dbos-bench}
[ -x "$dbos" ] || (cd "$here/scripts/dbos-bench" && go build -o "$dbos" .) || exit 1
timeout_s=${RUN_TIMEOUT:-300}

run() { # name, command...
  local name=$1; shift
  echo "$(date +%T) $name: load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a "$out/sitting.log" >&2
  timeout "$timeout_s" "$@" >"$out/$name.txt" 2>"$out/$name.progress"
  local rc=$?
  echo "$(date +%T) $name: exit $rc" | tee -a "$out/sitting.log" >&2
  cat "$out/$name.txt"
}

wharf() { # name, runners, flags...
  local name=$1 runners=$2; shift 2
  run "$name" "$bin" bench --mode flow --database-url "$url" --runners "$runners" \
    --drain-timeout "${DRAIN_TIMEOUT:-240s}" --json "$out/$name.json" "$@"
}

for r in 1 2 4; do
  wharf "keyed-r$r" "$r" --workload keyed --flows "$flows"
done
for r in 1 2; do
  wharf "ratelimited-r$r" "$r" --workload ratelimited
done
for e in 1 2; do
  run "dbos-keyed-e$e" "$dbos" --database-url "$url" --workload keyed,keyed-unkeyed \
    --flows "$flows" --concurrency "$flows" --executors "$e"
done
