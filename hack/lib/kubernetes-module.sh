# Sourced by hack/build-*.sh: k8s.io/kubernetes as a module dependency.
#
# k8s.io/kubernetes@vVERSION is built as every project that builds from it does: its staging modules
# (k8s.io/api, k8s.io/apimachinery, ...) are replaced by their published v0.MINOR.PATCH versions, read from its own
# go.mod. The upstream version is stamped as hack/lib/version.sh stamps it, so that component-base's version.Get()
# (the kubelet's `--version`, the probers' User-Agent kube-probe/MAJOR.MINOR) says vVERSION.

# module_download MODULE@VERSION FIELD: a field of `go mod download -json` (GoMod: its go.mod, Dir: its source),
# the module downloaded into the module cache first.
module_download() {
  GOFLAGS=-mod=mod go mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p"
}

# kubernetes_gomod VERSION: the path of k8s.io/kubernetes@vVERSION's go.mod (downloaded into the module cache).
kubernetes_gomod() {
  local modfile
  modfile=$(module_download "k8s.io/kubernetes@v$1" GoMod)
  [ -f "$modfile" ] || { echo "kubernetes_gomod: no go.mod for k8s.io/kubernetes@v$1" >&2; return 1; }
  echo "$modfile"
}

# kubernetes_requirements VERSION: the lines a go.mod needs to build k8s.io/kubernetes@vVERSION as it is released:
# its godebug lines (GODEBUG defaults count only in the main module), the require, the replace block.
kubernetes_requirements() {
  local version=$1 minor modfile
  minor=${version#*.}; minor=${minor%%.*}
  modfile=$(kubernetes_gomod "$version")
  sed -n 's/^godebug .*/&/p' "$modfile"
  echo "require k8s.io/kubernetes v$version"
  echo "replace ("
  sed -n "s#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 v0.$minor.${version##*.}#p" "$modfile"
  echo ")"
}

# kubernetes_version_ldflags VERSION: -X flags stamping vVERSION into component-base's and client-go's version.
kubernetes_version_ldflags() {
  local version=$1 major minor pkg
  major=${version%%.*}
  minor=${version#*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=v%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$version" "$pkg" "$major" "$pkg" "$minor" "$pkg"
  done
}
