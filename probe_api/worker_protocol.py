"""The daemon <-> worker protocol's rules (cri_proto/probe_worker.proto), for both ends.

Framing: a frame is a 4-byte big-endian length and one serialized message. Both sides cap the frame size so that
neither can make the other allocate without bound. Requests: what a worker accepts, checked by the daemon before it
sends (a clear error without a round trip) and by the worker again (the daemon may be another version).
"""

from __future__ import annotations

import struct

from google.protobuf.message import Message

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import MAX_TRIES
from probe_api.validation import validate_probe

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


def validate_registration(reg: worker_pb.ProbeRegistration, require_id: bool = True) -> list[str]:
    """run_once needs no probe id (its answer carries the request's seq); add_probe does."""
    errors = ["probe_id: Required value"] if require_id and not reg.probe_id else []
    return errors + validate_probe(reg.type, reg.spec)


# RunOnce requests whose verdict is kept: the kubelet bridge sends the same few requests every period, and
# checking one costs more than the rest of its handling in the worker. A full cache is simply emptied.
RUN_ONCE_VERDICTS = 256
_run_once_verdicts: dict[bytes, tuple[str, ...]] = {}


def validate_run_once(run: worker_pb.RunOnce) -> list[str]:
    """RunOnce's own fields, after its registration's: a core/v1 LifecycleHandler has no gRPC action."""
    # The verdict depends on the message alone: keyed by its bytes, not its identity (a caller may change it).
    key = run.SerializeToString(deterministic=True)
    verdict = _run_once_verdicts.get(key)
    if verdict is None:
        if len(_run_once_verdicts) >= RUN_ONCE_VERDICTS:
            _run_once_verdicts.clear()
        verdict = _run_once_verdicts[key] = tuple(_run_once_errors(run))
    return list(verdict)


def _run_once_errors(run: worker_pb.RunOnce) -> list[str]:
    errors = validate_registration(run.probe, require_id=False)
    if not 0 <= run.max_tries <= MAX_TRIES:
        errors.append(f"max_tries: Invalid value: {run.max_tries}: must be between 0 and {MAX_TRIES}, inclusive")
    if run.lifecycle_hook and run.probe.spec.HasField("grpc"):
        errors.append("probe.spec.grpc: Forbidden: a lifecycle hook handler is http_get or tcp_socket")
    return errors
