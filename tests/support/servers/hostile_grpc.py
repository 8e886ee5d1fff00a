"""A gRPC (HTTP/2, h2 server side) probe target that misbehaves in one chosen way.

`python tests/support/servers/hostile_grpc.py --mode MODE [--host ::] [--port 0]` prints
`READY <port>` once listening and exits on SIGTERM. The connection preface and
SETTINGS are always proper (the probe's dial succeeds); the answer to the
Health/Check call is where the modes differ:

  healthy        SERVING, as a real server would: a control for warm-ups and neighbours
  huge-message   response headers, then one 100 MiB message, written as fast as TCP
                 takes it, ignoring HTTP/2 flow control (a well-behaved server would stall)
  no-trailers    response headers and a SERVING message, then never the trailers
  goaway         a GOAWAY (last stream 0, NO_ERROR) instead of an answer, then holds the connection
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hyperframe.frame

# Run as a script (`python tests/support/servers/X.py`, also under nsenter without PYTHONPATH): the repo root holds `tests`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from tests.support.servers.serving import announce_and_wait, listening_socket  # noqa: E402

MODES = ("healthy", "huge-message", "no-trailers", "goaway")
HUGE_MESSAGE_BYTES = 100 << 20
FRAME_BYTES = 16 * 1024              # the default SETTINGS_MAX_FRAME_SIZE
SERVING = b"\x08\x01"                # HealthCheckResponse{status: SERVING}


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def raw_data_frames(stream_id: int, total: int):
    """DATA frames carrying one message of `total` bytes, built without h2 so flow control cannot stop them."""
    prefix = struct.pack(">BI", 0, total)
    first = hyperframe.frame.DataFrame(stream_id, data=prefix + b"m" * (FRAME_BYTES - len(prefix)))
    yield first.serialize()
    full = hyperframe.frame.DataFrame(stream_id, data=b"m" * FRAME_BYTES).serialize()
    for _ in range((total - (FRAME_BYTES - len(prefix))) // FRAME_BYTES):
        yield full


class Hostile:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        await self.answer(conn, event.stream_id, writer)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError, asyncio.CancelledError):
            pass
        finally:
            writer.transport.abort()

    async def answer(self, conn: h2.connection.H2Connection, stream_id: int, writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        if mode == "healthy":
            conn.send_headers(stream_id, headers)
            conn.send_data(stream_id, grpc_message(SERVING))
            conn.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)
        elif mode == "huge-message":
            conn.send_headers(stream_id, headers)
            writer.write(conn.data_to_send())
            batch: list[bytes] = []
            for frame in raw_data_frames(stream_id, HUGE_MESSAGE_BYTES):
                batch.append(frame)
                if len(batch) == 16:
                    writer.write(b"".join(batch))
                    batch.clear()
                    await writer.drain()  # raises once the client has gone
            writer.write(b"".join(batch))
        elif mode == "no-trailers":
            conn.send_headers(stream_id, headers)
            conn.send_data(stream_id, grpc_message(SERVING))
        elif mode == "goaway":
            conn.close_connection(last_stream_id=0)


async def main_async(args: argparse.Namespace) -> int:
    sock = listening_socket(args.host, args.port)
    server = await asyncio.start_server(Hostile(args.mode).serve, sock=sock)
    await announce_and_wait(sock.getsockname()[1])
    server.close()
    return 0  # asyncio.run cancels the connections still open


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--host", default="::", help='bind address; "::" is dual stack')
    parser.add_argument("--port", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
