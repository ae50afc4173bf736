#!/usr/bin/env bash
# The README's test command (make test, on the embedded PostgreSQL, CI=true,
# the test cache cleaned) RUNS times in a row with HOGS CPU-burning processes
# (yes > /dev/null) beside it: the check that no test depends on the
# machine's speed. Stops at the first failing run; each run's output is in
# $OUT/run<i>.log and one line per run in $OUT/summary.txt.
#
#   scripts/load-proof.sh            # 5 runs, 2 hogs
#   RUNS=3 HOGS=1 scripts/load-proof.sh
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"
HOGS="${HOGS:-2}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/wharf-load-proof.XXXXXX")}"
pids=()
for _ in $(seq 1 "$HOGS"); do yes > /dev/null & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
mkdir -p "$OUT"
echo "logs in $OUT"
for i in $(seq 1 "$RUNS"); do
  go clean -testcache
  start=$(date +%s)
  env -u TEST_DATABASE_URL CI=true make test > "$OUT/run$i.log" 2>&1
  rc=$?
  line="run $i: rc=$rc $(( $(date +%s) - start ))s"
  echo "$line" | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && { grep -E '^(--- FAIL|FAIL)' "$OUT/run$i.log" | head -20; exit 1; }
done
echo "$RUNS of $RUNS passed with $HOGS CPU hogs"
