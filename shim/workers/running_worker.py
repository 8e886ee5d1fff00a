"""A worker while it runs: the one door through which the daemon asks anything of it.

Requests go over its connection (shim/workers/connection.py); its sandboxes' network namespaces are lent and taken
back by its broker (the zygote it came from, shim/workers/zygote_handle.py), which knows it by pid. Its life
(life.py) makes one when the worker is Ready and drops it when the worker ends, so a holder that compares what it
holds with `life.running` knows whether the worker it spoke to still runs; nobody else holds the connection or the
zygote of a worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from shim.workers.connection import OnReply, WorkerConnection
from shim.workers.zygote_handle import Zygote


@dataclass(frozen=True, eq=False)
class RunningWorker:
    pid: int
    _conn: WorkerConnection
    _zygote: Zygote

    def submit(self, *, expect_reply: bool = True, on_reply: OnReply | None = None,
               **message) -> asyncio.Future[worker_pb.WorkerEvent] | None:
        """Writes one request now, without awaiting (WorkerConnection.submit: callers rely on the order)."""
        return self._conn.submit(expect_reply=expect_reply, on_reply=on_reply, **message)

    async def reply(self, pending: asyncio.Future[worker_pb.WorkerEvent], timeout_s: float) -> worker_pb.WorkerEvent:
        return await self._conn.reply(pending, timeout_s)

    async def request(self, timeout_s: float, *, on_reply: OnReply | None = None,
                      **message) -> worker_pb.WorkerEvent:
        """One request, answered; WorkerUnavailable if the worker is lost, TimeoutError after timeout_s."""
        return await self._conn.request(timeout_s, on_reply=on_reply, **message)

    async def assign(self, sandbox_id: str, netns_path: str, *, find_pod_ips: bool,
                     timeout_s: float) -> zygote_pb.Assigned:
        """Lends the worker the sandbox's netns at its broker; ZygoteError or TimeoutError says why not."""
        return await self._zygote.assign(self.pid, sandbox_id, netns_path, find_pod_ips=find_pod_ips,
                                         timeout_s=timeout_s)

    async def unassign(self, sandbox_id: str) -> None:
        """Takes the sandbox's netns back from the worker at its broker."""
        await self._zygote.unassign(self.pid, sandbox_id)
