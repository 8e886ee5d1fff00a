#!/usr/bin/env bash
# The Go workloads of the tests' pods (tests/workloads/*: grpc-health, a grpc.health.v1 server), built statically
# for the test images, into a cache outside the work tree keyed by the hash of their sources:
# $WORKLOADS_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/workloads)/HASH/NAME.
#
#   hack/build-test-workloads.sh        # build unless built from these sources; print the directory
#
# Go and the module proxy are all it needs.
set -euo pipefail

src=$(cd "$(dirname "$0")/../tests/workloads" && pwd)
sources=$(cd "$src" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) | LC_ALL=C sort |
          xargs cat | sha256sum | cut -c1-16)
out=${WORKLOADS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/workloads}/$sources
for dir in "$src"/*/; do
  name=$(basename "$dir"); name=${name//_/-}
  [ -x "$out/$name" ] && continue
  mkdir -p "$out"
  started=$(date +%s)
  (cd "$dir" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out/$name.partial.$$" .)
  mv "$out/$name.partial.$$" "$out/$name"  # only a whole binary counts as built
  echo "hack/build-test-workloads.sh: built $out/$name in $(( $(date +%s) - started )) s" >&2
done
echo "$out"
