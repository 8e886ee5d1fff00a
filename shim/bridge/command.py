"""The daemon's side of the kubelet bridge's marker command: recognising it in an ExecSync's bytes and reading it
with the daemon's own gate. Pure: no I/O, no grpc.

The grammar itself (the marker, the roles, the JSON and flag forms, how `probectl convert` writes a command and
how it is read and validated) is the contract's, probe_api/bridge_command.py: `probectl convert` writes what this
reads, and neither imports the other. What only the daemon adds lives here:
- `marker_exec`: which CRI ExecSync requests are the marker's, decided from the serialized bytes the CRI proxy
  holds, without decoding every exec; `MarkerExecs` decodes each request's bytes once (the kubelet resends them);
- `parse_command` with the `host` gate of RunProbe (probe_api/request_rules.py: a host outside the pod is refused
  unless the config sets allow_host_field) and the bound on how much error text one answer carries.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import bridge_command
from probe_api.bridge_command import MARKER, BadArguments, BridgedCall, is_marker
from probe_api.request_rules import bounded, host_field_errors

_MARKER_BYTES = MARKER.encode()


def marker_exec(request: bytes) -> cri_pb.ExecSyncRequest | None:
    """The decoded ExecSyncRequest if its cmd[0] is the marker, else None.

    The marker's bytes must appear in the serialized request for cmd[0] to be it, so an ordinary exec is never
    decoded (the CRI proxy asks this of every ExecSync); an undecodable request is the runtime's to refuse."""
    if _MARKER_BYTES not in request:
        return None
    try:
        decoded = cri_pb.ExecSyncRequest.FromString(request)
    except DecodeError:
        return None
    return decoded if is_marker(decoded.cmd) else None


MAX_KEPT_REQUEST_BYTES = 8192  # what MarkerExecs keeps of one request: a bound on its memory, not on what it reads


class MarkerExecs:
    """`marker_exec` for the CRI proxy's every ExecSync, remembering the marker requests it decoded.

    The kubelet sends a handler's very same bytes at every period, so each is decoded once. A decoded request is
    shared by every call that sent those bytes: read-only. Bounded: a full memory is emptied (the bytes of a
    node's handlers, a few hundred, come back at their next period)."""

    def __init__(self, max_kept: int = 4096) -> None:
        self._max = max_kept
        self._decoded: dict[bytes, cri_pb.ExecSyncRequest] = {}

    def claim(self, request: bytes) -> cri_pb.ExecSyncRequest | None:
        if _MARKER_BYTES not in request:  # every ordinary exec: neither decoded nor hashed
            return None
        decoded = self._decoded.get(request)
        if decoded is None:
            decoded = marker_exec(request)
            if decoded is not None and len(request) <= MAX_KEPT_REQUEST_BYTES:  # a handler's is a few hundred bytes
                if len(self._decoded) >= self._max:
                    self._decoded.clear()
                self._decoded[request] = decoded
        return decoded


def parse_command(cmd: Sequence[str], *, ports: Sequence[spec_pb.ContainerPort], timeout_ms: int,
                  allow_host: bool) -> BridgedCall:
    """The call a marker command asks for, validated as RunProbe validates, `host` gate included; raises
    BadArguments whose errors fit in one answer (probe_api/request_rules.py MAX_ERRORS_BYTES)."""
    try:
        return bridge_command.parse_command(cmd, ports=ports, timeout_ms=timeout_ms,
                                            gate=lambda spec: host_field_errors(spec, allow_host))
    except BadArguments as exc:
        raise BadArguments(bounded(exc.errors)) from None
