#!/usr/bin/env bash
# The kubelet with the probe-delegation patch series (kubelet/patches/*.patch: KEP-4559's option 5 behind the alpha
# feature gate CRIProbeDelegation), built from k8s.io/kubernetes@vVERSION's own source with the series applied.
#
#   hack/build-kubelet-delegating.sh                 # build it unless built from these patches; print its path
#   hack/build-kubelet-delegating.sh --source DIR    # only write the patched source tree to DIR (review, go test)
#   hack/build-kubelet-delegating.sh --test          # go test the packages the series touches, patched
#   hack/build-kubelet-delegating.sh --path          # where the build of this series is (or goes), built or not
#
# The series is written against VERSION (kubelet/VERSION, 1.37.2). The source is the module's, as the module proxy
# serves it (the same bytes hack/build-kubernetes.sh builds); it is copied, patched with `patch -p1` (every hunk must
# apply exactly: --fuzz=0), and built as hack/build-kubernetes.sh builds the kubelet (hack/lib/kubernetes-module.sh:
# the staging modules replaced by their published versions, the version stamped), with k8s.io/kubernetes replaced
# by the patched copy. Into a cache outside the work tree keyed by version and the series' hash:
# $K8S_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/kubernetes)/vVERSION-delegating-HASH/kubelet.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
series=$(cd "$here/../kubelet" && pwd)
# shellcheck source=hack/lib/kubernetes-module.sh
. "$here/lib/kubernetes-module.sh"

version=$(cat "$series/VERSION")
patches=("$series"/patches/*.patch)
hash=$(cat "${patches[@]}" "$0" | sha256sum | cut -c1-12)  # the series and how it is built
cache=${K8S_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/kubernetes}
out=$cache/v$version-delegating-$hash

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

patched_source() {
  # patched_source DIR: k8s.io/kubernetes@vVERSION's source in DIR with the series applied.
  local dir=$1 module patch
  module=$(module_download "k8s.io/kubernetes@v$version" Dir)
  [ -d "$module" ] || { echo "hack/build-kubelet-delegating.sh: no source for k8s.io/kubernetes@v$version" >&2; return 1; }
  mkdir -p "$dir"
  cp -R "$module/." "$dir/"
  # The module has no staging tree; the series changes cri-api where upstream keeps it, so its published release
  # goes there first (the bytes k8s.io/kubernetes is built with otherwise).
  module=$(module_download "k8s.io/cri-api@$(staging_version)" Dir)
  mkdir -p "$dir/staging/src/k8s.io/cri-api"
  cp -R "$module/." "$dir/staging/src/k8s.io/cri-api/"
  chmod -R u+w "$dir"
  for patch in "${patches[@]}"; do
    patch -d "$dir" -p1 --fuzz=0 --no-backup-if-mismatch --quiet <"$patch" ||
      { echo "hack/build-kubelet-delegating.sh: $(basename "$patch") does not apply to v$version" >&2; return 1; }
  done
}

staging_version() {
  # The published version of the staging modules for VERSION: v0.MINOR.PATCH.
  local minor=${version#*.}
  echo "v0.${minor%%.*}.${version##*.}"
}

build_module() {
  # build_module DIR SOURCE: a module that requires k8s.io/kubernetes, replaced by SOURCE, and cri-api by SOURCE's
  # staging copy (the other staging modules by their published versions, as hack/build-kubernetes.sh builds).
  local dir=$1 source=$2
  mkdir -p "$dir"
  (cd "$dir" && go mod init cri-probe-shim.local/build-kubelet-delegating >/dev/null 2>&1)
  (cd "$dir" && kubernetes_requirements "$version") | grep -v '^[[:space:]]*k8s.io/cri-api =>' >>"$dir/go.mod"
  echo "replace k8s.io/kubernetes => $source" >>"$dir/go.mod"
  echo "replace k8s.io/cri-api => $source/staging/src/k8s.io/cri-api" >>"$dir/go.mod"
}

case ${1:-} in
  --path)
    echo "$out/kubelet"
    exit 0 ;;
  --source)
    patched_source "${2:?usage: hack/build-kubelet-delegating.sh --source DIR}"
    exit 0 ;;
  --test)
    patched_source "$work/kubernetes"
    build_module "$work/build" "$work/kubernetes"
    # The packages the series adds or changes (kubelet/TESTED lists them).
    mapfile -t packages < <(grep -v '^#' "$series/TESTED" | sed '/^$/d')
    (cd "$work/build" && go test -mod=mod -count=1 "${packages[@]}")
    exit 0 ;;
esac

if [ -x "$out/kubelet" ]; then
  echo "$out/kubelet"
  exit 0
fi
started=$(date +%s)
patched_source "$work/kubernetes"
build_module "$work/build" "$work/kubernetes"
mkdir -p "$out"
(cd "$work/build" && CGO_ENABLED=0 go build -mod=mod -trimpath \
  -ldflags "-s -w $(kubernetes_version_ldflags "$version")" -o "$out/kubelet.partial" k8s.io/kubernetes/cmd/kubelet)
mv "$out/kubelet.partial" "$out/kubelet"  # only a whole binary counts as built
echo "hack/build-kubelet-delegating.sh: built $out/kubelet (v$version, ${#patches[@]} patches) in" \
     "$(( $(date +%s) - started )) s" >&2
echo "$out/kubelet"
