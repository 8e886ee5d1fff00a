#!/usr/bin/env bash
# etcd built from the Go module proxy, for the control-plane tests and benchmark: the etcd server of one release of
# go.etcd.io/etcd/server/v3 (whose root package is etcd's main) and etcdctl.
#
#   hack/build-etcd.sh VERSION        # e.g. hack/build-etcd.sh 3.7.0 (what Kubernetes 1.37 is built and tested with)
#
# Debian 12's etcd-server is 3.4, which etcd no longer maintains and Kubernetes no longer tests with. The module
# stamps its own version (`etcd --version` says VERSION).
#
# Binaries go to a cache outside the work tree, keyed by version: $ETCD_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/etcd)/vVERSION/. A complete set already there is not built again.
# The script prints that directory last. Go and the module proxy are all it needs.
set -euo pipefail
# shellcheck source=hack/lib/binary-cache.sh
. "$(dirname "$0")/lib/binary-cache.sh"

version=${1:?usage: hack/build-etcd.sh VERSION (e.g. 3.7.0)}
case $version in
  3.[0-9]*.[0-9]*) ;;
  *) echo "hack/build-etcd.sh: VERSION is an etcd 3.x release without a v, e.g. 3.7.0: not '$version'" >&2; exit 1 ;;
esac
cache=${ETCD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/etcd}
out=$cache/v$version
binaries=(etcd etcdctl)

exit_if_built "$out" "${binaries[@]}"

started=$(date +%s)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && go mod init cri-probe-shim.local/build-etcd >/dev/null 2>&1 &&
 go get "go.etcd.io/etcd/server/v3@v$version" "go.etcd.io/etcd/etcdctl/v3@v$version" >/dev/null 2>&1 &&
 CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$work/bin/etcd" go.etcd.io/etcd/server/v3 &&
 CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$work/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3)
install_set "$work/bin" "$out" "${binaries[@]}"
echo "hack/build-etcd.sh: built etcd v$version in $(( $(date +%s) - started )) s" >&2
echo "$out"
