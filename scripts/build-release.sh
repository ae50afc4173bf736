#!/usr/bin/env bash
# Builds the release binaries of wharf, exactly as the Dockerfile's build
# stage builds its binary (same command and flags), and their checksums.
#
#   scripts/build-release.sh [OUT_DIR]      # default OUT_DIR: dist
#   WHARF_RELEASE_PLATFORMS=linux/amd64 scripts/build-release.sh   # some platforms only
#
# The version comes from the VERSION file at the module root, and `wharf
# version` prints it. For each platform (linux/amd64, linux/arm64,
# darwin/amd64, darwin/arm64; wharf does not build for Windows) OUT_DIR gets
# one file, wharf-<version>-<os>-<arch>: the binary itself, not an archive,
# since it is a single static file with nothing to unpack beside it (the
# licence is in the repository). OUT_DIR/SHA256SUMS lists their SHA-256
# sums, in the format `sha256sum -c SHA256SUMS` checks.
#
# The binaries are static (CGO_ENABLED=0), have no local paths (-trimpath)
# and no symbol table (-s). Built from a git checkout they record the
# revision, which `wharf version` prints (-buildvcs=auto: also when GOFLAGS
# says otherwise). The binary for this machine is run once as a check.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(cat VERSION)
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "build-release: VERSION holds \"$version\"; write a semantic version without a v, such as 0.1.0" >&2
  exit 1
fi
dist="${1:-dist}"
platforms="${WHARF_RELEASE_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}"
host="$(go env GOHOSTOS)/$(go env GOHOSTARCH)"
mkdir -p "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

names=()
for platform in $platforms; do
  export GOOS=${platform%/*} GOARCH=${platform#*/}
  out="$work/$GOOS-$GOARCH"
  mkdir -p "$out"
  # Keep this line identical to the RUN line of the Dockerfile's build stage.
  CGO_ENABLED=0 go build -buildvcs=auto -trimpath -ldflags="-s -X github.com/wharfhq/wharf/internal/cli.Version=$(cat VERSION)" -o "$out/wharf" ./cmd/wharf
  name="wharf-$version-$GOOS-$GOARCH"
  mv "$out/wharf" "$dist/$name"
  names+=("$name")
  echo "$dist/$name"
done
unset GOOS GOARCH

(cd "$dist" && sha256sum "${names[@]}" > SHA256SUMS)
echo "$dist/SHA256SUMS"

for platform in $platforms; do
  if [ "$platform" = "$host" ]; then
    line=$("$dist/wharf-$version-${host%/*}-${host#*/}" version)
    echo "$line"
    if [[ $line != "wharf $version ("* ]]; then
      echo "build-release: the $host binary says \"$line\", not wharf $version" >&2
      exit 1
    fi
  fi
done
