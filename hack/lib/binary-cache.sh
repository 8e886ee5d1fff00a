# Sourced by hack/build-*.sh: a cache directory of built binaries, keyed by version outside the work tree.

# cached_set DIR BINARY...: true when every BINARY is an executable in DIR (a whole set built before).
cached_set() {
  local dir=$1 binary
  shift
  for binary in "$@"; do [ -x "$dir/$binary" ] || return 1; done
}

# install_set FROM DIR BINARY...: moves each built BINARY from FROM into DIR. A binary is renamed into place, so
# that a build cut short leaves no half-written file where cached_set would take it as built.
install_set() {
  local from=$1 dir=$2 binary
  shift 2
  for binary in "$@"; do
    mv "$from/$binary" "$dir/$binary.partial" && mv "$dir/$binary.partial" "$dir/$binary"
  done
}

# exit_if_built DIR BINARY...: when DIR holds the whole set, says so, prints DIR (the build scripts' output) and
# ends the calling script.
exit_if_built() {
  local dir=$1
  shift
  cached_set "$dir" "$@" || return 0
  echo "hack/$(basename "$0"): $dir is there" >&2
  echo "$dir"
  exit 0
}
