"""The daemon's end of a worker's socketpair (shim/workers/connection.py), over a real socketpair.

The worker's side is played by the test, writing frames as probe_worker/main.py does.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import FrameDecoder, encode
from shim.workers.connection import WorkerConnection


async def _resume_sent(seen: list[str], on_reply) -> tuple[WorkerConnection, asyncio.Future, int, socket.socket]:
    """A connection past the worker's Ready, with a Resume sent: (conn, its reply, its seq, the worker's end)."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    conn = WorkerConnection(lambda event: seen.append(event.WhichOneof("msg")))
    await loop.connect_accepted_socket(lambda: conn, sock=ours)
    theirs.sendall(encode(worker_pb.WorkerEvent(ready=worker_pb.Ready(pid=1))))
    await conn.first
    reply = conn.submit(on_reply=on_reply, resume=worker_pb.Resume())
    (frame,) = FrameDecoder().feed(await loop.sock_recv(theirs, 65536))
    return conn, reply, worker_pb.WorkerRequest.FromString(frame).seq, theirs


def _snapshot_then_attempt(seq: int) -> bytes:
    """The reply and the worker's next attempt, in one write: they arrive in one read."""
    attempt = worker_pb.WorkerEvent(attempt=worker_pb.AttemptReport(probe_id="p", status=service_pb.ProbeStatus(
        last_attempt=spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS))))
    return encode(worker_pb.WorkerEvent(seq=seq, snapshot=worker_pb.Snapshot())) + encode(attempt)


def test_a_reply_is_taken_before_the_events_the_worker_sent_after_it():
    asyncio.run(asyncio.wait_for(_reply_before_later_events(), 10))


async def _reply_before_later_events():
    # The race a restart met: the Snapshot and the next attempt arrive in one read; the attempt was counted, then
    # the Snapshot's totals (without it) written over it, once the coroutine awaiting the reply ran.
    seen: list[str] = []
    conn, reply, seq, theirs = await _resume_sent(seen, lambda event: seen.append("on_reply " + event.WhichOneof("msg")))
    try:
        theirs.sendall(_snapshot_then_attempt(seq))
        answered = await conn.reply(reply, 5)
        seen.append("awaited")
        assert answered.WhichOneof("msg") == "snapshot"
        assert seen == ["on_reply snapshot", "attempt", "awaited"]
    finally:
        theirs.close()


def test_a_reply_after_its_request_timed_out_runs_nothing():
    asyncio.run(asyncio.wait_for(_late_reply(), 10))


async def _late_reply():
    seen: list[str] = []
    conn, reply, seq, theirs = await _resume_sent(seen, lambda event: seen.append("on_reply"))
    try:
        with pytest.raises(TimeoutError):
            await conn.reply(reply, 0.01)
        theirs.sendall(_snapshot_then_attempt(seq))
        while "attempt" not in seen:  # the attempt behind the late reply is the event to wait for
            await asyncio.sleep(0)
        assert seen == ["attempt"]
    finally:
        theirs.close()
