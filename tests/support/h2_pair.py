"""Two sans-IO HTTP/2 ends connected by hand, for the tests of shim/rpc's connections: one end is ours,
the other python-hyper's h2 (the reference). Subclasses say which end is which (`to_server`, `to_client`)."""

from __future__ import annotations

import struct


class PumpedPair:
    client: object
    server: object

    def __init__(self) -> None:
        self.server_events: list = []
        self.client_events: list = []

    def to_server(self, data: bytes) -> list:
        raise NotImplementedError

    def to_client(self, data: bytes) -> list:
        raise NotImplementedError

    def pump(self) -> None:
        """Moves bytes both ways until both ends are quiet."""
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                self.server_events += self.to_server(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.to_client(to_client)
            if not to_server and not to_client:
                return

    def take_server(self, kind) -> list:
        """The server's events of `kind` so far, taken out of server_events."""
        found = [event for event in self.server_events if isinstance(event, kind)]
        self.server_events = [event for event in self.server_events if not isinstance(event, kind)]
        return found

    def take_client(self, kind) -> list:
        found = [event for event in self.client_events if isinstance(event, kind)]
        self.client_events = [event for event in self.client_events if not isinstance(event, kind)]
        return found


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame in `data`."""
    frames = []
    while data:
        high, low, kind, flags, stream_id = struct.unpack(">HBBBL", data[:9])
        length = high << 8 | low
        frames.append((kind, flags, stream_id & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return frames
