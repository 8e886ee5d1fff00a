import asyncio
import socket
import struct

import pytest

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import MAX_FRAME, FrameDecoder, FrameError, encode
from probe_worker.channel import AsyncChannel, BlockingChannel, ChannelClosed


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


def test_frames_from_concurrent_writers_never_interleave_when_the_kernel_takes_them_in_pieces():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # frames below go out in several pieces
    reader = BlockingChannel(b)
    # 40 frames of ~20 KiB from 8 writers at once, far more than the socket buffer holds.
    sent = [worker_pb.WorkerEvent(seq=i, fatal=worker_pb.Fatal(message=chr(65 + i % 26) * 20_000)) for i in range(40)]

    async def writers():
        chan = AsyncChannel(a)

        async def writer(k: int) -> None:
            for event in sent[k::8]:
                await chan.send(event)

        await asyncio.gather(*(writer(k) for k in range(8)))

    async def main():
        # The reader drains from a thread while the writers block on a full buffer.
        received = asyncio.get_running_loop().run_in_executor(
            None, lambda: [worker_pb.WorkerEvent.FromString(reader.recv(timeout=10)) for _ in sent])
        await writers()
        return await received

    received = asyncio.run(main())
    assert sorted(received, key=lambda e: e.seq) == sent  # every frame intact
    for k in range(8):  # each writer's frames in the order it sent them
        assert [e.seq for e in received if e.seq % 8 == k] == [e.seq for e in sent[k::8]]


def test_a_writer_cancelled_mid_frame_still_leaves_a_whole_frame():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    reader = BlockingChannel(b)
    big = worker_pb.WorkerEvent(seq=1, fatal=worker_pb.Fatal(message="x" * 200_000))

    async def main():
        chan = AsyncChannel(a)
        writer = asyncio.create_task(chan.send(big))
        await asyncio.sleep(0)            # it wrote what the buffer took, the rest is pending
        assert not writer.done()
        writer.cancel()                   # e.g. the probe was removed
        received = asyncio.get_running_loop().run_in_executor(
            None, lambda: [worker_pb.WorkerEvent.FromString(reader.recv(timeout=10)) for _ in range(2)])
        await chan.send(worker_pb.WorkerEvent(seq=2))
        return await received

    first, second = asyncio.run(main())
    assert first == big and second.seq == 2


def test_send_raises_once_the_other_side_is_gone():
    a, b = socket.socketpair()
    b.close()

    async def main():
        with pytest.raises(OSError):
            await AsyncChannel(a).send(worker_pb.WorkerEvent(seq=1))

    asyncio.run(main())


def test_frames_beyond_the_read_ahead_bound_all_arrive_in_order():
    from probe_worker.channel import MAX_READ_AHEAD

    a, b = socket.socketpair()
    count = MAX_READ_AHEAD * 3
    a.sendall(b"".join(encode(worker_pb.WorkerRequest(seq=i)) for i in range(count)))
    a.close()

    async def main():
        chan = AsyncChannel(b)
        seqs = []
        with pytest.raises(ChannelClosed):
            while True:
                seqs.append(worker_pb.WorkerRequest.FromString(await chan.recv()).seq)
        return seqs

    assert asyncio.run(main()) == list(range(count))  # every frame before EOF, then ChannelClosed


def test_a_wait_ends_when_an_interrupt_is_done_and_a_frame_sent_later_is_still_read():
    a, b = socket.socketpair()

    async def main():
        chan = AsyncChannel(b)
        stop = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(stop.set_result, "stop")
        await asyncio.wait_for(chan.wait(stop), 5)
        assert chan.take() is None  # no frame: it was the interrupt
        a.sendall(encode(worker_pb.WorkerRequest(seq=7)))
        return worker_pb.WorkerRequest.FromString(await asyncio.wait_for(chan.recv(), 5)).seq

    assert asyncio.run(main()) == 7


def test_a_broken_frame_is_raised_to_the_reader():
    a, b = socket.socketpair()
    a.sendall(encode(worker_pb.WorkerRequest(seq=1)))

    async def main():
        chan = AsyncChannel(b)
        assert worker_pb.WorkerRequest.FromString(await chan.recv()).seq == 1
        a.sendall(struct.pack(">I", MAX_FRAME + 1))
        with pytest.raises(FrameError):
            await chan.recv()

    asyncio.run(main())
