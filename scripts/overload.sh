#!/usr/bin/env bash
# The overload table: what the relay processes when it is offered more than
# its sustainable rate S. For each outbox mode (table, wal) and each factor f
# (1.25, 1.5, 2 by default) it makes RUNS steady runs with the producers at S
# and the outbox pre-filled with (f - 1) * S * DURATION messages
# (`wharf bench --mode steady --backlog`), so that the relay is offered about
# f * S over the window, and prints one line per run: the offered and
# processed rates (as the bench defines them), processed / S, the worst
# second, and whether the relay had work all along.
#
# usage: scripts/overload.sh [OUTDIR]        (the runs' JSON go to OUTDIR)
# environment:
#   S_TABLE, S_WAL   the sustainable rate per mode, msgs/s; a mode without one
#                    gets it from a short sweep first (SWEEP_DURATION, default 3s,
#                    after SWEEP_WARMUP, default 1s)
#   DURATION         each run's window after the warm-up (default 8s)
#   WARMUP           each run's warm-up (default 0s: none, so that the window
#                    starts with the whole backlog in front of the relay, which
#                    would otherwise work some of it off before the window)
#   FACTORS          default "1.25 1.5 2"
#   RUNS             runs per factor and mode (default 3)
#   MODES            default "table wal"
#   DATABASE_URL     the PostgreSQL to use (wal_level=logical for wal); unset,
#                    every run starts a throwaway one of its own
#   WHARF_BIN        the wharf binary (default: built into OUTDIR)
#   BENCH_ARGS       further `wharf bench` flags for every run
# Everything the bench runs shares the machine: a loaded machine lowers S
# and every figure with it (the table's header gives the load average).
set -euo pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || go build -o "$bin" ./cmd/wharf
duration=${DURATION:-8s}
warmup=${WARMUP:-0s}
factors=${FACTORS:-1.25 1.5 2}
runs=${RUNS:-3}
modes=${MODES:-table wal}
sweep_duration=${SWEEP_DURATION:-3s}
sweep_warmup=${SWEEP_WARMUP:-1s}
read -r -a extra <<<"${BENCH_ARGS:-}"
db=()
[ -n "${DATABASE_URL:-}" ] && db=(--database-url "$DATABASE_URL")

seconds() { # a Go duration in whole or fractional seconds (s or ms only)
  case $1 in
    0) echo 0 ;;
    *ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *) echo "DURATION and WARMUP take seconds or milliseconds, like 8s or 500ms; got $1" >&2; exit 2 ;;
  esac
}
dur_s=$(seconds "$duration")
seconds "$warmup" >/dev/null

bench() { # json, flags...
  local json=$1; shift
  "$bin" bench "${db[@]}" "${extra[@]}" "$@" --json "$json" >"${json%.json}.txt" 2>"${json%.json}.log"
}

echo "# overload: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# window ${duration} after a ${warmup} warm-up; producers at S; backlog (f - 1) × S × ${duration}; offered and processed are over the window"
lines=()
for mode in $modes; do
  var="S_${mode^^}"
  s=${!var:-}
  if [ -z "$s" ]; then
    json="$out/sweep-$mode.json"
    echo "# $mode: no $var given, measuring S with a short sweep (--duration $sweep_duration) ..." >&2
    bench "$json" --mode sweep --outbox-mode "$mode" --duration "$sweep_duration" --warmup "$sweep_warmup" --sweep-steps 5
    s=$(jq -r '.target_rate | floor' "$json")
    if [ "$s" -lt 1 ]; then
      echo "the sweep of the $mode outbox found no sustainable rate (see $json); give $var" >&2
      exit 1
    fi
  fi
  echo "# $mode: S = $s msg/s"
  for f in $factors; do
    backlog=$(awk -v f="$f" -v s="$s" -v d="$dur_s" 'BEGIN { printf "%d", (f - 1) * s * d }')
    for run in $(seq 1 "$runs"); do
      json="$out/$mode-$f-$run.json"
      echo "# $mode ×$f run $run: --rate $s --backlog $backlog" >&2
      bench "$json" --mode steady --outbox-mode "$mode" --rate "$s" --backlog "$backlog" \
        --duration "$duration" --warmup "$warmup" --tail-wait 0
      lines+=("$(jq -r --arg f "$f" --arg mode "$mode" --arg run "$run" --argjson s "$s" '
        .overload as $o |
        def two: . * 100 | round | tostring | (if length < 3 then ("00" + .)[-3:] else . end) | .[:-2] + "." + .[-2:];
        [$f, $mode, $run, $s, ($o.offered_rate | floor), ($o.processed_rate | floor),
         ($o.processed_rate / $s | two),
         (if $o.offered_rate > 0 then ($o.processed_rate / $o.offered_rate | two) else "n/a" end),
         (if $o.worst_second_at >= 0 then "\($o.worst_second_processed) (s\($o.worst_second_at + 1))" else "n/a" end),
         (if $o.saturated then "yes" else "no" end),
         (.producer_rate | floor)] | @tsv' "$json")")
    done
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg); JSON in $out"
{
  printf 'factor\tmode\trun\tS\toffered\tprocessed\tprocessed/S\tprocessed/offered\tworst second\tsaturated\tproducers\n'
  printf '%s\n' "${lines[@]}"
} | column -t -s $'\t'
