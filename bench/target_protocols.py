"""What the benchmark's target servers answer, as pure functions over bytes (no sockets).

bench/targets.py does the I/O: one process serving HTTP, TCP and gRPC health in every
benchmark sandbox. This module decides the answers: the HTTP response for a request
head, whether a flapping sandbox is healthy at a given moment, and the gRPC health
Check answer (gRPC length-prefixed framing over HTTP/2 streams handled by h2).
"""

from __future__ import annotations

import struct

from cri_proto import grpc_health_pb2 as health_pb

HEALTH_PATH = "/healthz"
CHECK_PATH = "/grpc.health.v1.Health/Check"
MAX_REQUEST_HEAD = 16 * 1024
GRPC_OK, GRPC_NOT_FOUND, GRPC_UNIMPLEMENTED, GRPC_INTERNAL = 0, 5, 12, 13
_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


class BadRequest(Exception):
    """The bytes cannot be an HTTP/1.1 request head the server answers."""


# ---------------------------------------------------------------- HTTP


def request_path(head: bytes) -> str | None:
    """The request target of a complete head; None while the head is incomplete.

    Raises BadRequest for a head over MAX_REQUEST_HEAD or a malformed request line.
    """
    end = head.find(b"\r\n\r\n")
    if end < 0:
        if len(head) > MAX_REQUEST_HEAD:
            raise BadRequest("request head too large")
        return None
    line = head[:head.find(b"\r\n")].split(b" ")
    if len(line) != 3 or not line[2].startswith(b"HTTP/"):
        raise BadRequest(f"malformed request line {line!r}")
    return line[1].decode("latin-1").split("?", 1)[0]


def http_response(status: int, body: bytes) -> bytes:
    """A complete response that ends the connection, as a Go server answers a probe's Connection: close."""
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def http_answer(path: str, healthy: bool) -> bytes:
    """/healthz: 200 "ok" or 500 "unhealthy" (a flapping sandbox); any other path 404."""
    if path != HEALTH_PATH:
        return http_response(404, b"not found\n")
    return http_response(200, b"ok\n") if healthy else http_response(500, b"unhealthy\n")


def healthy_at(elapsed_s: float, flip_s: float, phase_s: float = 0.0) -> bool:
    """Health of a sandbox that flips every flip_s seconds (healthy first); flip_s <= 0 never flips.

    The phase spreads the flips of different sandboxes over time, so that state changes
    arrive one by one rather than as a herd.
    """
    if flip_s <= 0:
        return True
    return int((elapsed_s + phase_s) // flip_s) % 2 == 0


# ---------------------------------------------------------------- gRPC health


def grpc_frame(payload: bytes) -> bytes:
    """gRPC length-prefixed message: flag 0 (uncompressed), 4-byte big-endian length, payload."""
    return struct.pack(">BI", 0, len(payload)) + payload


def grpc_messages(body: bytes) -> list[bytes]:
    """The complete messages of a request body; raises ValueError for a compressed or truncated one."""
    messages, at = [], 0
    while at < len(body):
        if len(body) - at < 5:
            raise ValueError("truncated gRPC message prefix")
        flag, length = struct.unpack_from(">BI", body, at)
        if flag != 0:
            raise ValueError("compressed gRPC message")
        if len(body) - at - 5 < length:
            raise ValueError("truncated gRPC message")
        messages.append(body[at + 5:at + 5 + length])
        at += 5 + length
    return messages


def health_check(path: str, body: bytes) -> tuple[int, bytes | None]:
    """(grpc-status, response message or None) of one unary call on the health service.

    The server's overall health ("") and nothing else is served, as a single-service
    application's grpc health server does: any other service is NOT_FOUND.
    """
    if path != CHECK_PATH:
        return GRPC_UNIMPLEMENTED, None
    try:
        messages = grpc_messages(body)
        if len(messages) != 1:
            return GRPC_INTERNAL, None
        request = health_pb.HealthCheckRequest.FromString(messages[0])
    except Exception:  # noqa: BLE001 - any undecodable body is the same INTERNAL to a client
        return GRPC_INTERNAL, None
    if request.service:
        return GRPC_NOT_FOUND, None
    answer = health_pb.HealthCheckResponse(status=health_pb.HealthCheckResponse.SERVING)
    return GRPC_OK, grpc_frame(answer.SerializeToString())
