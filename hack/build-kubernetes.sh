#!/usr/bin/env bash
# Kubernetes binaries built from the Go module proxy, for the tests and the benchmark: a kubelet (and, asked for,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) of an upstream release, and crictl.
#
#   hack/build-kubernetes.sh VERSION [BINARY ...]      # e.g. hack/build-kubernetes.sh 1.37.2 kubelet crictl
#
# k8s.io/kubernetes@vVERSION is built as a module, as every project that builds from it does: its staging modules
# (k8s.io/api, k8s.io/apimachinery, ...) are replaced by their published v0.MINOR.PATCH versions, read from its
# own go.mod. The upstream version is stamped as hack/lib/version.sh stamps it (`kubelet --version` says
# "Kubernetes vVERSION"); both are hack/lib/kubernetes-module.sh's. crictl comes from sigs.k8s.io/cri-tools
# (CRICTL_VERSION, the newest the proxy serves for the minor if unset: see below).
#
# Binaries go to a cache outside the work tree, keyed by version: $K8S_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/kubernetes)/vVERSION/BINARY. One already there is not built again.
# The script prints that directory last. Go and the module proxy are all it needs.
set -euo pipefail
# shellcheck source=hack/lib/kubernetes-module.sh
. "$(dirname "$0")/lib/kubernetes-module.sh"

version=${1:?usage: hack/build-kubernetes.sh VERSION [BINARY ...] (e.g. 1.37.2 kubelet crictl)}
shift
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(kubelet)
case $version in
  [0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "hack/build-kubernetes.sh: VERSION is MAJOR.MINOR.PATCH without a v, e.g. 1.37.2: not '$version'" >&2; exit 1 ;;
esac
minor=${version#*.}; minor=${minor%%.*}
cache=${K8S_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/kubernetes}
out=$cache/v$version
mkdir -p "$out"

# crictl of the same minor where the proxy serves one; cri-tools v1.35/1.36 are not served, and crictl speaks
# the same CRI to every runtime of these releases.
declare -A CRICTL_FOR_MINOR=([35]=1.37.0 [36]=1.37.0 [37]=1.37.0)
crictl_version=${CRICTL_VERSION:-${CRICTL_FOR_MINOR[$minor]:-1.37.0}}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

kubernetes_module() {
  # A module that requires k8s.io/kubernetes with its staging modules replaced by their published versions.
  local dir=$work/kubernetes
  [ -f "$dir/go.mod" ] && return
  mkdir -p "$dir"
  (cd "$dir" && go mod init cri-probe-shim.local/build-kubernetes >/dev/null 2>&1)
  (cd "$dir" && kubernetes_requirements "$version") >>"$dir/go.mod"
}

for binary in "${binaries[@]}"; do
  if [ -x "$out/$binary" ]; then
    echo "hack/build-kubernetes.sh: $out/$binary is there" >&2
    continue
  fi
  started=$(date +%s)
  case $binary in
    kubelet|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      kubernetes_module
      (cd "$work/kubernetes" && CGO_ENABLED=0 go build -mod=mod -trimpath \
        -ldflags "-s -w $(kubernetes_version_ldflags "$version")" -o "$out/$binary.partial" "k8s.io/kubernetes/cmd/$binary")
      ;;
    crictl)
      mkdir -p "$work/crictl"
      (cd "$work/crictl" && go mod init cri-probe-shim.local/build-crictl >/dev/null 2>&1 &&
       go get "sigs.k8s.io/cri-tools@v$crictl_version" >/dev/null 2>&1 &&
       CGO_ENABLED=0 go build -mod=mod -trimpath \
         -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$crictl_version" \
         -o "$out/$binary.partial" sigs.k8s.io/cri-tools/cmd/crictl)
      ;;
    *)
      echo "hack/build-kubernetes.sh: no recipe for '$binary' (kubelet, kube-apiserver, kube-controller-manager," \
           "kube-scheduler, kubectl, crictl)" >&2
      exit 1 ;;
  esac
  mv "$out/$binary.partial" "$out/$binary"  # only a whole binary counts as built
  echo "hack/build-kubernetes.sh: built $out/$binary in $(( $(date +%s) - started )) s" >&2
done
echo "$out"
