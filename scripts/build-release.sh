#!/usr/bin/env bash
# Builds the release binary of wharf exactly as the Dockerfile's build stage
# does (same command and flags), for CI and hosts without a container engine.
#
#   scripts/build-release.sh [OUT_DIR]      # default OUT_DIR: dist
#   GOOS=linux GOARCH=arm64 scripts/build-release.sh dist/linux-arm64
#
# The binary is static (CGO_ENABLED=0), has no local paths (-trimpath) and no
# symbol table (-s). Built from a git checkout it records the revision, which
# `wharf version` prints (-buildvcs=auto: also when GOFLAGS says otherwise;
# a source tree without .git builds as "(devel)"). When the binary can run
# here, it is run once as a check.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-dist}"
mkdir -p "$out"

# Keep this line identical to the RUN line of the Dockerfile's build stage.
CGO_ENABLED=0 go build -buildvcs=auto -trimpath -ldflags=-s -o "$out/wharf" ./cmd/wharf

if [ "$(go env GOOS)/$(go env GOARCH)" = "$(go env GOHOSTOS)/$(go env GOHOSTARCH)" ]; then
  "$out/wharf" version
fi
