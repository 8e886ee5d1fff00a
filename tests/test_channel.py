import asyncio
import socket
import struct

import pytest

from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import MAX_FRAME, BlockingChannel, ChannelClosed, FrameDecoder, FrameError, encode


def test_decoder_reassembles_frames_split_anywhere():
    messages = [worker_pb.WorkerEvent(seq=i, heartbeat=worker_pb.Heartbeat(probes=i)) for i in range(5)]
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    frames = []
    for i in range(0, len(stream), 3):
        frames += decoder.feed(stream[i:i + 3])
    assert [worker_pb.WorkerEvent.FromString(f) for f in frames] == messages


def test_decoder_refuses_oversized_frames_before_buffering_them():
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))


def test_blocking_and_async_sides_talk_and_keep_read_ahead_frames():
    a, b = socket.socketpair()
    parent, child = BlockingChannel(a), BlockingChannel(b)
    # Two frames in one write: the first recv must not lose the second when the
    # socket is handed over to asyncio.
    a.sendall(encode(worker_pb.WorkerRequest(seq=1)) + encode(worker_pb.WorkerRequest(seq=2)))
    assert worker_pb.WorkerRequest.FromString(child.recv(timeout=5)).seq == 1

    async def child_side():
        chan = child.to_async()
        second = worker_pb.WorkerRequest.FromString(await chan.recv())
        await chan.send(worker_pb.WorkerEvent(seq=second.seq))

    asyncio.run(child_side())
    assert worker_pb.WorkerEvent.FromString(parent.recv(timeout=5)).seq == 2
    b.close()
    with pytest.raises(ChannelClosed):
        parent.recv(timeout=5)


def test_blocking_recv_times_out():
    a, b = socket.socketpair()
    with pytest.raises(TimeoutError):
        BlockingChannel(a).recv(timeout=0.01)
    b.close()
