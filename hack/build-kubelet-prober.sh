#!/usr/bin/env bash
# The reference prober (tests/reference/kubelet_prober: the kubelet's own prober code, of the k8s.io/kubernetes its
# go.mod requires), built for tests/system/test_kubelet_prober_reference.py.
#
#   hack/build-kubelet-prober.sh                    # build it unless built from these sources; print its path
#   hack/build-kubelet-prober.sh --module VERSION   # point its go.mod (and go.sum) at k8s.io/kubernetes@vVERSION
#
# It is built as hack/build-kubernetes.sh builds the kubelet (hack/lib/kubernetes-module.sh: the staging modules
# replaced by their published versions, the version stamped, so its User-Agent is kube-probe/MAJOR.MINOR), with
# the same flags, so that a machine that built the kubelet compiles little more; into a cache outside the work tree,
# keyed by version: $REFERENCE_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/reference)/
# vVERSION/kubelet-prober, beside a file naming the hash of the sources it was built from. The binary is built
# again only when those sources change. Go and the module proxy are all it needs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../tests/reference/kubelet_prober" && pwd)
# shellcheck source=hack/lib/kubernetes-module.sh
. "$here/lib/kubernetes-module.sh"

if [ "${1:-}" = --module ]; then
  version=${2:?usage: hack/build-kubelet-prober.sh --module VERSION (e.g. 1.37.2)}
  {
    printf 'module cri-probe-shim.local/kubelet-prober\n\n'
    sed -n 's/^go .*/&/p' "$(kubernetes_gomod "$version")"  # the Go version k8s.io/kubernetes is written for
    echo
    kubernetes_requirements "$version"
  } >"$src/go.mod.new"
  mv "$src/go.mod.new" "$src/go.mod"
  rm -f "$src/go.sum"
  (cd "$src" && go mod tidy)
  echo "hack/build-kubelet-prober.sh: $src/go.mod now requires k8s.io/kubernetes v$version" >&2
  exit 0
fi

version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes v\([0-9.]*\)$/\1/p' "$src/go.mod" | head -n 1)
[ -n "$version" ] || { echo "hack/build-kubelet-prober.sh: $src/go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
out=${REFERENCE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/reference}/v$version
binary=$out/kubelet-prober
sources=$(cd "$src" && cat main.go go.mod go.sum | sha256sum | cut -c1-16)

if [ -x "$binary" ] && [ "$(cat "$binary.sources" 2>/dev/null)" = "$sources" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$out"
started=$(date +%s)
(cd "$src" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w $(kubernetes_version_ldflags "$version")" \
  -o "$binary.partial.$$" .)
mv "$binary.partial.$$" "$binary"  # only a whole binary counts as built
echo "$sources" >"$binary.sources"
echo "hack/build-kubelet-prober.sh: built $binary (k8s.io/kubernetes v$version) in $(( $(date +%s) - started )) s" >&2
echo "$binary"
