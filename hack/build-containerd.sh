#!/usr/bin/env bash
# containerd 2.x built from the Go module proxy, for the tests and the benchmark: containerd, its runc shim
# (containerd-shim-runc-v2) and ctr of one release of github.com/containerd/containerd/v2.
#
#   hack/build-containerd.sh VERSION        # e.g. hack/build-containerd.sh 2.4.2
#
# Debian's runc, CNI plugins and busybox stay what the tests use; only containerd itself is built. cgo is off and
# the btrfs, devmapper and zfs snapshotters are left out (the tests use overlayfs): a static build needs no C
# headers. The version is stamped (`containerd --version` says vVERSION).
#
# Binaries go to a cache outside the work tree, keyed by version: $CONTAINERD_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/containerd)/vVERSION/. A complete set already there is not built
# again. The script prints that directory last. Go and the module proxy are all it needs.
set -euo pipefail
# shellcheck source=hack/lib/binary-cache.sh
. "$(dirname "$0")/lib/binary-cache.sh"

version=${1:?usage: hack/build-containerd.sh VERSION (e.g. 2.4.2)}
case $version in
  2.[0-9]*.[0-9]*) ;;
  *) echo "hack/build-containerd.sh: VERSION is a containerd 2.x release without a v, e.g. 2.4.2: not '$version'" >&2
     exit 1 ;;
esac
cache=${CONTAINERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/containerd}
out=$cache/v$version
binaries=(containerd containerd-shim-runc-v2 ctr)

exit_if_built "$out" "${binaries[@]}"

started=$(date +%s)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
module=github.com/containerd/containerd/v2
(cd "$work" && go mod init cri-probe-shim.local/build-containerd >/dev/null 2>&1 &&
 go get "$module@v$version" >/dev/null 2>&1 &&
 CGO_ENABLED=0 go build -mod=mod -trimpath -tags "no_btrfs no_devmapper no_zfs" \
   -ldflags "-s -w -X $module/version.Version=v$version -X $module/version.Revision=module-proxy" \
   -o "$work/bin/" "$module/cmd/containerd" "$module/cmd/containerd-shim-runc-v2" "$module/cmd/ctr")
install_set "$work/bin" "$out" "${binaries[@]}"
echo "hack/build-containerd.sh: built containerd v$version in $(( $(date +%s) - started )) s" >&2
echo "$out"
