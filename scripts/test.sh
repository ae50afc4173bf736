#!/usr/bin/env bash
# The test suite as the README runs it (make test): go test ./... with any
# extra go test flags given, then one line saying which tests were skipped
# for lack of a tool or a server (chromium, promtool, pgbouncer,
# nats-server, redis-server, rabbitmq-server, ...) and how many long tests
# were left to CI. Exits with go test's status.
#
# Tests skip through internal/testtool, which appends a line to
# $WHARF_SKIP_LOG: "tool<TAB>name<TAB>package<TAB>test" or
# "long<TAB><TAB>package<TAB>test". Under CI=true a missing tool fails its
# test instead, and WHARF_LONG_TESTS=1 runs the long tests.
#
# Most tests spend their time waiting on PostgreSQL, brokers and child
# processes, not on the CPU, so the suite runs 4 packages at a time (-p 4)
# and up to 8 parallel tests in each (-parallel 8) instead of go test's
# default of the CPU count: on 2 cores that halves the wall time. Flags given
# to this script come later and win (scripts/test.sh -p 2 -parallel 2). With
# WHARF_LONG_TESTS=1 (make test/long) go test's defaults stand: the soaks
# measure rates and should not share the machine with seven other tests.
set -uo pipefail
cd "$(dirname "$0")/.."

WHARF_SKIP_LOG=$(mktemp "${TMPDIR:-/tmp}/wharf-skips.XXXXXX")
export WHARF_SKIP_LOG
trap 'rm -f "$WHARF_SKIP_LOG"' EXIT

wide=(-p 4 -parallel 8)
if [ "${WHARF_LONG_TESTS:-}" = 1 ]; then
  wide=()
fi
"${GO:-go}" test ${wide[@]+"${wide[@]}"} "$@" ./...
rc=$?

sort -u "$WHARF_SKIP_LOG" | awk -F'\t' '
  $1 == "tool" {
    n[$2]++
    if (!($2 in tests)) { order[++k] = $2; tests[$2] = $4 } else if (n[$2] <= 3) tests[$2] = tests[$2] ", " $4
    total++
  }
  $1 == "long" { long++ }
  END {
    if (total == 0) line = "wharf-skip: no test skipped for lack of a tool"
    else {
      for (i = 1; i <= k; i++) {
        t = order[i]; more = n[t] > 3 ? sprintf(" and %d more", n[t] - 3) : ""
        s = s (i > 1 ? "; " : "") t " (" n[t] " test" (n[t] > 1 ? "s" : "") ": " tests[t] more ")"
      }
      line = sprintf("wharf-skip: %d test%s skipped for lack of a tool: %s; install it (.ci/run shows how) to run them", total, (total > 1 ? "s" : ""), s)
    }
    if (long > 0) line = line sprintf("; %d long test%s left to CI (WHARF_LONG_TESTS=1 runs them)", long, (long > 1 ? "s" : ""))
    print line "."
  }'
exit $rc
