#!/usr/bin/env bash
# The API check (make api): compares the exported API of every package of the
# module outside internal/ with the API of the last release, recorded in
# api/wharf-<version>.apidiff (export data written by apidiff,
# golang.org/x/exp/cmd/apidiff, pinned below), and fails on an incompatible
# change, listing it. Compatible changes (additions) are listed and pass.
#
#   scripts/apicheck.sh            # make api: check the working tree against the baseline
#   scripts/apicheck.sh -update    # make api/update: write the baseline from the working tree
#
# An intended breaking change: list it under "Breaking" in CHANGELOG.md, then
# write the baseline again with -update and commit it with the change.
set -euo pipefail
cd "$(dirname "$0")/.."

APIDIFF_VERSION=v0.0.0-20261113113407-e3970619a1a4
baseline=api/wharf-0.1.0.apidiff
go=${GO:-go}
module=$("$go" list -m)

gobin=$("$go" env GOBIN)
apidiff=${gobin:-$("$go" env GOPATH)/bin}/apidiff
if ! "$go" version -m "$apidiff" 2>/dev/null | grep -q "golang.org/x/exp[[:space:]]*$APIDIFF_VERSION"; then
  echo "== installing apidiff $APIDIFF_VERSION"
  GOFLAGS= "$go" install "golang.org/x/exp/cmd/apidiff@$APIDIFF_VERSION"
fi

# apidiff names every internal package it leaves out on stderr: drop those lines.
quiet() { grep -v '^Ignoring internal package ' >&2 || true; }

if [ "${1:-}" = "-update" ]; then
  "$apidiff" -m -w "$baseline" "$module" 2> >(quiet)
  echo "wrote $baseline from the working tree"
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "usage: scripts/apicheck.sh [-update]" >&2
  exit 2
fi

report=$("$apidiff" -m "$baseline" "$module" 2> >(quiet))
if grep -q '^Incompatible changes:' <<<"$report"; then
  echo "$report"
  echo
  echo "api: the exported API changed incompatibly since $baseline (above, under \"Incompatible changes\")."
  echo "api: if the change is not intended, restore what was removed or changed."
  echo "api: if it is, list it under \"Breaking\" in CHANGELOG.md, then write the baseline again and commit it:"
  echo "api:     scripts/apicheck.sh -update    (or: make api/update)"
  exit 1
fi
if [ -n "$report" ]; then
  echo "$report"
  echo "api: compatible changes only (listed above) since $baseline."
else
  echo "api: no change to the exported API since $baseline."
fi
