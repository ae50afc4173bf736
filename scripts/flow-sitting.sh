#!/usr/bin/env bash
# One sitting of the flow workloads beside DBOS Transact Go: ROUNDS rounds,
# each running Wharf's steps, signal and children workloads (a drain, then a
# paced phase at half the drained rate for the step-to-step latency), the
# keyed workload with 1, 2 and 4 runners, the ratelimited workload, and
# DBOS's steps, signal, children and keyed workloads (scripts/dbos-bench) on
# the same server. Every run's output (and Wharf's JSON) lands in OUTDIR;
# the tables are printed at the end (scripts/flow-sitting-tables.py).
# usage: scripts/flow-sitting.sh DATABASE_URL OUTDIR [ROUNDS]
# Numbers are noisy on a shared machine: compare ratios within one sitting.
set -uo pipefail
url=$1 out=$2 rounds=${3:-3}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || (cd "$here" && go build -o "$bin" ./cmd/wharf) || exit 1
dbos=${DBOS_BIN:-$out/dbos-bench}
[ -x "$dbos" ] || (cd "$here/scripts/dbos-bench" && go build -o "$dbos" .) || exit 1

run() { # name, command...
  local name=$1; shift
  echo "$(date +%T) $name: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/sitting.log" >&2
  timeout "${RUN_TIMEOUT:-600}" "$@" >"$out/$name.txt" 2>"$out/$name.progress"
  echo "$(date +%T) $name: exit $?" | tee -a "$out/sitting.log" >&2
}

for i in $(seq 1 "$rounds"); do
  run "wharf-steps-$i" "$bin" bench --mode flow --database-url "$url" --workload steps --flows 20000 --json "$out/wharf-steps-$i.json"
  run "wharf-signal-$i" "$bin" bench --mode flow --database-url "$url" --workload signal --flows 20000 --json "$out/wharf-signal-$i.json"
  run "wharf-children-$i" "$bin" bench --mode flow --database-url "$url" --workload children --flows 10000 --json "$out/wharf-children-$i.json"
  for r in 1 2 4; do
    run "wharf-keyed-r$r-$i" "$bin" bench --mode flow --database-url "$url" --workload keyed --flows 750 --runners "$r" \
      --paced -1s --json "$out/wharf-keyed-r$r-$i.json"
  done
  run "wharf-ratelimited-$i" "$bin" bench --mode flow --database-url "$url" --workload ratelimited --json "$out/wharf-ratelimited-$i.json"
  run "dbos-$i" "$dbos" --database-url "$url" --flows 2000 --concurrency 64 --workload steps,signal,children
  run "dbos-keyed-$i" "$dbos" --database-url "$url" --flows 750 --concurrency 750 --workload keyed
done
python3 "$here/scripts/flow-sitting-tables.py" "$out" "$rounds"
