#!/usr/bin/env bash
# Go stubs of the ProbeService API (cri_proto/probe_spec.proto and probe_service.proto), as the kubelet patch series
# carries them in cri-api (kubelet/patches/0002): k8s.io/cri-api/pkg/apis/runtime/probe/v1alpha1.
#
#   hack/generate-go-probe-api.sh OUT_DIR      # writes OUT_DIR/{probe_spec.pb.go,probe_service.pb.go,probe_service_grpc.pb.go}
#
# protoc is grpcio-tools' (pinned in pyproject.toml, the one that makes the Python stubs), with protoc-gen-go and
# protoc-gen-go-grpc of the versions below, built from the module proxy into a cache outside the work tree
# ($XDG_CACHE_HOME or ~/.cache)/cri-probe-shim/tools/. The output depends only on the protos and those versions.
set -euo pipefail

PROTOC_GEN_GO=v1.36.11        # google.golang.org/protobuf, as k8s.io/cri-api v0.37 requires it
PROTOC_GEN_GO_GRPC=v1.6.2     # google.golang.org/grpc/cmd/protoc-gen-go-grpc
GO_PACKAGE=k8s.io/cri-api/pkg/apis/runtime/probe/v1alpha1

out=${1:?usage: hack/generate-go-probe-api.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
tools=${XDG_CACHE_HOME:-$HOME/.cache}/cri-probe-shim/tools/protoc-gen-go-$PROTOC_GEN_GO-grpc-$PROTOC_GEN_GO_GRPC
if [ ! -x "$tools/protoc-gen-go" ] || [ ! -x "$tools/protoc-gen-go-grpc" ]; then
  mkdir -p "$tools"
  GOBIN=$tools go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
  GOBIN=$tools go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"
fi
well_known=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapping=()
for proto in cri_proto/probe_spec.proto cri_proto/probe_service.proto; do
  mapping+=("--go_opt=M$proto=$GO_PACKAGE" "--go-grpc_opt=M$proto=$GO_PACKAGE")
done
(cd "$root" && "$python" -m grpc_tools.protoc -I. "-I$well_known" \
  "--plugin=protoc-gen-go=$tools/protoc-gen-go" "--plugin=protoc-gen-go-grpc=$tools/protoc-gen-go-grpc" \
  "--go_out=$work" --go_opt=paths=source_relative "--go-grpc_out=$work" --go-grpc_opt=paths=source_relative \
  "${mapping[@]}" cri_proto/probe_spec.proto cri_proto/probe_service.proto)
mkdir -p "$out"
cp "$work"/cri_proto/*.go "$out/"
ls "$out"/*.go
