"""The daemon <-> worker protocol's rules (cri_proto/probe_worker.proto), for both ends.

Framing: a frame is a 4-byte big-endian length and one serialized message. Both sides cap the frame size so that
neither can make the other allocate without bound.

Requests carry what the daemon took at its API edge, the one place a probe spec is validated (probe_api/
request_rules.py for ProbeService, probe_api/bridge_command.py for the kubelet bridge, both with the Kubernetes rules
of probe_api/validation.py). The worker trusts them: the daemon that sends them is root and started it, and a
daemon of another release never speaks to it (WORKER_PROTOCOL_VERSION gates adoption). Its threat model is the
probe targets, not the daemon; what it checks itself is its own state (is the sandbox one it serves, has a probe
an id to be found by) and the fields of a request that only the worker protocol has (RunOnce's max_tries and
lifecycle_hook, `run_once_errors`), not the spec.
"""

from __future__ import annotations

import struct

from google.protobuf.message import Message

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import MAX_TRIES


MAX_FRAME = 1 << 20
# Bumped whenever a worker and a daemon of different values could misunderstand each other. A daemon adopts a
# running worker (after its own restart or upgrade) only if the worker speaks its version; any other worker is
# replaced, and its probes go on from the daemon's stored state. 2: handover (Detach, Resume, ProbeProgress).
# 3: a probe's progress is the service's ProbeStatus (ProbeRegistration.status, ProbeSnapshot.status).
# 4: an attempt report is a ProbeStatus too (AttemptReport.status).
WORKER_PROTOCOL_VERSION = 4
_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """A frame violates the protocol (too large, or not the expected message)."""


def encode(message: Message) -> bytes:
    payload = message.SerializeToString()
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed bytes, get complete payloads."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        while len(self._buf) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise FrameError(f"peer announced a frame of {length} bytes (max {MAX_FRAME})")
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append(bytes(self._buf[_HEADER.size:end]))
            del self._buf[:end]
        return frames


def run_once_errors(run: worker_pb.RunOnce) -> list[str]:
    """RunOnce's own fields (no API edge sees them: the daemon sets them): tries within the kubelet's bound, and a
    lifecycle hook's handler one a core/v1 LifecycleHandler can have."""
    errors = []
    if not 0 <= run.max_tries <= MAX_TRIES:
        errors.append(f"max_tries: Invalid value: {run.max_tries}: must be between 0 and {MAX_TRIES}, inclusive")
    if run.lifecycle_hook and run.probe.spec.HasField("grpc"):
        errors.append("probe.spec.grpc: Forbidden: a lifecycle hook handler is http_get or tcp_socket")
    return errors
